"""Adaptive depth on the bundled corpus: a deeper round searches the cited rule; budgets hold."""

from __future__ import annotations

import pytest

from caprag.retrieval.store import PassageIndex
from caprag.state import GraphState
from caprag.steps import rule_steps
from caprag.strategies import AdaptiveDepthStrategy
from experiments.results.questions import QUESTIONS_DIR, load_questions
from tests.fakes import ManualClock

pytestmark = pytest.mark.slow


def strategy(index: PassageIndex) -> AdaptiveDepthStrategy:
    # A clock that never moves: these tests are about depth, and a loaded machine cannot cut a
    # deeper search short.
    return AdaptiveDepthStrategy(index, rule_steps(), clock=ManualClock())


async def test_cross_reference_is_reached_by_going_deeper(corpus_index: PassageIndex) -> None:
    rows = load_questions(QUESTIONS_DIR / "cross_book.jsonl")
    text = next(q.question for q in rows if q.id == "cb-a-001")  # the gift cites Rapid Strike
    state = await strategy(corpus_index).execute(GraphState(main_question=text))
    assert len(state.hops) >= 2
    first = state.hops[0]
    assert first.depth == 1 and first.adaptive_decision == "increase_depth"
    assert "Rapid Strike (Combat, p. 41)" in (first.missing_info or [])
    assert "Rapid Strike (Combat, p. 41)" not in (state.hops[-1].missing_info or [])
    ids = [d.passage_id for d in state.context]
    assert {"talents/trained-by-a-veteran", "combat/rapid-strike"} <= set(ids)
    assert "Rapid Strike (Combat, p. 41)" in state.hops[1].queries  # a citation, not the same query
    ladder = (5, 15, 30)[: len(state.hops)]
    assert all(
        h.chunks is not None and h.chunks <= n for h, n in zip(state.hops, ladder, strict=True)
    )
    confidences = [h.confidence or 0.0 for h in state.hops]
    assert confidences == sorted(confidences)


async def test_unanswerable_questions_stop_within_the_budgets(corpus_index: PassageIndex) -> None:
    rows = load_questions(QUESTIONS_DIR / "unanswerable.jsonl")
    adaptive = strategy(corpus_index)
    for row in rows:
        state = await adaptive.execute(GraphState(main_question=row.question))
        last = state.hops[-1]
        assert len(state.hops) <= 3 and last.depth is not None and last.depth <= 3
        assert len(state.context) <= 30
        assert last.context_tokens is not None and last.context_tokens <= 10_000
        if last.adaptive_decision == "budget_exhausted:depth":
            assert last.warning and "maximum depth 3 reached" in last.warning
