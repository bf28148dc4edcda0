"""Two runs compared per question: changes on a metric, filters, counts and the export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from experiments.harness.data import load_dataset
from experiments.results.questions import load_questions
from experiments.results.row import QuestionRow
from experiments.scoring import regressions as reg
from experiments.scoring.failures import ERROR, GOLD_NOT_RETRIEVED, STOPPED_EARLY


def question(qid: str, values: dict[str, float], **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "case_id": qid, "question_id": qid, "set": "cross_book", "query_type": "factual",
        "turn": 1, "question": f"What does {qid} cost?", "gold_answer": "5 MP",
        "gold_ids": ["talents/a", "combat/b"], "values": values,
    }  # fmt: skip
    base.update(fields)
    if "context_ids" not in fields:  # what recall@k says reached generation
        gold = base["gold_ids"]
        base["context_ids"] = gold if values.get("recall_at_k") == 1.0 else gold[:1]
    return QuestionRow(**base).record()


def table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(rows)


STOPPED = [
    {"hop": 1, "queries": ["x"], "decision": {"sufficient": True, "new_queries": []},
     "documents": [{"passage_id": "talents/a", "book_id": "talents", "page": 1, "score": 1.0,
                    "new": True}]},
]  # fmt: skip

A = table(
    [
        question("q1", {"recall_at_k": 1.0, "f1": 0.9}),
        question("q2", {"recall_at_k": 0.5, "f1": 0.4}, query_type="operational"),
        question("q3", {"recall_at_k": 0.5, "f1": 0.5}, set="single_book"),
        question("q4", {"recall_at_k": 1.0, "f1": 1.0}),
        question("q5", {}, set="unanswerable", gold_ids=[], gold_answer=""),
        question("f-1", {"recall_at_k": 1.0}, case_id="f", set="follow_up", turn=2),
    ]
)
B = table(
    [
        question("q1", {"recall_at_k": 0.5, "f1": 0.9}, hops=STOPPED),
        question("q2", {"recall_at_k": 1.0, "f1": 0.4}, query_type="operational"),
        question("q3", {"recall_at_k": 0.5, "f1": 0.7}, set="single_book"),
        question("q4", {}, status="failed", error="RuntimeError: boom"),
        question("q5", {}, set="unanswerable", gold_ids=[], gold_answer=""),
        question("f-1", {"recall_at_k": 0.0}, case_id="f", set="follow_up", turn=2),
    ]
)


def changes(frame: pd.DataFrame) -> dict[str, str]:
    return dict(zip(frame["question_id"], frame["change"], strict=True))


def test_changes_per_question_on_the_chosen_metric() -> None:
    recall = reg.compare(A, B, "recall_at_k")
    assert changes(recall) == {
        "q1": "worse", "q2": "better", "q3": "same",
        "q4": "worse",  # failed in B: counts as recall 0
        "q5": "not scored",  # no gold passage in either run
        "f-1": "worse",
    }  # fmt: skip
    assert recall.set_index("question_id").loc["q4", ["value_a", "value_b"]].tolist() == [1.0, 0.0]
    assert changes(reg.compare(A, B, "f1"))["q3"] == "better"
    # both tables say what failed and why it might have: B's q1 stopped with a gold passage missing
    tags = recall.set_index("question_id")
    assert tags.loc["q1", "tags_b"] == [GOLD_NOT_RETRIEVED, STOPPED_EARLY]
    assert tags.loc["q1", "tags_a"] == []
    assert tags.loc["q4", "tags_b"] == [GOLD_NOT_RETRIEVED, ERROR]


def test_lower_is_better_metrics_and_a_failed_question_without_a_worst_value() -> None:
    a = table([question("q1", {"tokens": 900.0}), question("q2", {"tokens": 500.0})])
    b = table([question("q1", {"tokens": 400.0}), question("q2", {}, status="failed")])
    assert changes(reg.compare(a, b, "tokens")) == {"q1": "better", "q2": "not scored"}


def test_metrics_both_runs_can_be_compared_on() -> None:
    assert reg.metrics_of(A, B) == ["recall_at_k", "all_gold_at_k", "f1"]
    older = pd.DataFrame({"question_id": ["q1"], "recall_at_k": [1.0]})
    assert reg.metrics_of(older, older) == ["recall_at_k", "all_gold_at_k"]
    assert changes(reg.compare(older, B.iloc[:1], "all_gold_at_k")) == {"q1": "worse"}
    with pytest.raises(ValueError, match="question_id"):
        reg.compare(pd.DataFrame({"x": [1]}), B, "f1")


def test_counts_follow_the_filters() -> None:
    frame = reg.compare(A, B, "recall_at_k")
    assert reg.counts(frame) == {"worse": 3, "better": 1, "same": 1, "not scored": 1}
    assert list(reg.ordered(frame)["change"]) == ["worse"] * 3 + ["better", "same", "not scored"]
    cross = reg.filtered(frame, sets=["cross_book"])
    assert sorted(cross["question_id"]) == ["q1", "q2", "q4"]
    assert reg.counts(cross) == {"better": 1, "worse": 2, "same": 0, "not scored": 0}
    operational = reg.filtered(frame, sets=["cross_book"], types=["operational"])
    assert reg.counts(operational) == {"better": 1, "worse": 0, "same": 0, "not scored": 0}
    tagged = reg.filtered(frame, tags=[STOPPED_EARLY, ERROR])
    assert sorted(tagged["question_id"]) == ["q1", "q4"]
    worse = reg.filtered(cross, changes=["worse"])
    assert sorted(worse["question_id"]) == ["q1", "q4"]
    assert reg.counts(reg.filtered(frame, sets=["nothing"])) == dict.fromkeys(reg.CHANGES, 0)


def test_export_loads_back_with_the_projects_loaders(tmp_path: Path) -> None:
    frame = reg.compare(A, B, "recall_at_k")
    items = reg.as_dataset(frame)
    assert [i["id"] for i in items] == ["q1", "q2", "q3", "q4", "q5"]  # the turn f-1 left out
    path = tmp_path / "regressions.jsonl"
    path.write_text(reg.to_jsonl(items), encoding="utf-8")
    loaded = load_questions(path)
    assert [q.id for q in loaded] == ["q1", "q2", "q3", "q4", "q5"]
    first = loaded[0]
    assert (first.question, first.answer, first.set) == ("What does q1 cost?", "5 MP", "cross_book")
    assert first.gold_passages == ["talents/a", "combat/b"] and first.books == ["talents", "combat"]
    assert first.hops == 2 and loaded[1].query_type == "operational"
    assert not loaded[4].answerable
    dataset = load_dataset("regressions", ["cross_book"], path=str(path))
    assert [case.id for case in dataset.cases] == ["q1", "q2", "q3", "q4", "q5"]


def test_a_benchmark_set_filters_by_its_benchmark_type_like_the_compare_page() -> None:
    bridge = question("h1", {"recall_at_k": 1.0}, set="hotpotqa:bridge")
    comparison = question("h2", {"recall_at_k": 0.5}, set="hotpotqa:comparison")
    frame = reg.compare(table([bridge, comparison]), table([bridge, comparison]), "recall_at_k")
    assert dict(zip(frame["question_id"], frame["type"], strict=True)) == {
        "h1": "bridge",
        "h2": "comparison",
    }
    assert list(reg.filtered(frame, types=["bridge"])["question_id"]) == ["h1"]


def test_the_export_carries_human_labels_and_loads_as_a_question_set(tmp_path: Path) -> None:
    frame = reg.compare(A, B, "recall_at_k")
    items = reg.as_dataset(frame, {"q1": "gold not retrieved: hop 2 stopped"})
    path = tmp_path / "labelled.jsonl"
    path.write_text(reg.to_jsonl(items), encoding="utf-8")
    loaded = {q.id: q.label for q in load_questions(path)}
    assert loaded["q1"] == "gold not retrieved: hop 2 stopped"
    assert loaded["q2"] == ""  # nobody labelled it: the field stays empty
