"""The dashboard's pure functions: Pareto front, per-question diff, run filtering, tables."""

from __future__ import annotations

import datetime as dt
import json

import pandas as pd
import pytest

from caprag.schemas import CallUsage
from experiments.dashboard import data
from experiments.results.row import QuestionRow
from experiments.scoring import failures


def raw_runs() -> pd.DataFrame:
    """A search_runs-shaped frame: a sweep parent, two children, and one older-schema run."""
    return pd.DataFrame(
        {
            "run_id": ["p", "a", "b", "old"],
            "experiment_id": ["1"] * 4,
            "status": ["FINISHED"] * 4,
            "start_time": pd.to_datetime(
                ["2026-01-02", "2026-01-02", "2026-01-03", "2025-06-01"], utc=True
            ),
            "tags.mlflow.runName": ["sweep compare", "x:multi-hop", "x:single", None],
            "tags.caprag.role": ["sweep", None, None, None],
            "tags.mlflow.parentRunId": [None, "p", "p", None],
            "tags.caprag.strategy": [None, "multi-hop", "single", "multi-hop"],
            "tags.caprag.dataset": [None, "cross_book", "cross_book", None],
            "tags.caprag.llm": [None, "offline", "openai", "offline"],
            "tags.caprag.schema": [None, "1", "1", None],
            "metrics.recall_at_k": [None, 0.9, 0.6, 0.5],
            "metrics.recall_at_k.coverage": [None, 0.8, 1.0, None],
            "metrics.questions": [None, 10.0, 10.0, 4.0],
            "metrics.recall_hop1": [None, 0.5, 0.6, None],
            "metrics.recall_hop2": [None, 0.9, 0.6, None],
        }
    )


def test_runs_frame_drops_sweep_parents_and_fills_missing_tags() -> None:
    runs = data.runs_frame(raw_runs())
    assert list(runs["run_id"]) == ["b", "a", "old"]  # newest first, parent gone
    old = runs[runs["run_id"] == "old"].iloc[0]
    assert old["dataset"] == "?" and old["name"] == "old"
    assert runs.set_index("run_id").loc["a", "sweep"] == "sweep compare"
    assert data.schema_warning(old) is not None
    assert data.schema_warning(runs.iloc[0]) is None  # schema 1: read through the legacy adapter
    assert data.schema_warning(runs.iloc[0].copy().replace({"1": "2"})) is None
    newer = data.schema_warning(pd.Series({"run_id": "n", "schema": "3"}))
    assert newer == "Run n uses schema 3; this dashboard reads 2."
    assert data.default_comparison(runs) == ["b", "a"]


def test_runs_frame_of_an_empty_store_has_the_columns_pages_use() -> None:
    runs = data.runs_frame(pd.DataFrame())
    assert runs.empty and {"run_id", "label", "strategy"} <= set(runs.columns)


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({}, {"a", "b", "old"}),
        ({"strategies": ["multi-hop"]}, {"a", "old"}),
        ({"datasets": ["cross_book"], "llms": ["openai"]}, {"b"}),
        ({"since": dt.date(2026, 1, 1)}, {"a", "b"}),
        ({"until": dt.date(2026, 1, 2)}, {"a", "old"}),
        ({"tag": "caprag.schema=1"}, {"a", "b"}),
        ({"tag": "caprag.schema"}, {"a", "b"}),
        ({"tag": "tags.caprag.llm = offline"}, {"a", "old"}),
        ({"tag": "no.such.tag"}, set()),
    ],
)
def test_filter_runs(filters: dict[str, object], expected: set[str]) -> None:
    runs = data.runs_frame(raw_runs())
    assert set(data.filter_runs(runs, **filters)["run_id"]) == expected  # type: ignore[arg-type]


def test_pareto_front_keeps_only_undominated_points() -> None:
    frame = pd.DataFrame(
        {
            "tokens": [100, 200, 150, 300, 50, 400, None],
            "recall": [0.5, 0.8, 0.4, 0.8, 0.5, 0.9, 1.0],
        },
        index=list("abcdefg"),
    )
    front = data.pareto_front(frame, "tokens", "recall")
    # a is beaten by e (same recall, cheaper); c by a; d ties b on recall at higher cost;
    # g has no cost and cannot be placed.
    assert list(front[front].index) == ["b", "e", "f"]
    assert not data.pareto_front(frame, "cost_usd", "recall").any()


def test_metric_table_states_coverage_and_dashes_missing() -> None:
    runs = data.runs_frame(raw_runs())
    table = data.metric_table(runs)
    row = table.loc["gold-passage recall@k"]
    assert row.tolist() == ["0.600", "0.900 (8/10)", "0.500"]
    hop2 = table.loc["cumulative recall after hop 2"]
    assert hop2.tolist() == ["0.600", "0.900", "—"]


def test_recall_curve_has_a_point_per_logged_hop() -> None:
    curve = data.recall_curve(data.runs_frame(raw_runs()))
    assert len(curve) == 4 and set(curve["hop"]) == {1, 2}
    a = curve[curve["label"].str.contains("multi-hop")]
    assert a.sort_values("hop")["recall"].tolist() == [0.5, 0.9]


def test_a_legacy_record_opens_as_a_row_and_tolerates_missing_columns() -> None:
    doc = {"passage_id": "b/x", "book_id": "b", "page": 3, "score": 0.5, "section": "X"}
    hop = {"hop": 1, "queries": ["q"], "documents": [{**doc, "new": False, "gold": True}]}
    record = {"question": "Q?", "trace": json.dumps([hop]), "context_ids": '["b/x"]'}
    row = QuestionRow.from_legacy_record({**record, "gold_ids": '["b/x"]'})
    assert row.hops[0].queries == ["q"] and row.context_ids == ["b/x"]
    assert row.gold_ids == ["b/x"] and row.passage("b/x").section == "X"
    docs = data.hop_documents(row.hops[0], row)
    assert docs.iloc[0].to_dict() == {
        "passage": "b/x", "book": "b", "page": 3, "section": "X", "score": 0.5,
        "seen": "duplicate", "gold": "★ gold",
    }  # fmt: skip
    assert not QuestionRow.from_legacy_record(record).is_gold("b/x")  # no gold_ids: none known


def test_a_legacy_record_reads_calls_and_tells_an_older_table_apart() -> None:
    call = {"step": "generate", "model": "offline", "prompt_tokens": 3, "completion_tokens": 1}
    legacy = QuestionRow.from_legacy_record
    assert legacy({"calls": json.dumps([call])}).calls == [CallUsage(**call)]
    assert legacy({"calls": "[]"}).calls == []
    assert legacy({"question": "Q?"}).calls is None  # no such column
    assert legacy({"calls": float("nan")}).calls is None
    assert legacy({"calls": "not json"}).calls is None


def test_call_line_says_rule_or_model_with_everything_in_one_line() -> None:
    rule = CallUsage(step="expand", model="offline", prompt_tokens=10, completion_tokens=2)
    assert data.call_line(1, rule) == (
        "1. **expand** · rule: no call sent · 10 + 2 tokens if sent · \\$0.000000 estimated"
    )
    model = CallUsage(
        step="analyze", model="gpt-4o-mini", prompt_tokens=400, completion_tokens=30,
        cost_usd=0.000078, attempts=3, cached=True, messages=[],
        error="unparseable reply: no *Decision* in\nthe $reply",
        notes=["dropped query_2", "cut to 8 queries"],
    )  # fmt: skip
    line = data.call_line(2, model)
    assert line == (
        "2. **analyze** · model `gpt-4o-mini` · 400 + 30 tokens · \\$0.000078 · 3 attempts · "
        "cached (nothing sent this time) · **error:** unparseable reply: no \\*Decision\\* in "
        "the \\$reply · **notes:** dropped query\\_2; cut to 8 queries"
    )
    assert "\n" not in line
    unrecorded = data.call_line(3, CallUsage(step="rewrite", model="m", messages=None))
    assert unrecorded.endswith("1 attempt · messages not recorded")


def test_steps_ran_names_rule_or_model_in_order() -> None:
    calls = [
        CallUsage(step="rewrite", model="gpt-4o"),
        CallUsage(step="analyze", model="offline"),
        CallUsage(step="analyze", model="offline"),
        CallUsage(step="generate", model="gpt-4o-mini"),
    ]
    assert data.steps_ran(calls) == {
        "rewrite": "gpt-4o",
        "analyze": "rule",
        "generate": "gpt-4o-mini",
    }
    assert data.steps_ran([]) == {}


def test_metric_table_shows_cost_in_dollars_per_thousand_questions() -> None:
    runs = pd.DataFrame([{"label": "a", "questions": 4, "recall_at_k": 0.5, "cost_usd": 0.000267}])
    table = data.metric_table(runs)
    assert table.loc["cost (USD per 1,000 questions)"].tolist() == ["$0.267"]
    assert list(table.index) == ["gold-passage recall@k", "cost (USD per 1,000 questions)"]


def test_worst_questions_are_the_failed_ones_lowest_recall_first() -> None:
    from experiments.results.row import table_of

    def asked(qid: str, recall: float, f1: float, **fields: object) -> QuestionRow:
        return QuestionRow(
            case_id=qid, question_id=qid, set="cross_book", query_type="factual", turn=1,
            question=f"{qid}?", gold_answer="x", gold_ids=["a/x"],
            context_ids=["a/x"] if recall == 1.0 else [],
            values={"recall_at_k": recall, "f1": f1}, **fields,  # type: ignore[arg-type]
        )  # fmt: skip

    table = table_of(
        [
            asked("fine", 1.0, 0.9),  # did not fail: not listed
            asked("missed", 1.0, 0.1),
            asked("lost", 0.0, 0.6),
            asked("crashed", 1.0, 1.0, status="failed", error="boom"),
            asked("lost-too", 0.0, 0.2),
        ]
    )
    worst = failures.worst_questions(table, n=3)
    assert list(worst["question_id"]) == ["crashed", "lost-too", "lost"]
    assert worst.loc[0, "tags"] == ["error"] and worst.loc[1, "tags"] == ["gold not retrieved"]
    assert list(failures.worst_questions(table)["question_id"])[-1] == "missed"
