"""A run's traces in a SQLite MLflow store: found by their tags, their scores readable and
filterable as assessments, a failed question's trace, and a rewrite that adds no duplicate."""

from __future__ import annotations

import time
from pathlib import Path

import mlflow
import pytest
from mlflow.entities import Expectation, Feedback

from caprag.schemas import CallUsage
from experiments.harness.run import run
from experiments.results import traces
from experiments.results.row import QuestionRow
from tests.integration.test_harness import make_cfg
from tests.integration.test_traces import make_row, make_target


def search(uri: str, experiment_id: str, where: str) -> list[mlflow.entities.Trace]:
    mlflow.set_tracking_uri(uri)
    return mlflow.search_traces(locations=[experiment_id], filter_string=where, return_type="list")


@pytest.mark.slow
def test_a_run_s_traces_are_found_by_set_and_carry_the_row_s_scores(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, "dataset=all", "experiment.ragas=false", "strategy=multi-hop")
    result = run(cfg)
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    experiment_id = mlflow.MlflowClient(uri).get_run(str(result.run_id)).info.experiment_id
    rows = {r.question_id: r for r in result.rows}
    cross_book = {q for q, r in rows.items() if r.set == "cross_book"}
    assert cross_book and len(cross_book) < len(rows)

    found = search(uri, experiment_id, "tags.`caprag.set` = 'cross_book'")
    assert {t.info.tags["caprag.question_id"] for t in found} == cross_book
    for trace in found:
        row = rows[trace.info.tags["caprag.question_id"]]
        assert trace.info.tags["caprag.strategy"] == "multi-hop"
        assert trace.info.tags["caprag.status"] == "ok"
        assert trace.info.tags["caprag.turn"] == str(row.turn)
        scores = {
            a.name: a.value
            for a in trace.info.assessments
            if isinstance(a, Feedback) and a.error is None
        }
        assert scores == pytest.approx(row.values)
        assert {a.source.source_type for a in trace.info.assessments} == {"CODE"}
        expected = {a.name: a.value for a in trace.info.assessments if isinstance(a, Expectation)}
        assert expected["gold_passages"] == row.gold_ids
        # Each retrieved document's passage text is in its hop's span.
        hop = next(s for s in trace.data.spans if s.name == "hop 1")
        assert hop.outputs and all(doc["page_content"] for doc in hop.outputs)

    # Scores filter numerically, and combine with tags.
    missed = {q for q, r in rows.items() if r.values.get("recall_at_k", 1.0) < 1.0}
    below = search(uri, experiment_id, "feedback.recall_at_k < 1.0")
    assert {t.info.tags["caprag.question_id"] for t in below} == missed
    both = search(uri, experiment_id, "tags.`caprag.set` = 'cross_book' AND feedback.mrr >= 0.5")
    assert {t.info.tags["caprag.question_id"] for t in both} == {
        q for q in cross_book if rows[q].values["mrr"] >= 0.5
    }


def failed_row(number: int) -> QuestionRow:
    row = QuestionRow(
        case_id=f"f{number}",
        question_id=f"f{number}",
        set="cross_book",
        query_type="factual",
        turn=1,
        question="What breaks?",
        gold_answer="nothing",
        status="failed",
        error="StructuredOutputError: could not parse GeneratedAnswer after 3 attempts",
        started_ns=time.time_ns(),
        timings={"total": 0.25},
    )
    row.calls = [
        CallUsage(
            step="generate",
            model="m",
            latency_s=0.1,
            error="no JSON",
            messages=[{"role": "user", "content": "go"}],
            reply="{not json",
        )
    ]
    return row


def test_a_failed_question_has_an_error_trace_and_a_rewrite_adds_no_duplicates(
    tmp_path: Path,
) -> None:
    target = make_target(tmp_path)
    rows = [make_row(0, time.time_ns()), failed_row(1)]
    rows[0].values = {"recall_at_k": 1.0, "f1": 0.5}
    rows[0].missing = {"correct_refusal": "question is answerable"}
    assert [w.case for w in traces.write_traces(rows, target)] == ["0:q0", "0:f1"]
    again = traces.write_traces(rows, target)  # a resumed run writes again
    assert [w.case for w in again] == ["0:q0", "0:f1"]

    (failed,) = search(target.uri, target.experiment_id, "tags.`caprag.status` = 'failed'")
    assert failed.info.state.value == "ERROR"
    root = next(s for s in failed.data.spans if s.parent_id is None)
    assert root.status.status_code.value == "ERROR"
    (event,) = root.events
    assert str(event.attributes["exception.message"]).startswith("could not parse GeneratedAnswer")
    call = next(s for s in failed.data.spans if s.name == "llm generate")
    assert call.outputs["choices"][0]["message"]["content"] == "{not json"

    (answered,) = search(target.uri, target.experiment_id, "tags.`caprag.status` = 'ok'")
    names = sorted(a.name for a in answered.info.assessments)
    assert names == ["correct_refusal", "f1", "gold_answer", "recall_at_k"]
    refusal = next(a for a in answered.info.assessments if a.name == "correct_refusal")
    assert isinstance(refusal, Feedback) and refusal.error is not None
    assert refusal.error.error_message == "question is answerable"
    # The run lists both traces (answered and failed).
    mlflow.set_tracking_uri(target.uri)
    linked = mlflow.search_traces(
        locations=[target.experiment_id], run_id=target.run_id, return_type="list"
    )
    assert len(linked) == 2
