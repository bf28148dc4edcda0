"""The graph state: one turn's question, what retrieval found, the answer, and what it cost."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages

from caprag.schemas import AnswerWithSources, CallUsage, Document, Question
from caprag.trace import HopTrace


def merge_timings(old: dict[str, float], new: dict[str, float]) -> dict[str, float]:
    """Each node reports its own duration; later turns overwrite the same keys."""
    return {**old, **new}


@dataclass(kw_only=True)
class GraphState:
    """State of one conversation thread; only `messages` accumulates across turns."""

    messages: Annotated[list[AnyMessage], add_messages] = field(default_factory=list)
    """The conversation: user questions and assistant answers; each turn trims it to the history
    window (the last 20 pairs, and a question still open), so a thread's memory stays bounded."""

    question: str = ""
    """The question as the user asked it this turn."""

    main_question: str = ""
    """The standalone form of the question that retrieval searches with."""

    power: int | None = None
    """Retrieval depth forced for this turn (1-3) by the caller; None lets the strategy decide."""

    rewrite_usage: CallUsage | None = None
    """Cost of the rewrite call, when history made one necessary."""

    questions: list[Question] = field(default_factory=list)
    """Every query the strategy issued this turn, each with the documents it returned."""

    context: list[Document] = field(default_factory=list)
    """The passages handed to generation: hops merged, ranked and cut to the budget k."""

    hops: list[HopTrace] = field(default_factory=list)
    """Hop-by-hop trace of this turn's retrieval."""

    answer: AnswerWithSources | None = None
    """This turn's answer and its sources."""

    generate_usage: CallUsage | None = None
    """Cost of the generation call."""

    timings: Annotated[dict[str, float], merge_timings] = field(default_factory=dict)
    """Seconds each node took this turn (rewrite, retrieve, generate)."""
