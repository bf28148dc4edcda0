"""Step `reason` (IRCoT): the next sentence of a chain of thought over the passages read so far.

IRCoT (Trivedi et al., 2023) interleaves retrieval with a chain of thought: each new reasoning
sentence is the next search query, until a sentence gives the answer. Rule: not a model's
thought but the sentence of the read passages most relevant to what the question still lacks
(`open_terms`: its terms no earlier sentence covered, and the names the chain brought in that
only one sentence speaks of, the bridges still to follow; ties: the sentence bringing more new
terms, then passage order), led by its passage's title; the chain answers when nothing is lacking
after a sentence, and stops when no sentence adds anything lacking. LLM: the REASON prompt, in
the paper's shape (titled passages, one worked example, `Q:` / `A:` with the reasoning so far).
If the reply never parses, the chain stops (the strategy hands on what it has) and the call is
recorded with its error.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from pydantic import BaseModel, Field, field_validator

from caprag.llm.client import StepFailedError, StructuredClient
from caprag.llm.prompt import Prompt
from caprag.schemas import MAX_QUERY_CHARS, Document
from caprag.steps.base import RuleStep, StepResult, fit
from caprag.text import names, sentences, terms

REASON = Prompt(
    name="reason",
    version="reason-v1",
    system=(
        "Answer the question by reasoning one step at a time over the passages, as in the "
        "example. Give only the next sentence of the reasoning in 'sentence': one fact from the "
        "passages that brings the answer closer, not a repeat of an earlier sentence. When the "
        "reasoning reaches the answer, end that sentence with 'So the answer is: <answer>.' and "
        "put the answer in 'answer'; otherwise leave 'answer' empty.\n\n"
        "Example:\n"
        "Title: Alder Lodge\nAlder Lodge is a hotel designed by the architect Ruth Weiss.\n\n"
        "Title: Ruth Weiss\nRuth Weiss was an architect born in Graz.\n\n"
        "Q: Where was the architect of Alder Lodge born?\n"
        "A: Alder Lodge was designed by Ruth Weiss. Ruth Weiss was born in Graz. So the answer "
        "is: Graz."
    ),
    user="{passages}\n\nQ: {question}\nA: {reasoning}",
)

MAX_SENTENCE_CHARS = MAX_QUERY_CHARS
"""A reasoning sentence is the next search query: as long as a query may be."""
MAX_ANSWER_CHARS = 500


class Thought(BaseModel):
    """The next sentence of the reasoning, and the answer when that sentence reaches it."""

    sentence: str = Field(
        max_length=MAX_SENTENCE_CHARS,
        description="The next reasoning sentence (empty: nothing left to add).",
    )
    answer: str = Field(
        default="",
        max_length=MAX_ANSWER_CHARS,
        description="The answer, when this sentence reaches it; else empty.",
    )

    @field_validator("sentence", "answer")
    @classmethod
    def _stripped(cls, value: str) -> str:
        return value.strip()


def format_titled(documents: Sequence[Document]) -> str:
    """Passages as IRCoT shows them: a title line, then the text."""
    return "\n\n".join(f"Title: {d.section}\n{d.text}" for d in documents)


def prompt_values(
    question: str, documents: Sequence[Document], reasoning: Sequence[str]
) -> dict[str, str]:
    """The REASON prompt's arguments."""
    return {
        "passages": format_titled(documents),
        "question": question,
        "reasoning": " ".join(reasoning),
    }


def open_terms(question: str, reasoning: Sequence[str]) -> set[str]:
    """What the question still lacks: its terms no sentence covered yet, and the terms of every
    name the chain brought in (not the question's own) that only one sentence speaks of (a
    bridge still to follow)."""
    wanted = set(terms(question))
    said = [set(terms(sentence)) for sentence in reasoning]
    lacking = wanted - set().union(*said)
    for name in dict.fromkeys(n for sentence in reasoning for n in names(sentence)):
        name_terms = set(terms(name))
        mentions = sum(name_terms <= words for words in said)
        if name_terms and not name_terms <= wanted and mentions < 2:
            lacking |= name_terms
    return lacking


def titled(sentence: str, title: str) -> str:
    """The sentence, led by its passage's title when it does not name it (a thought says what
    it is about: it is the next query)."""
    if set(terms(title)) <= set(terms(sentence)):
        return sentence
    return f"{title}: {sentence}"


def next_thought(question: str, documents: Sequence[Document], reasoning: Sequence[str]) -> Thought:
    """The read sentence that covers most of what the question still lacks (see the module);
    it answers when nothing is lacking after it."""
    lacking = open_terms(question, reasoning)
    covered = set(terms(" ".join([question, *reasoning])))
    said = set(reasoning)
    best: tuple[int, int] = (0, 0)
    chosen = ""
    for doc in documents:
        for sentence in sentences(doc.text):
            thought = titled(sentence, doc.section)
            if thought in said:
                continue
            words = set(terms(thought))
            score = (len(lacking & words), len(words - covered))
            if score[0] > 0 and score > best:
                best, chosen = score, thought
    if not chosen:
        return Thought(sentence="")
    chosen = fit(chosen, MAX_SENTENCE_CHARS, "the sentence")
    answered = not lacking - set(terms(chosen))  # the names it brings in are the answer
    return Thought(
        sentence=chosen, answer=fit(chosen, MAX_ANSWER_CHARS, "the answer") if answered else ""
    )


class RuleReasoner(RuleStep):
    """The most relevant unread sentence as the next thought (`next_thought`)."""

    async def __call__(
        self, question: str, documents: Sequence[Document], reasoning: Sequence[str]
    ) -> StepResult[Thought]:
        t0 = time.perf_counter()
        thought = next_thought(question, documents, reasoning)
        values = prompt_values(question, documents, reasoning)
        return self.costed("reason", REASON, thought, thought.model_dump_json(), t0, **values)


class LLMReasoner:
    """The model's next reasoning sentence."""

    kind = "llm"

    def __init__(self, client: StructuredClient) -> None:
        self.client = client
        self.model = client.model

    async def __call__(
        self, question: str, documents: Sequence[Document], reasoning: Sequence[str]
    ) -> StepResult[Thought]:
        values = prompt_values(question, documents, reasoning)
        try:
            thought, usage = await self.client.structured("reason", REASON, Thought, **values)
        except StepFailedError as failed:
            return StepResult(value=Thought(sentence=""), usage=failed.usage)
        return StepResult(value=thought, usage=usage)
