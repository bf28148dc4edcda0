"""The strategies on the real index (MiniLM + Chroma over the fixture books), for what the unit
tests on the in-memory retriever cannot show: MiniLM does not find the passage a question's answer
cites from the question's words, the strategies follow the citation to it, and the offline
pipeline with the real index needs no network. (The strategy logic itself is unit-tested on the
in-memory retriever, with questions built so that a term-overlap search misses the cited passage.)
"""

from __future__ import annotations

import socket

import pytest

from caprag.retrieval.store import PassageIndex
from caprag.serve.services import Pipeline
from caprag.state import GraphState
from caprag.steps import rule_steps
from caprag.strategies import (
    STRATEGIES,
    AdaptiveDepthStrategy,
    MultiHopStrategy,
    SingleQueryStrategy,
)
from tests.fakes import ManualClock

CROSS_REF = "What penalty does the second attack of a Flurry suffer?"
SMALL_LADDER = (2, 4, 8)


async def test_cross_reference_to_another_book_takes_a_second_hop(
    fixture_index: PassageIndex,
) -> None:
    single = await SingleQueryStrategy(fixture_index, rule_steps(), k=2).execute(
        GraphState(main_question=CROSS_REF)
    )
    assert "gifts/old-soldier" not in [d.passage_id for d in single.context]

    state = await MultiHopStrategy(fixture_index, rule_steps(), k=2).execute(
        GraphState(main_question=CROSS_REF)
    )
    assert len(state.hops) >= 2
    assert state.hops[0].decision is not None
    assert "Old Soldier (Gifts, p. 7)" in state.hops[0].decision.new_queries
    assert "gifts/old-soldier" in [d.passage_id for d in state.context]
    assert "fighting/flurry" in [d.passage_id for d in state.context]


async def test_adaptive_searches_deeper_for_the_cited_passage(
    fixture_index: PassageIndex,
) -> None:
    strategy = AdaptiveDepthStrategy(
        fixture_index, rule_steps(), depth_chunks=SMALL_LADDER, clock=ManualClock()
    )
    state = await strategy.execute(GraphState(main_question=CROSS_REF))
    assert len(state.hops) > 1
    first, last = state.hops[0], state.hops[-1]
    assert first.adaptive_decision == "increase_depth"
    assert first.missing_info == ["Old Soldier (Gifts, p. 7)"]
    assert last.confidence is not None
    assert last.confidence >= 0.85 or last.depth == 3
    assert {"fighting/flurry", "gifts/old-soldier"} <= {d.passage_id for d in state.context}

    forced = AdaptiveDepthStrategy(
        fixture_index, rule_steps(), depth_chunks=SMALL_LADDER, clock=ManualClock(), power=1
    )
    [hop] = (await forced.execute(GraphState(main_question=CROSS_REF))).hops
    assert hop.confidence is not None and hop.threshold is not None
    assert hop.confidence < hop.threshold
    assert hop.hint is not None and "raise the power to 2" in hop.hint


async def test_every_strategy_answers_offline_with_the_network_unreachable(
    fixture_index: PassageIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("network disabled by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    for name in sorted(STRATEGIES):
        llm = rule_steps()
        pipeline = Pipeline(STRATEGIES[name](fixture_index, llm, k=3), llm)
        result = await pipeline.ask("How many stamina points does a short rest restore?", "t")
        assert "3 stamina points" in result.answer, name
