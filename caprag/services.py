"""Asking questions: build the pipeline from settings, run one turn, report what it cost."""

from __future__ import annotations

import asyncio
import functools
import time
import unicodedata
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from langchain_core.messages import AnyMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from pydantic import BaseModel, Field

from caprag.checkpoint import Retention, close_checkpointer, make_checkpointer, open_checkpointer
from caprag.config import ROLE_NAMES, Settings, load_settings
from caprag.errors import EmptyQuestionError
from caprag.graph import HISTORY_PAIRS, build_graph
from caprag.llm import StructuredClient, build_openai_client
from caprag.schemas import CallUsage, Document, Source
from caprag.state import GraphState
from caprag.steps import Steps, build_steps
from caprag.strategies import STRATEGIES, RetrievalStrategy, Retriever
from caprag.trace import HopTrace

MAX_QUESTION_CHARS = 4000

STRATEGY_OPTIONS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "multi-hop": lambda s: {"max_hops": s.max_hops, "expand_first_hop": s.expand_first_hop},
}


class AskResult(BaseModel):
    """One answered turn, with everything a caller shows or logs."""

    question: str
    main_question: str
    answer: str
    sources: list[Source]
    thread_id: str
    strategy: str
    hops: list[HopTrace]
    context: list[Document] = Field(description="The passages handed to generation.")
    usage: list[CallUsage] = Field(description="Every LLM call of the turn, in order.")
    timings: dict[str, float] = Field(default_factory=dict, description="Seconds per node.")
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    latency_s: float

    @property
    def answer_error(self) -> str | None:
        """Why there is no answer, when the generator's reply could not be used."""
        failed = [u for u in self.usage if u.step == "generate" and u.error]
        return f"generate: {failed[-1].error}" if failed else None

    @property
    def hop_count(self) -> int:
        """How many retrieval hops the turn took."""
        return len(self.hops)


INVISIBLE_CATEGORIES = {"Cc", "Cf", "Cn", "Co", "Cs", "Mn", "Me", "Zs", "Zl", "Zp"}
"""Controls, format characters (zero-width space and joiners, BOM), unassigned and private code
points, lone combining marks and separators: nothing a reader sees as a question."""

BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800\u180e")
"""Letters and symbols that render as blank (Hangul fillers, the blank braille pattern)."""


def _invisible(char: str) -> bool:
    return char in BLANK_LETTERS or unicodedata.category(char) in INVISIBLE_CATEGORIES


def validate_question(question: str) -> str:
    """Reject empty (or only invisible characters) and over-long questions before any work is
    done; return the question without surrounding blanks. The API and the CLI both use it."""
    text = (question or "").strip()
    start, end = 0, len(text)
    while start < end and _invisible(text[start]):
        start += 1
    while end > start and _invisible(text[end - 1]):
        end -= 1
    text = text[start:end]
    if not text:
        raise EmptyQuestionError("the question is empty")
    if len(text) > MAX_QUESTION_CHARS:
        raise EmptyQuestionError(
            f"the question has {len(text)} characters; the limit is {MAX_QUESTION_CHARS}"
        )
    return text


def _client(settings: Settings, model: str) -> StructuredClient:
    return build_openai_client(
        model,
        api_key=settings.openai_api_key,
        base_url=settings.openai_base_url,
        structured_method=settings.structured_output,
        timeout_s=settings.llm_timeout_s,
    )


def steps_from_settings(settings: Settings) -> Steps:
    """The steps the settings choose: CAPRAG_LLM=openai gives them a client, and each
    CAPRAG_<ROLE> (expander, analyzer, ...) picks rule or llm for its step (auto: llm when there
    is a client)."""
    client = _client(settings, settings.model) if settings.llm == "openai" else None
    rewrite = settings.rewrite_model
    rewrite_client = (
        _client(settings, rewrite)
        if client is not None and rewrite and rewrite != settings.model
        else None
    )
    return build_steps(
        client,
        rewrite_client=rewrite_client,
        price_model=settings.price_model,
        choices={role: getattr(settings, role) for role in ROLE_NAMES},
    )


def build_strategy(
    name: str, retriever: Retriever, steps: Steps, settings: Settings
) -> RetrievalStrategy:
    """The strategy the name selects, with its dependencies passed in."""
    options = STRATEGY_OPTIONS.get(name, lambda _s: {})(settings)
    return STRATEGIES[name](retriever, steps, k=settings.k, **options)


class _Holders:
    """How many turns hold or wait for a thread's lock."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.count = 0


class ThreadLocks:
    """One asyncio lock per conversation thread, so turns of one thread run one after another
    (each reads the memory the previous one wrote); a lock is dropped as soon as no turn holds
    or awaits it, so idle threads cost nothing."""

    def __init__(self) -> None:
        self._held: dict[str, _Holders] = {}

    def __len__(self) -> int:
        return len(self._held)

    @asynccontextmanager
    async def hold(self, thread_id: str) -> AsyncIterator[None]:
        """Run the block while holding the thread's lock."""
        holders = self._held.setdefault(thread_id, _Holders())
        holders.count += 1
        try:
            async with holders.lock:
                yield
        finally:
            holders.count -= 1
            if holders.count == 0:
                del self._held[thread_id]


class Pipeline:
    """A compiled graph and the pieces it was built from.

    Turns of one thread are serialised (concurrent ones wait their turn), so every answered turn
    is in the conversation's memory. The checkpointer is given, opened by `open_saver` on first
    use (or by `open()`, at start-up), or a bounded in-memory one.
    """

    def __init__(
        self,
        strategy: RetrievalStrategy,
        steps: Steps,
        graph: Any | None = None,
        *,
        checkpointer: BaseCheckpointSaver[Any] | None = None,
        open_saver: Callable[[], Awaitable[BaseCheckpointSaver[Any]]] | None = None,
        rewrite_follow_ups: bool = True,
        history_window: int = HISTORY_PAIRS,
    ) -> None:
        self.strategy = strategy
        self.steps = steps
        self.rewrite_follow_ups = rewrite_follow_ups
        self.history_window = history_window
        self.locks = ThreadLocks()
        self._open_saver = open_saver
        self._opening = asyncio.Lock()
        self.checkpointer: BaseCheckpointSaver[Any] | None = None
        self.graph: Any | None = graph
        if graph is not None:
            self.checkpointer = getattr(graph, "checkpointer", None) or checkpointer
        elif open_saver is None:
            self._compile(checkpointer or make_checkpointer("memory"))

    def _compile(self, checkpointer: BaseCheckpointSaver[Any]) -> None:
        self.checkpointer = checkpointer
        self.graph = build_graph(
            self.strategy,
            self.steps,
            checkpointer=checkpointer,
            rewrite_follow_ups=self.rewrite_follow_ups,
            history_window=self.history_window,
        )

    async def open(self) -> None:
        """Open the conversation store now (a store that cannot be opened raises ConfigError)."""
        if self.graph is not None:
            return
        async with self._opening:
            if self.graph is None:
                assert self._open_saver is not None
                self._compile(await self._open_saver())

    async def aclose(self) -> None:
        """Release the checkpointer's connection, if it has one (a store opened on demand is
        opened again by the next turn)."""
        if self.checkpointer is not None:
            await close_checkpointer(self.checkpointer)
        if self._open_saver is not None:
            self.graph = self.checkpointer = None

    async def history(self, thread_id: str) -> list[AnyMessage]:
        """The messages the conversation's memory holds (empty for a thread never seen)."""
        await self.open()
        assert self.checkpointer is not None
        saved = await self.checkpointer.aget_tuple({"configurable": {"thread_id": thread_id}})
        if saved is None:
            return []
        return list(saved.checkpoint["channel_values"].get("messages", []))

    async def forget(self, thread_id: str) -> None:
        """Delete a conversation's memory (an evaluation case's thread once its last turn ends)."""
        await self.open()
        assert self.checkpointer is not None
        await self.checkpointer.adelete_thread(thread_id)

    async def ask(
        self, question: str, thread_id: str | None = None, power: int | None = None
    ) -> AskResult:
        """Answer one turn on a thread (a new thread when none is given); `power` forces the
        retrieval depth of strategies that have one (adaptive) for this turn only. A turn waits
        for any other turn of the same thread to finish first."""
        text = validate_question(question)
        thread = thread_id or str(uuid.uuid4())
        await self.open()
        graph = self.graph
        assert graph is not None
        start = time.perf_counter()
        async with self.locks.hold(thread):
            out = await graph.ainvoke(
                {"question": text, "messages": [HumanMessage(text)], "power": power},
                {"configurable": {"thread_id": thread}},
            )
        state = GraphState(**out)
        usage = [u for u in (state.rewrite_usage,) if u]
        usage += [u for hop in state.hops for u in hop.usage]
        usage += [u for u in (state.generate_usage,) if u]
        assert state.answer is not None
        return AskResult(
            question=text,
            main_question=state.main_question,
            answer=state.answer.answer,
            sources=state.answer.sources,
            thread_id=thread,
            strategy=self.strategy.name,
            hops=state.hops,
            context=state.context,
            usage=usage,
            timings=state.timings,
            prompt_tokens=sum(u.prompt_tokens for u in usage),
            completion_tokens=sum(u.completion_tokens for u in usage),
            cost_usd=sum(u.cost_usd for u in usage),
            latency_s=time.perf_counter() - start,
        )


def retention_from_settings(settings: Settings) -> Retention:
    """How long the settings keep conversations."""
    return Retention(
        memory_ttl_s=settings.memory_ttl_s,
        memory_max_threads=settings.memory_max_threads,
        sqlite_ttl_days=settings.sqlite_ttl_days,
        prune_interval_s=settings.prune_interval_s,
    )


def build_pipeline(settings: Settings | None = None, *, ingest: bool = True) -> Pipeline:
    """Open (and bring up to date) the index CAPRAG_RETRIEVER chooses, then build LLM, strategy
    and graph from settings. The conversation store is opened by `Pipeline.open()` (or the first
    turn), in the event loop that will use it."""
    from caprag.ingest import ingest_path, open_retriever

    settings = settings or load_settings()
    steps = steps_from_settings(settings)
    if ingest:
        ingest_path(settings.corpus, settings)
    index = open_retriever(settings)
    strategy = build_strategy(settings.retrieval_strategy, index, steps, settings)
    opener = functools.partial(
        open_checkpointer, settings.checkpointer, retention_from_settings(settings)
    )
    return Pipeline(strategy, steps, open_saver=opener)
