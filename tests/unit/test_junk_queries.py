"""No rule searches a junk query: one word, stop words only, or one already searched in the
question. Each case at each place a rule makes a query (expansion, the analyzer, multi-hop's
next hop, adaptive's deeper round, IRCoT's next thought)."""

from __future__ import annotations

import pytest

from caprag.state import GraphState
from caprag.steps import rule_steps
from caprag.steps.analyze import SufficiencyDecision, decide
from caprag.steps.expand import rule_expansion
from caprag.strategies import AdaptiveDepthStrategy, MultiHopStrategy
from caprag.text import junk_query, searchable
from tests.fakes import MemoryRetriever, ScriptedChatModel, scripted_steps
from tests.unit.test_analyzer import PART_MISSING, STRIKE_GIFT


@pytest.mark.parametrize(
    ("query", "searched", "why"),
    [
        ("Considering", [], "one word"),
        ("October", [], "one word"),
        ("CBSSports", [], "one word"),
        ("  ?! ", [], "no words"),
        ("what is the", [], "stop words only"),
        ("Of the And", [], "stop words only"),
        ("Rapid Strike penalty", ["rapid strike, PENALTY?"], "already searched"),
        ("Rapid Strike penalty", ["Rapid Strike"], None),
        ("Battle of Arras", [], None),
    ],
)
def test_junk_query_says_why(query: str, searched: list[str], why: str | None) -> None:
    assert junk_query(query, searched) == why


def test_searchable_keeps_order_drops_repeats_and_notes_why() -> None:
    notes: list[str] = []
    kept = searchable(
        ["Rapid Strike", "October", "rapid strike", "the of", "Old Soldier gift"], [], notes
    )
    assert kept == ["Rapid Strike", "Old Soldier gift"]
    assert notes == [
        "query 'October' not searched: one word",
        "query 'rapid strike' not searched: already searched",
        "query 'the of' not searched: stop words only",
    ]


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        # A one-word name opening a sentence, a month, a one-word brand: none is searched alone.
        (
            "Considering its cost, what did CBSSports report in October about Super Bowl 50?",
            ["Super Bowl", "considering cost cbssport report october super bowl 50"],
        ),
        # The keywords of a one-term question are one word: the question alone is searched.
        ("How does Grapple work?", []),
        # Keywords that are the question itself are not searched twice; its name is.
        ("Rapid Strike penalty", ["Rapid Strike"]),
    ],
)
def test_rule_expansion_issues_no_junk(question: str, expected: list[str]) -> None:
    assert rule_expansion(question, 5) == expected


def test_the_analyzer_never_asks_again_what_was_searched() -> None:
    first = decide(PART_MISSING, [STRIKE_GIFT])
    assert "Rapid Strike (Combat, p. 41)" in first.new_queries
    searched = [PART_MISSING, "rapid strike (combat p 41)"]  # spelled otherwise: the same search
    again = decide(PART_MISSING, [STRIKE_GIFT], searched)
    assert "Rapid Strike (Combat, p. 41)" not in again.new_queries
    assert all(junk_query(q, searched) is None for q in again.new_queries)


async def test_multi_hop_does_not_search_an_analyzers_junk(books: MemoryRetriever) -> None:
    chat = ScriptedChatModel(
        replies=[SufficiencyDecision(sufficient=False, new_queries=["Flurry", "the of", "  "])]
    )
    strategy = MultiHopStrategy(books, scripted_steps(chat), k=3)
    state = await strategy.execute(GraphState(main_question="How does a Flurry attack work?"))
    assert len(state.hops) == 1  # nothing worth a second hop
    assert [q.text for q in state.questions] == ["How does a Flurry attack work?"]


async def test_adaptive_deeper_rounds_search_no_junk(books: MemoryRetriever) -> None:
    strategy = AdaptiveDepthStrategy(books, rule_steps(), k=3)
    question = "What penalty does the second attack of a Flurry suffer?"
    state = await strategy.execute(GraphState(main_question=question))
    searched: list[str] = []
    for hop in state.hops:
        for query in hop.queries:
            assert junk_query(query, searched) is None, (hop.hop, query)
            searched.append(query)
