"""Step `expand`: break a question into standalone search queries (multi-question, multi-hop).

Rule: one query per named rule in the question, then the bare keywords. LLM: the EXPAND prompt.
If the LLM's reply never parses, no sub-question is searched (the question alone is), and the
call is recorded with its error.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, Field, field_validator

from caprag.llm.budget import model_limits, prompt_values
from caprag.llm.client import StepFailedError, StructuredClient
from caprag.llm.prompt import Prompt
from caprag.schemas import MAX_QUERIES, MAX_QUERY_CHARS
from caprag.steps.base import NEUTRAL, RuleStep, StepResult, Wording
from caprag.text import entities, searchable, terms

EXPAND = Prompt(
    name="expand",
    version="expand-v4",
    system=(
        "You help search {library}. Break the user's question into at most {n} short, "
        "standalone search queries, one per fact, term or source the answer depends on, each at "
        "most {questions_chars} characters. Do not repeat the original "
        "question. Return them in the field 'questions'."
    ),
    user="Question: {question}",
)


class Questions(BaseModel):
    """Sub-questions produced by query expansion (the original is added by the strategy)."""

    questions: list[str] = Field(
        max_length=MAX_QUERIES,
        # Sent (and fitted to the output cap); a longer query from a server that does not
        # constrain its output is cut by the validator below rather than refused.
        json_schema_extra={"items": {"type": "string", "maxLength": MAX_QUERY_CHARS}},
    )

    @field_validator("questions")
    @classmethod
    def _bounded(cls, value: list[str]) -> list[str]:
        return [q.strip()[:MAX_QUERY_CHARS] for q in value if q.strip()]


def cap(queries: list[str], n: int, notes: list[str]) -> list[str]:
    """At most n queries; what is dropped is noted."""
    if len(queries) > n:
        notes.append(f"{len(queries)} queries cut to {n}: dropped " + "; ".join(queries[n:]))
    return queries[:n]


def rule_expansion(question: str, n: int) -> list[str]:
    """Named rules of the question, then its keywords, at most n; none that is junk
    (`caprag.text.junk_query`: one word, stop words only, the question itself)."""
    keywords = " ".join(dict.fromkeys(terms(question)))
    return searchable([*entities(question), keywords], [question])[:n]


class RuleExpander(RuleStep):
    """Expansion by entities and keywords."""

    async def __call__(self, question: str, n: int) -> StepResult[list[str]]:
        t0 = time.perf_counter()
        subs = rule_expansion(question, n)
        lengths = prompt_values(Questions, None, EXPAND.fields)
        return self.costed(
            "expand",
            EXPAND,
            subs,
            "\n".join(subs),
            t0,
            question=question,
            n=str(n),
            library=self.wording.library,
            **lengths,
        )


class LLMExpander:
    """Expansion by the model, cut to n."""

    kind = "llm"

    def __init__(self, client: StructuredClient, wording: Wording = NEUTRAL) -> None:
        self.client = client
        self.model = client.model
        self.wording = wording

    async def __call__(self, question: str, n: int) -> StepResult[list[str]]:
        asked = asked_for(n, self.client.max_output_tokens)
        try:
            value, usage = await self.client.structured(
                "expand",
                EXPAND,
                Questions,
                question=question,
                n=str(asked),
                library=self.wording.library,
                **self.client.lengths(EXPAND, Questions),
            )
        except StepFailedError as failed:
            return StepResult(value=[], usage=failed.usage)
        notes: list[str] = list(usage.notes)
        queries = cap(value.questions, n, notes)
        return StepResult(value=queries, usage=usage.model_copy(update={"notes": notes}))


def asked_for(n: int, output_cap: int | None) -> int:
    """How many queries the prompt asks for: n, or fewer when the output cap holds fewer."""
    items = model_limits(Questions, output_cap)["questions"].items
    return min(n, items) if items is not None else n
