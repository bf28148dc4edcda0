"""One interface for every LLM backend: narrow calls, each returning its value and its usage."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from caprag.schemas import (
    CallUsage,
    ConfidenceAssessment,
    Document,
    GeneratedAnswer,
    QueryClass,
    SufficiencyDecision,
)

T = TypeVar("T")
History = Sequence[tuple[str, str]]


@dataclass(frozen=True)
class LLMResult(Generic[T]):
    """A call's parsed value and what it cost."""

    value: T
    usage: CallUsage


class LLM(ABC):
    """The pipeline's LLM steps; strategies receive an instance and never build one."""

    backend: str
    model: str

    @abstractmethod
    async def expand(self, question: str, n: int) -> LLMResult[list[str]]:
        """Break a question into at most n sub-questions (the original is not included)."""

    @abstractmethod
    async def analyze(
        self, question: str, documents: Sequence[Document], searched: Sequence[str]
    ) -> LLMResult[SufficiencyDecision]:
        """Decide whether the documents suffice and which targeted queries to run next."""

    @abstractmethod
    async def generate(
        self, question: str, documents: Sequence[Document], history: History = ()
    ) -> LLMResult[GeneratedAnswer]:
        """Answer from the documents only, naming the passages used."""

    @abstractmethod
    async def rewrite(self, question: str, history: History) -> LLMResult[str]:
        """Turn a follow-up into a standalone question using the conversation history."""

    @abstractmethod
    async def classify(self, question: str) -> LLMResult[QueryClass]:
        """Sort the question into factual, operational, decision or strategic."""

    @abstractmethod
    async def assess(
        self, question: str, documents: Sequence[Document]
    ) -> LLMResult[ConfidenceAssessment]:
        """Rate 0-1 how fully the documents answer the question, and name what is missing."""


def format_passages(documents: Sequence[Document]) -> str:
    """Passages as the prompts show them: id, citation, text."""
    return "\n\n".join(f"[{d.passage_id}] {d.citation()}\n{d.text}" for d in documents)


def format_history(history: History) -> str:
    """Question/answer pairs as prompt text."""
    return "\n".join(f"User: {q}\nAssistant: {a}" for q, a in history)
