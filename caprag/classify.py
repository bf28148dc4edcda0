"""Query classification by rules: the offline backend's `classify`, testable without a model.

Each query type has phrase patterns; the type with most distinct matches wins, ties go to the type
that needs deeper retrieval (strategic > decision > operational), and no match means factual.
"""

from __future__ import annotations

import re

from caprag.schemas import QueryClass, QueryType

PATTERNS: dict[QueryType, tuple[str, ...]] = {
    "operational": (
        r"\bhow (?:do|does|can|should|would|must) (?:i|we|you|one|a|an|my|the)\b",
        r"\bhow to\b",
        r"\bprocedures?\b",
        r"\bsteps?\b",
        r"\bprocess\b",
        r"\bwalk me through\b",
    ),
    "decision": (
        r"^(?:can|could|may|should|must|am|is it|are we|do i|does (?:a|an|my|the))\b",
        r"\bshould (?:i|we|my|a|an|the)\b",
        r"\bis (?:it|that|this) (?:allowed|legal|possible|worth)\b",
        r"\ballowed\b",
        r"\bwhich (?:is|one is|one's|would be) better\b",
        r"\bbetter\b",
        r"\bworth\b",
        r"\bor\b",
    ),
    "strategic": (
        r"\bplan(?:s|ning)?\b",
        r"\bbuild(?:s|ing)?\b",
        r"\bcombin(?:e|es|ed|ing|ation)\b",
        r"\bbest way\b",
        r"\bstrateg(?:y|ies|ic)\b",
        r"\boptimi[sz](?:e|es|ed|ing|ation)\b",
        r"\bmaximi[sz](?:e|es|ed|ing)\b",
        r"\bsynerg(?:y|ies|ize)\b",
        r"\bmost effective\b",
    ),
}
DEPTH_ORDER: tuple[QueryType, ...] = ("strategic", "decision", "operational")
"""Tie-break order: on equal matches, the type that reads more wins (a wasted search is cheaper
than a missed rule)."""


def classify_question(question: str) -> QueryClass:
    """The query type the patterns point to, with the phrases that decided it."""
    text = " ".join(question.lower().split())
    matched: dict[QueryType, list[str]] = {}
    for query_type, patterns in PATTERNS.items():
        found = [m.group(0) for p in patterns if (m := re.search(p, text))]
        if found:
            matched[query_type] = list(dict.fromkeys(found))
    if not matched:
        return QueryClass(query_type="factual", reasoning="no procedure, choice or plan wording")
    best = max(DEPTH_ORDER, key=lambda t: (len(matched.get(t, [])), -DEPTH_ORDER.index(t)))
    phrases = ", ".join(f"'{p}'" for p in matched[best])
    return QueryClass(query_type=best, reasoning=f"{best} wording: {phrases}")
