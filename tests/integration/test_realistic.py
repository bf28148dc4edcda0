"""Realistic cases on the bundled corpus: cross-book references are followed, budgets hold."""

from __future__ import annotations

import pytest

from caprag.retrieval.store import PassageIndex
from caprag.serve.services import Pipeline
from caprag.state import GraphState
from caprag.steps import rule_steps
from caprag.strategies import MultiHopStrategy, MultiQuestionStrategy, SingleQueryStrategy
from experiments.results.questions import QUESTIONS_DIR, load_questions

pytestmark = pytest.mark.slow


def question(qid: str) -> str:
    rows = load_questions(
        QUESTIONS_DIR / ("cross_book.jsonl" if qid.startswith("cb") else "single_book.jsonl")
    )
    return next(q.question for q in rows if q.id == qid)


async def context_ids(strategy: object, text: str) -> tuple[list[str], int]:
    state = await strategy.execute(GraphState(main_question=text))  # type: ignore[attr-defined]
    return [d.passage_id for d in state.context], len(state.hops)


async def test_multi_hop_follows_the_gift_to_the_combat_rule(corpus_index: PassageIndex) -> None:
    text = question("cb-a-001")  # Trained by a Veteran → Rapid Strike, without naming it
    single, _ = await context_ids(SingleQueryStrategy(corpus_index, rule_steps()), text)
    expanded, _ = await context_ids(MultiQuestionStrategy(corpus_index, rule_steps()), text)
    hopped, hops = await context_ids(MultiHopStrategy(corpus_index, rule_steps()), text)
    assert "talents/trained-by-a-veteran" in single
    assert "combat/rapid-strike" not in single and "combat/rapid-strike" not in expanded
    assert hops >= 2
    assert {"talents/trained-by-a-veteran", "combat/rapid-strike"} <= set(hopped)
    assert len(hopped) == 8  # the budget k is the same for every strategy


async def test_single_book_answer_cites_its_passage(corpus_index: PassageIndex) -> None:
    llm = rule_steps()
    result = await Pipeline(MultiHopStrategy(corpus_index, llm), llm).ask(
        question("sb-talents-001")
    )
    assert "12 MP" in result.answer
    assert result.sources[0].passage_id == "talents/arcane-aptitude"
