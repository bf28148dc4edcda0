"""A long evaluation keeps only its rows: memory per question does not grow with its length."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

from caprag.schemas import Document
from caprag.serve.services import Pipeline
from caprag.steps import rule_steps
from caprag.strategies import STRATEGIES
from experiments.harness.data import Dataset, EvalCase
from experiments.harness.evaluate import Evaluator
from experiments.results.questions import GoldQuestion
from experiments.results.row import QuestionRow

WORDS = "torch lantern rope sword shield potion arrow bow staff cloak ring amulet helm".split()
PASSAGES = 120


class FakeIndex:
    """Passages of 60 words; a query gets k of them, chosen by its characters."""

    def __init__(self) -> None:
        self.docs = [
            Document(
                passage_id=f"book/p{i}",
                book_id="book",
                section=f"Section {i}",
                text=" ".join(WORDS[(i + j) % len(WORDS)] for j in range(60)) + f" number {i}.",
            )
            for i in range(PASSAGES)
        ]

    def search(self, query: str, k: int) -> list[Document]:
        first = sum(map(ord, query))
        return [
            self.docs[(first + j) % PASSAGES].model_copy(update={"score": 1.0 / (j + 1)})
            for j in range(k)
        ]


def conversation(number: int) -> EvalCase:
    """A two-turn case (a question and a follow-up on its thread)."""
    word = WORDS[number % len(WORDS)]
    turns = tuple(
        GoldQuestion(
            id=f"c{number}-{turn}",
            question=question,
            answer="one hour",
            gold_passages=[f"book/p{number % PASSAGES}"],
            hops=1,
            books=["book"],
            query_type="factual",
        )
        for turn, question in (
            (1, f"How long does the {word} number {number} last?"),
            (2, "And what does it cost?"),
        )
    )
    return EvalCase(f"c{number}", "follow_up", turns)


def evaluator(pipeline_type: type[Pipeline] = Pipeline) -> Evaluator:
    steps = rule_steps()
    strategy = STRATEGIES["multi-hop"](FakeIndex(), steps, k=8)
    return Evaluator(pipeline=pipeline_type(strategy, steps), k=8, progress=False)


def dataset(cases: int) -> Dataset:
    return Dataset("memory", [conversation(n) for n in range(cases)])


@pytest.fixture
def traced() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


def retained_bytes(cases: int) -> tuple[int, int, int]:
    """(questions, bytes a run leaves behind once its rows are dropped, bytes with its rows) for
    a fresh evaluator that stays alive, as it does for the whole of a run."""
    judge = evaluator()
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    rows = asyncio.run(judge.run(dataset(cases)))
    gc.collect()
    with_rows = tracemalloc.get_traced_memory()[0] - before
    questions = len(rows)
    del rows
    gc.collect()
    without_rows = tracemalloc.get_traced_memory()[0] - before
    assert judge.pipeline is not None  # alive until here, like a run's evaluator
    return questions, without_rows, with_rows


def test_memory_per_question_does_not_grow_with_the_run(traced: None) -> None:
    retained_bytes(5)  # warm-up: first-use caches (pydantic, regexes) are not per question
    few, few_left, few_rows = retained_bytes(10)
    many, many_left, many_rows = retained_bytes(40)
    assert (few, many) == (20, 80)
    extra = many - few
    # What a run keeps besides its rows (conversation memory, progress, caches) is bounded:
    # 3x the questions may not leave more than 1 KiB more per extra question behind.
    assert many_left - few_left <= extra * 1024, (few_left, many_left)
    # The rows themselves cost the same per question in a short and in a long run, and far
    # less than the 100 KiB per question a long run may grow by (issue #18's 100 MiB/1,000).
    per_row = (many_rows - few_rows) / extra
    assert per_row <= 40 * 1024, per_row
    assert many_rows / many <= 1.5 * few_rows / few, (few_rows / few, many_rows / many)


async def test_a_finished_case_leaves_no_conversation_in_memory() -> None:
    judge = evaluator()
    rows = await judge.run(dataset(3))
    assert [row.turn for row in rows] == [1, 2] * 3
    assert all(row.status == "ok" for row in rows), [row.error for row in rows]
    checkpointer = judge.pipeline.checkpointer
    assert checkpointer is not None
    assert list(checkpointer.list(None)) == []


class RememberingPipeline(Pipeline):
    """A pipeline that keeps every thread (what evaluation did before it forgot finished cases)."""

    async def forget(self, thread_id: str) -> None:
        return None


def without_clock(data: Any) -> Any:
    """JSON-shaped data without what the clock sets (latencies and timings)."""
    if isinstance(data, dict):
        return {
            k: without_clock(v)
            for k, v in data.items()
            if k not in ("latency_s", "timings", "started_ns", "started_at")
        }
    if isinstance(data, list):
        return [without_clock(item) for item in data]
    return data


def comparable(rows: list[QuestionRow]) -> list[dict[str, Any]]:
    """Rows as data, without what the clock sets."""
    return [without_clock(row.model_dump(mode="json")) for row in rows]


async def test_forgetting_finished_cases_changes_no_result() -> None:
    forgetting = await evaluator().run(dataset(4))
    remembering = await evaluator(RememberingPipeline).run(dataset(4))
    assert comparable(forgetting) == comparable(remembering)
    # Within a case the memory is still there: each follow-up is rewritten from its history.
    rewritten = [r.turn for r in forgetting if any(c.step == "rewrite" for c in r.calls or [])]
    assert rewritten == [2] * 4
