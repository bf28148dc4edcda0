"""Metrics by slice: question set, question type (benchmark or curated) and gold hop count."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from mlflow.utils.validation import validate_param_and_metric_name

from experiments.results.row import normalised
from experiments.results.slices import (
    keys_of,
    metric_name,
    question_type,
    rows_in,
    slice_means,
    slice_metrics,
    sliced_runs,
)


def row(set_name: str, query_type: str, gold: int, status: str = "ok", **values: float) -> dict:
    """A record of a run's table (`QuestionRow.record()`'s scalar columns)."""
    return {
        "set": set_name,
        "query_type": query_type,
        "status": status,
        "gold_hops": gold,
        **values,
    }


@pytest.fixture
def table() -> pd.DataFrame:
    return pd.DataFrame(
        [
            row("cross_book", "factual", 2, recall_at_k=1.0, cost_usd=0.002),
            row("cross_book", "decision", 2, recall_at_k=0.5, cost_usd=0.004),
            row("cross_book", "decision", 2, status="error"),
            row("single_book", "factual", 1, recall_at_k=0.0, cost_usd=0.001),
            row("unanswerable", "factual", 0, correct_refusal=1.0, cost_usd=0.001),
        ]
    )


def test_set_means_cover_answered_questions_and_count_all(table: pd.DataFrame) -> None:
    sets = slice_means(table, ["recall_at_k", "cost_usd"], "set")
    cross = sets.loc["cross_book"]
    assert cross["recall_at_k"] == pytest.approx(0.75)
    assert cross["cost_usd"] == pytest.approx(0.003)
    assert cross["questions"] == 3  # the failed question counts, its missing value does not
    assert cross["recall_at_k.coverage"] == pytest.approx(2 / 3)
    assert pd.isna(sets.loc["unanswerable", "recall_at_k"])
    assert list(sets.index) == ["cross_book", "single_book", "unanswerable"]


def test_type_and_gold_hops_slices(table: pd.DataFrame) -> None:
    types = slice_means(table, ["recall_at_k"], "type")
    assert types.loc["decision", "recall_at_k"] == pytest.approx(0.5)
    assert types.loc["factual", "questions"] == 3
    hops = slice_means(table, ["recall_at_k"], "gold_hops")
    assert list(hops.index) == ["0", "1", "2"]
    assert hops.loc["2", "recall_at_k"] == pytest.approx(0.75)


def test_benchmark_type_comes_from_the_set_name() -> None:
    frame = pd.DataFrame(
        [
            row("hotpotqa:bridge", "factual", 2),
            row("hotpotqa:comparison", "factual", 2),
            row("cross_book", "operational", 2),
        ]
    )
    assert list(question_type(frame)) == ["bridge", "comparison", "operational"]


def test_mlflow_names_follow_the_documented_scheme() -> None:
    assert metric_name("recall_at_k", "set", "cross_book") == "recall_at_k/cross_book"
    assert metric_name("recall_at_k", "type", "bridge") == "recall_at_k/type/bridge"
    assert metric_name("cost_usd", "gold_hops", "2") == "cost_usd/gold_hops/2"
    assert metric_name("f1", "set", "hotpotqa:bridge") == "f1/hotpotqa_bridge"
    for odd in ("a=b", "..", "x/y", "über set", ""):
        name = metric_name("f1", "set", odd)
        assert validate_param_and_metric_name(name) and ":" not in name, name
        assert name.count("/") == 1


def test_logged_slices(table: pd.DataFrame) -> None:
    logged = slice_metrics(table)
    assert logged["recall_at_k/cross_book"] == pytest.approx(0.75)
    assert logged["questions/cross_book"] == 3
    assert logged["recall_at_k/type/decision"] == pytest.approx(0.5)
    assert logged["recall_at_k/gold_hops/1"] == pytest.approx(0.0)
    assert logged["correct_refusal/unanswerable"] == 1.0
    assert "recall_at_k/unanswerable" not in logged  # no value: not logged, never 0
    assert not [n for n in logged if n.startswith("status") or n.startswith("gold_hops/")]


def test_a_breakdown_with_one_slice_is_not_repeated(table: pd.DataFrame) -> None:
    one_type = table.assign(query_type="factual")
    logged = slice_metrics(one_type)
    assert "recall_at_k/cross_book" in logged
    assert not [n for n in logged if "/type/" in n]


def test_tables_without_keys_have_no_slices() -> None:
    assert slice_means(pd.DataFrame(), ["recall_at_k"]).empty
    assert slice_means(pd.DataFrame({"recall_at_k": [1.0]}), ["recall_at_k"], "gold_hops").empty
    assert slice_metrics(pd.DataFrame({"recall_at_k": [1.0]})) == {}


def test_runs_are_recomputed_on_one_slice(table: pd.DataFrame) -> None:
    runs = pd.DataFrame(
        {"run_id": ["a", "b", "c"], "recall_at_k": [0.9, 0.8, 0.7], "questions": [5, 5, 5]}
    )
    other = table.assign(recall_at_k=table["recall_at_k"] / 2)
    sliced = sliced_runs(runs, {"a": table, "b": other}, "set", "cross_book", ["recall_at_k"])
    assert list(sliced["recall_at_k"][:2]) == pytest.approx([0.75, 0.375])
    assert list(sliced["questions"][:2]) == [3, 3]
    assert sliced["recall_at_k.coverage"][0] == pytest.approx(2 / 3)
    assert pd.isna(sliced["recall_at_k"][2]) and pd.isna(sliced["questions"][2])  # no table
    assert keys_of({"a": table}, "gold_hops") == ["0", "1", "2"]
    assert len(rows_in(table, "type", "decision")) == 2


def test_a_table_logged_before_whole_rows_slices_by_its_gold_passages() -> None:
    legacy = pd.DataFrame(
        [
            {"set": "s", "status": "ok", "gold_ids": json.dumps(["a/x", "b/y"]), "f1": 1.0},
            {"set": "s", "status": "ok", "gold_ids": json.dumps([]), "f1": 0.0},
        ]
    )
    hops = slice_means(normalised(legacy), ["f1"], "gold_hops")
    assert hops["f1"].to_dict() == {"0": 0.0, "2": 1.0}
    # a table that never knew its gold passages has no gold-hops slices
    assert slice_means(normalised(legacy.drop(columns="gold_ids")), ["f1"], "gold_hops").empty
