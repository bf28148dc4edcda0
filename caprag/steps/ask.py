"""Step `ask` (Self-Ask): the next follow-up question, or the final answer composed from the
intermediate answers.

Self-Ask (Press et al., 2023) has the model ask itself follow-up questions, each answered (with
search: by a search engine) before the next is asked, and compose the final answer from those
intermediate answers. Rule: follow-ups from the question itself. 1. When the last intermediate
answer names something the question does not (a bridge), ask about it with the rest of the
question. 2. Else ask about the next named entity of the question (else its next clause).
3. When nothing is left to ask, the final answer is the last intermediate answer. LLM: the ASK
prompt, in the paper's shape (one worked example, `Follow up:` / `Intermediate answer:` lines).
If the reply never parses, no further follow-up is asked and the call is recorded with its error.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from pydantic import BaseModel, Field, field_validator

from caprag.llm.client import StepFailedError, StructuredClient
from caprag.llm.prompt import Prompt
from caprag.schemas import MAX_QUERY_CHARS
from caprag.steps.base import RuleStep, StepResult, fit
from caprag.text import entities, names, terms

ASK = Prompt(
    name="ask",
    version="ask-v2",
    system=(
        "Answer the question by asking yourself simple follow-up questions, one at a time, as "
        "in the example. Each follow-up is answered by a search before the next is asked. Give "
        "the next follow-up in 'follow_up' and leave 'final_answer' empty; when the "
        "intermediate answers are enough, leave 'follow_up' empty and give the final answer, "
        "composed from them, in 'final_answer'.\n\n"
        "Example:\n"
        "Question: Where was the architect of Alder Lodge born?\n"
        "Are follow up questions needed here: Yes.\n"
        "Follow up: Who was the architect of Alder Lodge?\n"
        "Intermediate answer: Ruth Weiss.\n"
        "Follow up: Where was Ruth Weiss born?\n"
        "Intermediate answer: Graz.\n"
        "So the final answer is: Graz."
    ),
    user="Question: {question}\nAre follow up questions needed here: Yes.\n{transcript}",
)

MAX_ANSWER_CHARS = 1000
INTERMEDIATE = re.compile(r"\s*\[[^\]]*\]")
"""The passage ids a generated answer cites ('... [book/passage]'), cut from what is asked."""


class SelfAskTurn(BaseModel):
    """The next follow-up question, or (when none is needed) the final answer."""

    follow_up: str = Field(
        default="",
        max_length=MAX_QUERY_CHARS,
        description="The next follow-up question; empty when no more is needed.",
    )
    final_answer: str = Field(
        default="",
        max_length=MAX_ANSWER_CHARS,
        description="The final answer composed from the intermediate answers; empty while a "
        "follow-up is asked.",
    )

    @field_validator("follow_up", "final_answer")
    @classmethod
    def _stripped(cls, value: str) -> str:
        return value.strip()


def transcript(asked: Sequence[tuple[str, str]]) -> str:
    """Follow-ups and their intermediate answers, as the paper's prompt writes them (one that
    found nothing, or whose reply was unusable: '(no answer)')."""
    return "".join(f"Follow up: {q}\nIntermediate answer: {a or '(no answer)'}\n" for q, a in asked)


def prompt_values(question: str, asked: Sequence[tuple[str, str]]) -> dict[str, str]:
    """The ASK prompt's arguments."""
    return {"question": question, "transcript": transcript(asked)}


def subjects(question: str) -> list[str]:
    """What a question is about, in order: its named entities, else its clauses."""
    found = list(dict.fromkeys([*names(question), *entities(question)]))
    found = [s for s in found if s.lower() != question.strip().rstrip("?").lower()]
    if found:
        return found
    clauses = [c.strip(" ,?") for c in re.split(r",|\band\b|\bwhich\b|\bwho\b", question)]
    clauses = [c for c in clauses if terms(c)]
    return clauses if len(clauses) > 1 else []


def next_turn(question: str, asked: Sequence[tuple[str, str]]) -> SelfAskTurn:
    """The rule's next follow-up, or its final answer (see the module)."""
    done = {q.lower() for q, _ in asked}
    if asked:
        last_question, last_answer = asked[-1]
        known = (question + " " + " ".join(q for q, _ in asked)).lower()
        bridges = [n for n in names(clean(last_answer)) if n.lower() not in known]
        if bridges:
            rest = [t for t in dict.fromkeys(terms(question)) if t not in terms(last_question)]
            follow = fit(" ".join([bridges[0], *rest]), MAX_QUERY_CHARS, "the follow-up")
            if follow.lower() not in done:
                return SelfAskTurn(follow_up=follow)
    for subject in subjects(question):
        follow = fit(subject, MAX_QUERY_CHARS, "the follow-up")
        if follow.lower() not in done:
            return SelfAskTurn(follow_up=follow)
    final = clean(asked[-1][1]) if asked else ""
    return SelfAskTurn(final_answer=fit(final, MAX_ANSWER_CHARS, "the final answer"))


def clean(answer: str) -> str:
    """An intermediate answer without the passage ids it cites."""
    return INTERMEDIATE.sub("", answer).strip()


class RuleAsker(RuleStep):
    """Follow-ups from the question's entities and the bridges its answers name (`next_turn`)."""

    async def __call__(
        self, question: str, asked: Sequence[tuple[str, str]]
    ) -> StepResult[SelfAskTurn]:
        t0 = time.perf_counter()
        turn = next_turn(question, asked)
        values = prompt_values(question, asked)
        return self.costed("ask", ASK, turn, turn.model_dump_json(), t0, **values)


class LLMAsker:
    """The model's next follow-up or final answer."""

    kind = "llm"

    def __init__(self, client: StructuredClient) -> None:
        self.client = client
        self.model = client.model

    async def __call__(
        self, question: str, asked: Sequence[tuple[str, str]]
    ) -> StepResult[SelfAskTurn]:
        values = prompt_values(question, asked)
        try:
            turn, usage = await self.client.structured("ask", ASK, SelfAskTurn, **values)
        except StepFailedError as failed:
            return StepResult(value=SelfAskTurn(), usage=failed.usage)
        return StepResult(value=turn, usage=usage)
