"""Step `classify` (adaptive): sort a question by how much reading it needs.

Rule: each query type has phrase patterns; the type with most distinct matches wins, ties go to
the type that needs deeper retrieval (strategic > decision > operational), and no match means
factual. LLM: the CLASSIFY prompt. If the LLM's reply never parses, the question is taken as
strategic (the deepest start: a wasted search is cheaper than a missed rule), and the call is
recorded with its error.
"""

from __future__ import annotations

import re
import time
from typing import Literal

from pydantic import BaseModel, Field

from caprag.llm.budget import prompt_values
from caprag.llm.client import StepFailedError, StructuredClient
from caprag.llm.prompt import Prompt
from caprag.steps.base import NEUTRAL, RuleStep, StepResult, Wording

CLASSIFY = Prompt(
    name="classify",
    version="classify-v3",
    system=(
        "You sort questions about {library} by how much reading they need.\n"
        "- factual: asks for one fact, number or definition ('How long does a torch burn?').\n"
        "- operational: asks how to carry out a procedure, step by step ('How do I resolve a "
        "charge?').\n"
        "- decision: asks whether something is allowed, or to choose between options ('Can I "
        "dodge after a Flurry?', 'Is a charge or a flurry better here?').\n"
        "- strategic: asks to plan, build, combine or optimize across several rules ('What is "
        "the best way to build a fighter around Old Soldier?').\n"
        "Return query_type and one sentence of reasoning (at most {reasoning_chars} characters)."
    ),
    user="Question: {question}",
)

QueryType = Literal["factual", "operational", "decision", "strategic"]


class QueryClass(BaseModel):
    """The kind of question: it sets the depth retrieval starts at and the confidence it needs."""

    query_type: QueryType = Field(
        description="factual (one fact), operational (a procedure), decision (choose or judge "
        "whether something is allowed), strategic (plan or combine several rules)."
    )
    reasoning: str = Field(default="", max_length=1000, description="One sentence why.")


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


class RuleClassifier(RuleStep):
    """The phrase rules (`classify_question`)."""

    async def __call__(self, question: str) -> StepResult[QueryClass]:
        t0 = time.perf_counter()
        value = classify_question(question)
        lengths = prompt_values(QueryClass, None, CLASSIFY.fields)
        return self.costed(
            "classify",
            CLASSIFY,
            value,
            value.model_dump_json(),
            t0,
            question=question,
            library=self.wording.library,
            **lengths,
        )


class LLMClassifier:
    """The model's classification."""

    kind = "llm"

    def __init__(self, client: StructuredClient, wording: Wording = NEUTRAL) -> None:
        self.client = client
        self.model = client.model
        self.wording = wording

    async def __call__(self, question: str) -> StepResult[QueryClass]:
        try:
            value, usage = await self.client.structured(
                "classify",
                CLASSIFY,
                QueryClass,
                question=question,
                library=self.wording.library,
                **self.client.lengths(CLASSIFY, QueryClass),
            )
        except StepFailedError as failed:
            fallback = QueryClass(
                query_type="strategic",
                reasoning="the classifier's reply could not be used: searching as deep as allowed",
            )
            return StepResult(value=fallback, usage=failed.usage)
        return StepResult(value=value, usage=usage)
