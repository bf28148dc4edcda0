"""Strategies on the fixture books (in memory, term overlap): the contract, hops, cross-references,
de-duplication."""

from __future__ import annotations

import pytest

from caprag.graph import build_graph
from caprag.serve.services import Pipeline
from caprag.state import GraphState
from caprag.steps import rule_steps
from caprag.steps.analyze import SufficiencyDecision
from caprag.strategies import (
    STRATEGIES,
    AdaptiveDepthStrategy,
    MultiHopStrategy,
    MultiQuestionStrategy,
    RetrievalStrategy,
    SingleQueryStrategy,
)
from tests.fakes import MemoryRetriever, ScriptedChatModel, scripted_steps

CROSS_REF_QUESTION = "What penalty does the second attack of a Flurry suffer?"
CROSS_REF_UNSEEN = "What does a Flurry attack suffer?"
"""A question whose words reach the Flurry passage, not the Old Soldier passage it cites (as
the curated cross-book questions are built): a term-overlap search of it misses Old Soldier."""


def test_a_strategy_without_execute_cannot_be_instantiated(books: MemoryRetriever) -> None:
    class Lazy(RetrievalStrategy):
        name = "lazy"

    with pytest.raises(TypeError, match="abstract"):
        Lazy(books, rule_steps())  # type: ignore[abstract]


@pytest.mark.parametrize("name", sorted(STRATEGIES))
async def test_every_strategy_returns_questions_with_context(
    name: str, books: MemoryRetriever
) -> None:
    strategy = STRATEGIES[name](books, rule_steps(), k=3)
    state = await strategy.execute(
        GraphState(
            question="How long does a torch burn?", main_question="How long does a torch burn?"
        )
    )
    assert len(state.questions) >= 1
    assert all(q.context for q in state.questions)
    assert state.questions[0].text == "How long does a torch burn?"
    budget = 3
    if isinstance(strategy, AdaptiveDepthStrategy):  # its context is the depth's chunks, not k
        budget = strategy.depth_chunks[(state.hops[-1].depth or 1) - 1]
    assert 1 <= len(state.context) <= budget
    assert state.context[0].passage_id == "basics/torches"


async def test_question_answered_by_one_passage_stops_after_one_hop(
    books: MemoryRetriever,
) -> None:
    strategy = MultiHopStrategy(books, rule_steps(), k=2)
    state = await strategy.execute(GraphState(main_question="How long does a torch burn?"))
    assert len(state.hops) == 1
    assert state.hops[0].decision is not None and state.hops[0].decision.sufficient


async def test_cross_reference_to_another_book_takes_a_second_hop(
    books: MemoryRetriever,
) -> None:
    single = await SingleQueryStrategy(books, rule_steps(), k=2).execute(
        GraphState(main_question=CROSS_REF_UNSEEN)
    )
    assert "gifts/old-soldier" not in [d.passage_id for d in single.context]

    state = await MultiHopStrategy(books, rule_steps(), k=2).execute(
        GraphState(main_question=CROSS_REF_UNSEEN)
    )
    assert len(state.hops) >= 2
    assert state.hops[0].decision is not None
    assert "Old Soldier (Gifts, p. 7)" in state.hops[0].decision.new_queries
    assert "gifts/old-soldier" in [d.passage_id for d in state.context]
    assert "fighting/flurry" in [d.passage_id for d in state.context]


def never_satisfied() -> ScriptedChatModel:
    decisions = [
        SufficiencyDecision(sufficient=False, new_queries=[f"more about stamina {n}"])
        for n in range(10)
    ]
    return ScriptedChatModel(
        by_substring={
            "Answer the question": {"answer": "Sleep restores stamina.", "source_ids": []}
        },
        replies=decisions,
    )


async def test_never_satisfied_analyzer_stops_at_three_hops_and_generation_runs(
    books: MemoryRetriever,
) -> None:
    chat = never_satisfied()
    llm = scripted_steps(chat)
    pipeline = Pipeline(MultiHopStrategy(books, llm, k=2), llm)
    result = await pipeline.ask("How do heroes recover stamina?")
    assert result.hop_count == 3
    assert [hop.decision is not None for hop in result.hops] == [True, True, False]
    assert result.answer == "Sleep restores stamina."
    analyze_calls = [
        c for c in chat.calls if "decide whether passages retrieved" in str(c[0].content)
    ]
    assert len(analyze_calls) == 2


async def test_same_passage_in_two_hops_appears_once(books: MemoryRetriever) -> None:
    chat = ScriptedChatModel(
        replies=[
            SufficiencyDecision(sufficient=False, new_queries=["Flurry attack twice in one turn"]),
            SufficiencyDecision(sufficient=True, new_queries=[]),
        ]
    )
    strategy = MultiHopStrategy(books, scripted_steps(chat), k=3)
    state = await strategy.execute(GraphState(main_question=CROSS_REF_QUESTION))
    ids = [d.passage_id for d in state.context]
    assert ids.count("fighting/flurry") == 1
    second = state.hops[1]
    flurry = [ref for ref in second.documents if ref.passage_id == "fighting/flurry"]
    assert flurry and not flurry[0].new
    assert second.duplicate_documents >= 1


async def test_multi_question_searches_original_and_expansions(books: MemoryRetriever) -> None:
    chat = ScriptedChatModel(replies=[{"questions": ["Old Soldier gift", "second blow penalty"]}])
    strategy = MultiQuestionStrategy(books, scripted_steps(chat), k=3)
    state = await strategy.execute(GraphState(main_question=CROSS_REF_QUESTION))
    assert [q.text for q in state.questions] == [
        CROSS_REF_QUESTION,
        "Old Soldier gift",
        "second blow penalty",
    ]
    assert len(state.hops) == 1
    assert state.hops[0].usage[0].step == "expand"


async def test_graph_runs_rewrite_retrieve_generate(books: MemoryRetriever) -> None:
    llm = rule_steps()
    strategy = MultiHopStrategy(books, llm, k=2)
    graph = build_graph(strategy, llm)
    assert set(graph.get_graph().nodes) >= {"rewrite", "retrieve", "generate"}
    pipeline = Pipeline(strategy, llm, graph)
    result = await pipeline.ask(CROSS_REF_QUESTION)
    assert "penalty of 4" in result.answer
    assert {s.passage_id for s in result.sources} >= {"fighting/flurry", "gifts/old-soldier"}
    assert result.usage[0].step == "analyze"  # no rewrite call on a first question
    assert result.prompt_tokens > 0 and result.cost_usd > 0
