"""Prompts as named, versioned message templates, rendered whole or not at all."""

from __future__ import annotations

import functools
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from caprag.errors import CapragError
from caprag.schemas import Document

History = Sequence[tuple[str, str]]


class PromptError(CapragError):
    """A prompt was rendered with a placeholder left unfilled or an argument it does not use."""


@dataclass(frozen=True)
class Prompt:
    """A system + user message pair with {placeholders} in either, and a version to log."""

    name: str
    version: str
    system: str
    user: str

    @functools.cached_property
    def fields(self) -> frozenset[str]:
        """Every placeholder of both messages."""
        parsed = [*string.Formatter().parse(self.system), *string.Formatter().parse(self.user)]
        return frozenset(name for _text, name, _spec, _conv in parsed if name is not None)

    def _check(self, values: Mapping[str, str]) -> None:
        missing = sorted(self.fields - set(values))
        unused = sorted(set(values) - self.fields)
        if missing or unused:
            raise PromptError(
                f"prompt {self.version}: "
                + "; ".join(
                    part
                    for part in (
                        f"no value for {{{', '.join(missing)}}}" if missing else "",
                        f"arguments it does not use: {', '.join(unused)}" if unused else "",
                    )
                    if part
                )
            )

    def render(self, **values: str) -> list[BaseMessage]:
        """Both messages with every placeholder filled: the messages exactly as sent."""
        self._check(values)
        return [
            SystemMessage(self.system.format(**values)),
            HumanMessage(self.user.format(**values)),
        ]

    def text(self, **values: str) -> str:
        """The rendered prompt as one string (for token counting)."""
        system, user = self.render(**values)
        return f"{system.content}\n\n{user.content}"


def format_passages(documents: Sequence[Document]) -> str:
    """Passages as the prompts show them: id, citation, text."""
    return "\n\n".join(f"[{d.passage_id}] {d.citation()}\n{d.text}" for d in documents)


def format_history(history: History) -> str:
    """Question/answer pairs as prompt text."""
    return "\n".join(f"User: {q}\nAssistant: {a}" for q, a in history)


def as_sent(messages: Sequence[BaseMessage]) -> list[dict[str, str]]:
    """Messages as role/content pairs, the way the chat-completions protocol sends them."""
    roles = {"system": "system", "human": "user", "ai": "assistant"}
    return [{"role": roles.get(m.type, m.type), "content": str(m.content)} for m in messages]
