"""Data exchanged between the pipeline's steps: documents, questions, answers, decisions, traces."""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_QUERIES = 8
MAX_QUERY_CHARS = 300


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


class Questions(BaseModel):
    """Sub-questions produced by query expansion (the original is added by the strategy)."""

    questions: list[str] = Field(max_length=MAX_QUERIES)

    @field_validator("questions")
    @classmethod
    def _bounded(cls, value: list[str]) -> list[str]:
        return [q.strip()[:MAX_QUERY_CHARS] for q in value if q.strip()]


class SufficiencyDecision(BaseModel):
    """Whether the gathered passages answer the question, and what to search next if not."""

    sufficient: bool = Field(
        description="True when the passages answer every part of the question."
    )
    new_queries: list[str] = Field(
        default_factory=list,
        max_length=MAX_QUERIES,
        description="Targeted searches for unresolved cross-references or missing parts.",
    )
    reasoning: str = Field(default="", max_length=2000, description="One or two sentences why.")

    @field_validator("new_queries")
    @classmethod
    def _bounded(cls, value: list[str]) -> list[str]:
        for query in value:
            if len(query) > MAX_QUERY_CHARS:
                raise ValueError(f"a query is longer than {MAX_QUERY_CHARS} characters")
        return [q.strip() for q in value if q.strip()]


QueryType = Literal["factual", "operational", "decision", "strategic"]


class QueryClass(BaseModel):
    """The kind of question: it sets the depth retrieval starts at and the confidence it needs."""

    query_type: QueryType = Field(
        description="factual (one fact), operational (a procedure), decision (choose or judge "
        "whether something is allowed), strategic (plan or combine several rules)."
    )
    reasoning: str = Field(default="", max_length=1000, description="One sentence why.")


class ConfidenceAssessment(BaseModel):
    """How fully the gathered passages answer the question (0-1), and what they lack."""

    confidence: float = Field(
        ge=0.0, le=1.0, description="0.0 (nothing useful) to 1.0 (everything needed is there)."
    )
    reasoning: str = Field(default="", max_length=2000, description="One or two sentences why.")
    missing_info: list[str] = Field(
        default_factory=list,
        max_length=MAX_QUERIES,
        description="Facts or cross-referenced rules the passages do not contain.",
    )


class GeneratedAnswer(BaseModel):
    """What the generator returns: the answer text and the passage ids it relied on."""

    answer: str = Field(max_length=4000)
    source_ids: list[str] = Field(default_factory=list, max_length=20)


class Source(BaseModel):
    """A cited passage: book, section and page."""

    passage_id: str
    book_id: str
    book_title: str = ""
    section: str = ""
    page: int = 0


class AnswerWithSources(BaseModel):
    """The final answer and the passages it cites."""

    answer: str
    sources: list[Source] = Field(default_factory=list)


class CallUsage(BaseModel):
    """Tokens, cost and time of one LLM call."""

    step: str = Field(
        description="Which pipeline step made the call (expand, analyze, generate...)."
    )
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    counted: Literal["reported", "tokenizer"] = "tokenizer"
    prompt_version: str = ""
    cached: bool = Field(
        default=False,
        description="Answered from the response cache: tokens and cost are the original call's, "
        "but nothing was sent or spent this time.",
    )


class RetrievedRef(BaseModel):
    """A document as it appeared in one hop of the trace."""

    passage_id: str
    book_id: str
    page: int
    score: float
    new: bool = Field(description="False when an earlier hop already returned it.")


class HopTrace(BaseModel):
    """What one hop of retrieval did."""

    hop: int
    queries: list[str]
    documents: list[RetrievedRef] = Field(default_factory=list)
    new_documents: int = 0
    duplicate_documents: int = 0
    decision: SufficiencyDecision | None = None
    usage: list[CallUsage] = Field(default_factory=list)
    latency_s: float = 0.0
    # Adaptive depth only (None for the other strategies): one hop is one iteration.
    depth: int | None = Field(default=None, description="Depth level searched (1, 2, 3).")
    chunks: int | None = Field(default=None, description="Passages in the context after the hop.")
    context_tokens: int | None = Field(default=None, description="Tokens of those passages.")
    confidence: float | None = Field(default=None, description="Confidence after the hop, 0-1.")
    confidence_signals: dict[str, float] | None = Field(
        default=None, description="Heuristic parts: relevance, recency, diversity, completeness."
    )
    missing_info: list[str] | None = Field(default=None, description="What the context lacks.")
    threshold: float | None = Field(default=None, description="Confidence the query type needs.")
    query_type: str | None = Field(default=None, description="factual/operational/decision/...")
    adaptive_decision: str | None = Field(
        default=None,
        description="increase_depth, sufficient, forced_depth or budget_exhausted:<budget>.",
    )
    warning: str | None = Field(default=None, description="Stopped below the threshold: why.")
    hint: str | None = Field(default=None, description="Forced depth below threshold: advice.")

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens spent in this hop."""
        return sum(u.prompt_tokens for u in self.usage)

    @property
    def completion_tokens(self) -> int:
        """Completion tokens spent in this hop."""
        return sum(u.completion_tokens for u in self.usage)

    @property
    def cost_usd(self) -> float:
        """Cost of this hop's LLM calls."""
        return sum(u.cost_usd for u in self.usage)
