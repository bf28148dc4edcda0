"""Step `rewrite`: turn a follow-up into a standalone question from the conversation history.

Rule: resolve a pronoun, or an elliptical question, to the rule the conversation is about. LLM: the
REWRITE prompt, as plain text with the (possibly cheaper) rewrite model; an empty reply keeps the
question as asked (noted on the call).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from caprag.llm.client import StructuredClient
from caprag.llm.prompt import History, Prompt, format_history
from caprag.steps.base import RuleStep, StepResult
from caprag.text import entities

QUESTION_WORDS = frozenset({"what's", "it's", "i'm", "i've", "how's", "where's", "who's"})
PRONOUNS = re.compile(r"\b(it|its|it's|they|them|their|he|she|him|her)\b", re.I)

REWRITE = Prompt(
    name="rewrite",
    version="rewrite-v1",
    system=(
        "Given the conversation history and a follow-up question, rewrite the question to be a "
        "standalone question that captures all necessary context. If the question is already "
        "standalone, return it unchanged. Return ONLY the rewritten question, nothing else."
    ),
    user="Conversation history:\n{history}\n\nFollow-up question: {question}",
)


def conversation_topic(questions: Sequence[str]) -> str:
    """The rule the conversation is about: named by its first question that names one, a
    multi-word name (a gift, spell or creature) before a single capitalised word."""
    for question in questions:
        names = [e for e in entities(question) if len(e) > 2 and e.lower() not in QUESTION_WORDS]
        if names:
            longer = [n for n in names if " " in n or "-" in n]
            return (longer or names)[0]
    return ""


def rewrite_with_history(question: str, history: History) -> str:
    """Deterministic rewrite: resolve a pronoun or an elliptical question to the last named rule."""
    if not history:
        return question
    topic = conversation_topic([q for q, _a in history])
    if not topic or topic.lower() in question.lower():
        return question
    if PRONOUNS.search(question):
        return PRONOUNS.sub(topic, question, count=1)
    if entities(question):
        return question
    trimmed = question.rstrip(" ?")
    trimmed = re.sub(r"^(and|also|so|what about)\s+", "", trimmed, flags=re.I)
    return f"{trimmed} for {topic}?"


class RuleRewriter(RuleStep):
    """The pronoun and topic rule (`rewrite_with_history`)."""

    async def __call__(self, question: str, history: History) -> StepResult[str]:
        t0 = time.perf_counter()
        standalone = rewrite_with_history(question, history)
        return self.costed(
            "rewrite",
            REWRITE,
            standalone,
            standalone,
            t0,
            question=question,
            history=format_history(history),
        )


class LLMRewriter:
    """The model's standalone question."""

    kind = "llm"

    def __init__(self, client: StructuredClient) -> None:
        self.client = client
        self.model = client.model

    async def __call__(self, question: str, history: History) -> StepResult[str]:
        text, usage = await self.client.text(
            "rewrite", REWRITE, question=question, history=format_history(history)
        )
        if not text:
            usage = usage.model_copy(update={"notes": ["empty reply: the question kept as asked"]})
        return StepResult(value=text or question, usage=usage)
