"""Per-question metrics and aggregation: what the harness's numbers mean."""

from __future__ import annotations

import pytest

from experiments.results.aggregate import aggregate, percentile
from experiments.results.row import QuestionRow
from experiments.scoring import measures


def test_squad_normalisation_and_f1() -> None:
    assert measures.exact_match("The 12 MP.", "12 mp") == 1.0
    assert measures.exact_match("12 MP [talents/arcane-aptitude]", "12 MP") == 1.0
    assert measures.token_f1("it costs 12 MP", "12 MP") == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert measures.token_f1("nothing here", "12 MP") == 0.0


def test_retrieval_metrics() -> None:
    retrieved = ["a", "b", "c", "d"]
    assert measures.recall_at_k(retrieved, ["c", "z"], 3) == 0.5
    assert measures.recall_at_k(retrieved, ["c", "z"], 2) == 0.0
    assert measures.precision_at_k(retrieved, ["c"], 4) == 0.25
    assert measures.reciprocal_rank(retrieved, ["c", "b"]) == 0.5
    assert measures.reciprocal_rank(retrieved, ["z"]) == 0.0


def test_cumulative_recall_shows_what_each_hop_added() -> None:
    hops = [["a", "x"], ["b"]]
    assert measures.cumulative_recall(hops, ["a", "b", "c"], 3) == pytest.approx(
        [1 / 3, 2 / 3, 2 / 3]
    )


def row(
    qid: str, values: dict[str, float], missing: dict[str, str] | None = None, error: str = ""
) -> QuestionRow:
    return QuestionRow(
        case_id=qid,
        question_id=qid,
        set="s",
        query_type="factual",
        turn=1,
        question="q",
        gold_answer="a",
        status="failed" if error else "ok",
        error=error,
        values=values,
        missing=missing or {},
    )


def test_missing_metrics_are_not_averaged_as_zero() -> None:
    rows = [
        row("1", {"f1": 0.8}),
        row("2", {"f1": 0.6}),
        row("3", {}, {"f1": "unanswerable question has no gold answer"}),
        row("4", {}, error="TimeoutError: slow"),
    ]
    f1 = aggregate(rows)["f1"]
    assert f1.mean == pytest.approx(0.7)
    assert f1.coverage == "2/4"
    assert f1.missing_reasons == {
        "unanswerable question has no gold answer": 1,
        "question failed": 1,
    }


def test_percentiles() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([], 0.5) is None
