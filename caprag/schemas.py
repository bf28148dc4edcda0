"""Data exchanged between the pipeline's steps: documents, questions, answers, decisions, traces."""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_QUERIES = 8
MAX_QUERY_CHARS = 300
MAX_QUESTION_CHARS = 4000
"""The longest question the API, CLI and chat page take, and the longest search query."""


class Document(BaseModel):
    """A retrieved passage (a parent section) with where it comes from and how it scored."""

    model_config = ConfigDict(frozen=True)

    passage_id: str = Field(description="Stable id '<book_id>/<section-slug>'.")
    book_id: str
    book_short: str = ""
    book_title: str = ""
    section: str = ""
    page: int = 0
    edition: int = 0
    published: str = ""
    text: str
    score: float = 0.0

    @property
    def content_hash(self) -> str:
        """Hash of page content + book: the key for de-duplication across hops."""
        return hashlib.sha256(f"{self.book_id}\x00{self.text}".encode()).hexdigest()[:16]

    def citation(self) -> str:
        """Short human citation: 'Combat, p. 41 — Rapid Strike'."""
        return f"{self.book_short or self.book_id}, p. {self.page} — {self.section}"


class Question(BaseModel):
    """One query the strategy searched with and the documents it returned."""

    text: str
    context: list[Document] = Field(default_factory=list)


class Source(BaseModel):
    """A cited passage: book, section and page."""

    passage_id: str
    book_id: str
    book_title: str = ""
    section: str = ""
    page: int = 0

    @classmethod
    def of(cls, doc: Document) -> Source:
        """A retrieved passage as a source."""
        return cls(
            passage_id=doc.passage_id,
            book_id=doc.book_id,
            book_title=doc.book_title,
            section=doc.section,
            page=doc.page,
        )


class AnswerWithSources(BaseModel):
    """The final answer and the passages it cites."""

    answer: str
    sources: list[Source] = Field(default_factory=list)
    refused: bool = Field(
        default=False,
        description="The generator found no answer in the passages (the answer is the refusal).",
    )


class CallUsage(BaseModel):
    """Tokens, cost and time of one LLM call."""

    step: str = Field(
        description="Which pipeline step made the call (expand, analyze, generate...)."
    )
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = Field(
        default=0.0, description="None: the model is not in the price table (unknown, never 0)."
    )
    latency_s: float = 0.0
    started_at: float | None = Field(
        default=None,
        description="Wall-clock time (Unix seconds) the call started; None where not measured.",
    )
    counted: Literal["reported", "tokenizer"] = "tokenizer"
    prompt_version: str = ""
    cached: bool = Field(
        default=False,
        description="Answered from the response cache: tokens and cost are the original call's, "
        "but nothing was sent or spent this time.",
    )
    messages: list[dict[str, str]] | None = Field(
        default=None,
        description="The messages exactly as sent (role, content); None for a rule step, which "
        "sends nothing.",
    )
    reply: str | None = Field(
        default=None, description="The model's raw reply (text or tool call)."
    )
    attempts: int = Field(default=1, description="Requests made: parse failures are retried.")
    error: str | None = Field(
        default=None,
        description="Why the reply could not be used, when it could not; the step then fell back "
        "as its module documents.",
    )
    notes: list[str] = Field(
        default_factory=list,
        description="What the step changed in the reply to keep its contract (queries cut...).",
    )


class RetrievedRef(BaseModel):
    """A document as it appeared in one hop of the trace."""

    passage_id: str
    book_id: str
    page: int
    score: float
    new: bool = Field(description="False when an earlier hop already returned it.")
    query: int = Field(default=0, description="Which of the hop's queries returned it (index).")
