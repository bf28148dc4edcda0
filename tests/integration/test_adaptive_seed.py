"""Adaptive's seed scenarios on the bundled corpus, with the settings a user is served (the
weighted heuristic, the search-counting clock): a question one passage answers is confident at
depth 1; a question that needs a cross-referenced rule goes deeper and gets it."""

from __future__ import annotations

import pytest

from caprag.retrieval.store import PassageIndex
from caprag.state import GraphState
from caprag.steps import rule_steps
from caprag.strategies import AdaptiveDepthStrategy
from experiments.results.questions import QUESTIONS_DIR, load_questions

pytestmark = pytest.mark.slow


def question(set_name: str, question_id: str) -> tuple[str, list[str]]:
    rows = load_questions(QUESTIONS_DIR / f"{set_name}.jsonl")
    row = next(q for q in rows if q.id == question_id)
    return row.question, list(row.gold_passages)


async def test_a_question_one_passage_answers_is_sure_at_depth_1(
    corpus_index: PassageIndex,
) -> None:
    text, gold = question("single_book", "sb-core-005")  # How many talons are in a crown?
    state = await AdaptiveDepthStrategy(corpus_index, rule_steps()).execute(
        GraphState(main_question=text)
    )
    [only] = state.hops
    assert only.query_type == "factual" and only.depth == 1
    assert only.confidence is not None and only.threshold == 0.9
    assert only.confidence >= only.threshold and only.adaptive_decision == "sufficient"
    assert gold[0] == state.context[0].passage_id and len(state.context) == 5


async def test_a_cross_referenced_rule_is_reached_by_going_deeper(
    corpus_index: PassageIndex,
) -> None:
    text, gold = question("cross_book", "cb-a-001")  # the gift cites Rapid Strike
    state = await AdaptiveDepthStrategy(corpus_index, rule_steps()).execute(
        GraphState(main_question=text)
    )
    first, deeper = state.hops[0], state.hops[1]
    assert first.depth == 1 and first.adaptive_decision == "increase_depth"
    assert "Rapid Strike (Combat, p. 41)" in (first.missing_info or [])
    assert deeper.depth == 2 and "Rapid Strike (Combat, p. 41)" in deeper.queries
    assert "combat/rapid-strike" in {ref.passage_id for ref in deeper.documents if ref.new}
    assert set(gold) <= {doc.passage_id for doc in state.context}
