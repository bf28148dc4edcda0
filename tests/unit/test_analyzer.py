"""The sufficiency analyzer's decision rule, without any model."""

from __future__ import annotations

from caprag.retrieval.catalog import Catalog
from caprag.schemas import Document
from caprag.steps.analyze import decide, unresolved_references
from caprag.text import Reference, entities, references


def doc(pid: str, short: str, section: str, page: int, text: str) -> Document:
    return Document(
        passage_id=pid,
        book_id=short.lower(),
        book_short=short,
        section=section,
        page=page,
        text=text,
    )


STRIKE_GIFT = doc(
    "talents/trained-by-a-veteran",
    "Talents",
    "Trained by a Veteran",
    20,
    "A veteran's pupil fights in bursts. The penalty is modified by Rapid Strike (Combat, p. 41); "
    "for the powers it grants, see Powers, p. 100.",
)
RAPID_STRIKE = doc("combat/rapid-strike", "Combat", "Rapid Strike", 41, "Two blows at -3 each.")


def test_references_keep_rule_name_book_and_page() -> None:
    assert references(STRIKE_GIFT.text) == [
        Reference("Rapid Strike", "Combat", 41),
        Reference("", "Powers", 100),
    ]


PART_MISSING = (
    "What penalty does Trained by a Veteran give on each swing of the maneuver it improves, "
    "and which powers does it grant?"
)
"""The gift's passage covers penalty and powers, not the swings of the maneuver (3 of 8 terms)."""


def test_unresolved_references_become_targeted_queries() -> None:
    decision = decide(PART_MISSING, [STRIKE_GIFT])
    assert not decision.sufficient
    assert decision.new_queries[:2] == ["Rapid Strike (Combat, p. 41)", "see Powers, p. 100"]
    assert "unresolved references" in decision.reasoning


def test_a_reference_whose_target_is_gathered_is_resolved() -> None:
    found = unresolved_references("What does Trained by a Veteran do?", [STRIKE_GIFT, RAPID_STRIKE])
    assert found == [Reference("", "Powers", 100)]


def test_sufficient_when_nothing_is_missing() -> None:
    plain = doc(
        "combat/rapid-strike", "Combat", "Rapid Strike", 41, "Rapid Strike: two blows at -3 each."
    )
    decision = decide("What penalty does Rapid Strike give?", [plain])
    assert decision.sufficient
    assert decision.new_queries == []


def test_a_question_no_passage_is_about_is_not_searched_by_its_loose_terms() -> None:
    plain = doc("a/b", "A", "Torches", 5, "A torch burns for one hour.")
    decision = decide("What does a grappling hook weigh and cost?", [plain])
    assert not decision.sufficient and decision.new_queries == []
    assert "no gathered passage is about the question" in decision.reasoning


def test_queries_already_searched_are_not_repeated() -> None:
    decision = decide(
        PART_MISSING,
        [STRIKE_GIFT],
        searched=["Rapid Strike (Combat, p. 41)", "see Powers, p. 100"],
    )
    assert decision.sufficient
    assert "nothing left to follow" in decision.reasoning


def test_entities_find_rule_names() -> None:
    assert entities("How does Trained by a Veteran interact with Rapid Strike?") == [
        "Trained by a Veteran",
        "Rapid Strike",
    ]


KELD = doc(
    "hotpotqa/keld-bordinggaard-1",
    "Hotpotqa",
    "Keld Bordinggaard",
    1,
    "Keld Bordinggaard is a Danish football manager. As a player he spent most of his career at "
    "Odense Boldklub, the professional football club he joined in 1980.",
)
ODENSE = doc(
    "hotpotqa/odense-boldklub-2",
    "Hotpotqa",
    "Odense Boldklub",
    2,
    "Odense Boldklub is a Danish professional football club that won three Danish championships.",
)
BRIDGE_QUESTION = (
    "Which Danish championship-winning professional club did Keld Bordinggaard play for?"
)


CATALOG = Catalog([KELD, ODENSE])
"""The corpus's titles: a name is a bridge only when a passage of that title exists."""


def test_passages_without_citations_are_followed_by_the_names_the_catalog_knows() -> None:
    decision = decide(BRIDGE_QUESTION, [KELD], links="names", catalog=CATALOG)
    assert not decision.sufficient
    assert decision.new_queries == [f"{BRIDGE_QUESTION} Odense Boldklub"]  # the question kept
    assert "named by the passages" in decision.reasoning
    unlinked = decide(BRIDGE_QUESTION, [KELD], links="names", catalog=Catalog([KELD]))
    assert unlinked.new_queries == [], "a name no passage is titled by is not followed"


def test_a_bridge_whose_passage_is_gathered_or_searched_is_not_followed_again() -> None:
    gathered = decide(BRIDGE_QUESTION, [KELD, ODENSE], links="names", catalog=CATALOG)
    assert gathered.new_queries == []
    asked = [BRIDGE_QUESTION, f"{BRIDGE_QUESTION} Odense Boldklub"]
    searched = decide(BRIDGE_QUESTION, [KELD], searched=asked, links="names", catalog=CATALOG)
    assert searched.new_queries == []


def test_a_corpus_with_citations_is_followed_by_citations_not_by_names() -> None:
    rule = doc(
        "talents/iron-grip",
        "Talents",
        "Iron Grip",
        22,
        "Iron Grip lets a Bruiser hold a Wyrmling; it works like Grapple (Combat, p. 12).",
    )
    decision = decide("How is the hold Iron Grip gives resolved, and what breaks it?", [rule])
    assert decision.new_queries == ["Grapple (Combat, p. 12)"]


def test_a_passage_that_covers_the_question_answers_it_despite_its_pointers() -> None:
    decision = decide("What does Trained by a Veteran do for a fighter?", [STRIKE_GIFT])
    assert decision.sufficient and decision.new_queries == []
    assert decision.reasoning == "the passage the question is about covers it (all but: fighter)"


GIFT_WITH_ASIDE = doc(
    "talents/trained-by-a-veteran",
    "Talents",
    "Trained by a Veteran",
    20,
    "The penalty of each swing is modified by Rapid Strike (Combat, p. 41). Pupils often travel "
    "with caravans (Core, p. 12).",
)


def test_a_pointer_cited_about_something_else_is_not_followed_when_only_part_is_missing() -> None:
    question = (
        "What penalty does Trained by a Veteran give on each swing of the maneuver it improves?"
    )
    decision = decide(question, [GIFT_WITH_ASIDE])
    assert decision.new_queries == ["Rapid Strike (Combat, p. 41)"]


def test_every_pointer_is_followed_when_most_of_the_question_is_missing() -> None:
    question = "Where do caravans camp, how many guards watch them, and what do they pay?"
    covered = decide("What penalty does Trained by a Veteran give?", [GIFT_WITH_ASIDE])
    assert covered.new_queries == ["Rapid Strike (Combat, p. 41)"], (
        "covered, but the answering sentence defers to Rapid Strike; the aside is not followed"
    )
    assert covered.reasoning.startswith("the answering sentence points to")
    decision = decide(question + " Trained by a Veteran", [GIFT_WITH_ASIDE])
    assert set(decision.new_queries) == {"Rapid Strike (Combat, p. 41)", "see Core, p. 12"}


def test_a_citing_corpus_does_not_search_loose_question_terms() -> None:
    question = "How is the hold of Trained by a Veteran resolved, and what breaks it?"
    decision = decide(question, [RAPID_STRIKE, STRIKE_GIFT], searched=[question])
    assert all("break" not in q for q in decision.new_queries)


def test_a_passage_that_covers_the_question_is_not_bridged_from() -> None:
    decision = decide("Which professional football club was Keld Bordinggaard at?", [KELD])
    assert decision.sufficient and decision.new_queries == []
