"""Test doubles: a scripted chat model, an in-memory retriever, steps that hang or lag, a manual
clock, and `serve` for the OpenAI-protocol stub (experiments.support.openai_stub) in a fixture."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, PrivateAttr

from caprag.errors import StructuredOutputError
from caprag.llm import StructuredClient, build_openai_client
from caprag.retrieval.books import load_books
from caprag.retrieval.store import (
    PAGE_BOOST,
    RestrictedIndex,
    find_book,
    passage_to_document,
    split_citation,
)
from caprag.schemas import Document
from caprag.steps import Steps, build_steps, rule_steps
from caprag.steps.analyze import RuleAnalyzer
from caprag.steps.generate import RuleGenerator
from experiments.support.openai_stub import AUTO, Reply, StubServer
from tests.conftest import FIXTURE_BOOKS

FLURRY = Document(
    passage_id="fighting/flurry",
    book_id="fighting",
    book_short="Fighting",
    section="Flurry",
    page=4,
    text="Second attack at -4, modified by Old Soldier (Gifts, p. 7).",
)
"""A passage with an unresolved cross-reference, for step and prompt tests."""


class ScriptedChatModel(BaseChatModel):
    """Replies in order, or by the first key found in the prompt. A dict/model reply becomes a
    tool call named after the bound schema, so `with_structured_output` parses it for real."""

    replies: list[Any] = []
    by_substring: dict[str, Any] = {}
    repeat_last: bool = False
    _calls: list[list[BaseMessage]] = PrivateAttr(default_factory=list)
    _tool_name: str | None = PrivateAttr(default=None)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    @property
    def calls(self) -> list[list[BaseMessage]]:
        """Every prompt the model received."""
        return self._calls

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:  # type: ignore[override]
        self._tool_name = convert_to_openai_tool(tools[0])["function"]["name"]
        return self

    def _pick(self, prompt: str) -> Any:
        for key, reply in self.by_substring.items():
            if key in prompt:
                return reply
        index = len(self._calls) - 1
        if index < len(self.replies):
            return self.replies[index]
        if self.repeat_last and self.replies:
            return self.replies[-1]
        raise AssertionError(f"ScriptedChatModel has no reply for call {index + 1}: {prompt[:200]}")

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self._calls.append(messages)
        reply = self._pick("\n".join(str(m.content) for m in messages))
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, BaseModel):
            reply = reply.model_dump()
        if isinstance(reply, dict):
            message = AIMessage(
                content="",
                tool_calls=[
                    {
                        "name": self._tool_name or "tool",
                        "args": reply,
                        "id": f"call_{len(self._calls)}",
                    }
                ],
            )
        else:
            message = AIMessage(content=str(reply))
        return ChatResult(generations=[ChatGeneration(message=message)])


def serve(
    script: Sequence[Reply] = (), default: Reply | None = AUTO, **options: Any
) -> Iterator[StubServer]:
    """Run the OpenAI-protocol stub for the duration of a fixture (`yield from serve(...)`)."""
    with StubServer(script, default, **options) as stub:
        yield stub


WORD = re.compile(r"[a-z0-9]+")
STOP_WORDS = frozenset(
    "a an and are as at be by can do does for from has have how i in is it its many much of on "
    "or the their them they this to what when where which who why will with".split()
)


def terms(text: str) -> frozenset[str]:
    """The words of a text that count for overlap: lower case, no stop words, plurals folded."""
    found = set()
    for word in WORD.findall(text.lower()):
        if word in STOP_WORDS:
            continue
        if len(word) > 4 and word.endswith("es") and word[-3] in "sxzh":
            word = word[:-2]
        elif len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        found.add(word)
    return frozenset(found)


class MemoryRetriever:
    """Passages held in memory, ranked by term overlap with the query: deterministic, no encoder,
    no Chroma (DSPy's dummy retriever). It answers what strategies, the pipeline and the harness
    ask of an index: `search` (a '(Short, p. N)' citation narrows to that book and lifts that
    page, as PassageIndex does), `restricted`, `parents`, `books`, `manifest`."""

    def __init__(self, documents: Iterable[Document]) -> None:
        self.documents = list(documents)
        self._terms = [terms(f"{d.section} {d.text}") for d in self.documents]
        order = list(dict.fromkeys(d.book_id for d in self.documents))
        seen: dict[str, int] = {}
        self._spread = []
        """Where each passage goes among equal scores: the first passage of every book, then
        the second ones... (a dense index spreads the passages a query barely touches over the
        books; corpus order would give them all to the first book)."""
        for d in self.documents:
            seen[d.book_id] = seen.get(d.book_id, 0) + 1
            self._spread.append((seen[d.book_id], order.index(d.book_id)))
        self.searches: list[tuple[str, int]] = []
        """Every (query, k) searched, in order."""

    @classmethod
    def from_books(cls, folder: Path = FIXTURE_BOOKS) -> MemoryRetriever:
        """The passages of a folder of rulebooks (parsing is pure and fast)."""
        return cls(passage_to_document(p) for book in load_books(folder) for p in book.passages)

    def search(self, query: str, k: int) -> list[Document]:
        """Top-k passages by the share of the query's words each holds."""
        return self._search(query, k, None)

    def restricted(self, passage_ids: Iterable[str]) -> RestrictedIndex:
        """A retriever over these passages only."""
        return RestrictedIndex(self, passage_ids)

    def _search(self, query: str, k: int, within: Sequence[str] | None) -> list[Document]:
        self.searches.append((query, k))
        text, book_id, page = split_citation(query, self.book_by_short)
        wanted = terms(text or query)
        allowed = None if within is None else set(within)
        scored = []
        for doc, words, spread in zip(self.documents, self._terms, self._spread, strict=True):
            if (allowed is not None and doc.passage_id not in allowed) or (
                book_id and doc.book_id != book_id
            ):
                continue
            score = len(wanted & words) / max(1, len(wanted))
            if page is not None and doc.page == page:
                score += PAGE_BOOST
            scored.append((-score, spread, doc))
        ranked = sorted(scored, key=lambda item: item[:2])[:k]
        return [doc.model_copy(update={"score": round(-score, 6)}) for score, _, doc in ranked]

    def parents(self) -> dict[str, Document]:
        """Every passage by id."""
        return {d.passage_id: d for d in self.documents}

    def books(self) -> dict[str, dict[str, Any]]:
        """Metadata of each book, keyed by book id."""
        found: dict[str, dict[str, Any]] = {}
        for d in self.documents:
            meta = {"book_id": d.book_id, "short": d.book_short, "title": d.book_title}
            found.setdefault(d.book_id, meta)
        return found

    def book_by_short(self, short: str) -> str | None:
        """Book id for a short name used in citations ('Gifts' → 'gifts')."""
        return find_book(self.books(), short)

    def manifest(self) -> dict[str, Any]:
        """Books held: id → a hash of their passages and their metadata (what a row cache keys
        on)."""
        held: dict[str, list[str]] = {}
        for d in self.documents:
            held.setdefault(d.book_id, []).append(d.content_hash)
        return {
            book_id: {
                "hash": hashlib.sha256(" ".join(hashes).encode()).hexdigest()[:16],
                "meta": self.books()[book_id],
            }
            for book_id, hashes in held.items()
        }


def openai_steps(model: str = "gpt-4o-mini", **client: Any) -> Steps:
    """Every step by the model behind an OpenAI-compatible endpoint."""
    return build_steps(build_openai_client(model, **client))


def scripted_steps(chat: BaseChatModel, parse_attempts: int = 3, **choices: str) -> Steps:
    """Every step (or those chosen llm in `choices`) by a scripted chat model through the real
    structured-call client."""
    client = StructuredClient(chat, "scripted", parse_attempts=parse_attempts)
    return build_steps(client, choices=choices)


class HangingAnalyzer(RuleAnalyzer):
    """The rule analyzer, except that questions naming `hang_on` hang and those naming
    `garble_on` get an unparseable reply: for failure-isolation tests."""

    def __init__(self, hang_on: str, garble_on: str) -> None:
        super().__init__()
        self.hang_on = hang_on.lower()
        self.garble_on = garble_on.lower()

    async def __call__(self, question: str, documents: Any, searched: Any, **options: Any) -> Any:
        if self.hang_on in question.lower():
            await asyncio.Event().wait()  # never set: only the question's timeout ends it
        if self.garble_on in question.lower():
            raise StructuredOutputError("SufficiencyDecision", "reply was not JSON: 'Sure!'", 3)
        return await super().__call__(question, documents, searched, **options)


def flaky_steps(hang_on: str = "torch", garble_on: str = "stamina", **_group: Any) -> Steps:
    """The rule steps with a hanging / garbling analyzer (as `llm._target_`)."""
    return dataclasses.replace(rule_steps(), analyze=HangingAnalyzer(hang_on, garble_on))


class StallingGenerator(RuleGenerator):
    """The rule generator, except that once `answers` questions are answered, the later ones
    wait forever while the file `hold` exists: a harness run that stops at a known point, for
    as long as a test needs to kill it (no sleep, no race). Remove the file and a run of the
    same configuration goes through."""

    def __init__(self, answers: int, hold: str) -> None:
        super().__init__()
        self.answers = answers
        self.hold = Path(hold)
        self.answered = 0

    async def __call__(
        self, question: str, documents: Any, history: Any = (), confidence: Any = None
    ) -> Any:
        if self.answered >= self.answers and self.hold.exists():
            await asyncio.Event().wait()
        self.answered += 1
        return await super().__call__(question, documents, history, confidence)


def stalling_steps(answers: int = 3, hold: str = "", **_group: Any) -> Steps:
    """The rule steps with a generator that stalls after `answers` answers while `hold`
    exists (as `llm._target_`)."""
    return dataclasses.replace(rule_steps(), generate=StallingGenerator(answers, hold))


class ManualClock:
    """A clock that moves only when told: budgets tested in scripted steps, never in real time."""

    def __init__(self) -> None:
        self.time = 0.0

    def now(self) -> float:
        return self.time

    def advance(self, seconds: float) -> None:
        self.time += seconds

    async def bounded(self, awaitable: Any, seconds: float) -> Any:
        """Run to the end, then time out if the clock moved past `seconds` meanwhile."""
        start = self.time
        result = await awaitable
        if self.time - start > seconds:
            raise TimeoutError
        return result
