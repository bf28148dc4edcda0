"""A thread's conversation as its memory holds it: each turn's question, the standalone question
it was searched as, the answer and its sources.

The answer message of every turn carries what it was searched as and its sources (in
`additional_kwargs`, which the rewrite and generate steps never read), so a page can show the
whole thread again from the checkpointer alone, e.g. after a reload.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from pydantic import BaseModel, Field, ValidationError

from caprag.schemas import Source

KEY = "caprag_turn"
"""Where an answer message keeps its turn's record."""


class Turn(BaseModel):
    """One turn of a thread, as kept in its memory."""

    question: str
    main_question: str = Field(description="The standalone question retrieval searched with.")
    answer: str | None = Field(description="None: the question is still open (no answer kept).")
    sources: list[Source] = Field(default_factory=list)


def turn_record(main_question: str, sources: Sequence[Source]) -> dict[str, Any]:
    """What an answer message keeps of its turn (plain data: the checkpointer stores it as is)."""
    return {KEY: {"main_question": main_question, "sources": [s.model_dump() for s in sources]}}


def turns(messages: Sequence[AnyMessage]) -> list[Turn]:
    """The turns of a conversation's messages, oldest first; a question without an answer (its
    turn failed or was cut by the time limit) is an open turn."""
    found: list[Turn] = []
    for message in messages:
        if isinstance(message, HumanMessage):
            text = str(message.content)
            found.append(Turn(question=text, main_question=text, answer=None))
        elif isinstance(message, AIMessage) and found and found[-1].answer is None:
            last = found[-1]
            last.answer = str(message.content)
            kept = message.additional_kwargs.get(KEY) or {}
            last.main_question = str(kept.get("main_question") or last.question)
            try:
                last.sources = [Source.model_validate(s) for s in kept.get("sources") or []]
            except ValidationError:
                last.sources = []  # a record from another version: the answer is still shown
    return found
