"""Multi-hop on the bundled corpus stops after one hop when that hop already answers."""

from __future__ import annotations

import pytest

from caprag.retrieval.store import PassageIndex
from caprag.serve.services import Pipeline
from caprag.steps import rule_steps
from caprag.strategies import MultiHopStrategy
from experiments.results.questions import QUESTIONS_DIR, load_questions

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("qid", "gold"),
    [("sb-core-001", "core/mark-point-costs-table"), ("sb-core-002", "core/light-and-vision")],
)
async def test_a_single_book_question_answered_by_its_first_hop_takes_one_hop(
    corpus_index: PassageIndex, qid: str, gold: str
) -> None:
    text = next(
        q.question for q in load_questions(QUESTIONS_DIR / "single_book.jsonl") if q.id == qid
    )
    llm = rule_steps()
    result = await Pipeline(MultiHopStrategy(corpus_index, llm), llm).ask(text)
    assert result.hop_count == 1
    decision = result.hops[0].decision
    assert decision is not None and decision.sufficient
    assert decision.reasoning.startswith(
        ("the passage the question is about covers it", "nothing left to follow")
    )
    assert gold in [d.passage_id for d in result.context]
