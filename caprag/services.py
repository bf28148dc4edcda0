"""Asking questions: build the pipeline from settings, run one turn, report what it cost."""

from __future__ import annotations

import asyncio
import contextlib
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

from caprag.checkpoint import (
    Retention,
    close_checkpointer,
    expired,
    make_checkpointer,
    open_checkpointer,
)
from caprag.clock import Clock
from caprag.config import PowerChoice, Settings, load_settings
from caprag.conversation import Turn, turns
from caprag.deadline import (
    CURRENT,
    Deadline,
    RequestTimeoutError,
    timed_retriever,
    timed_steps,
)
from caprag.decision_log import (
    DecisionLog,
    DecisionRecord,
    Feedback,
    PowerSource,
    Round,
    Status,
    now_iso,
)
from caprag.errors import CapragError, EmptyQuestionError
from caprag.graph import HISTORY_PAIRS, build_graph
from caprag.llm import StructuredClient, build_openai_client
from caprag.schemas import CallUsage, Document, Source
from caprag.state import GraphState
from caprag.steps import ROLES, Steps, build_steps
from caprag.strategies import STRATEGIES, RetrievalStrategy, Retriever
from caprag.trace import HopTrace

MAX_QUESTION_CHARS = 4000

DEFAULT_POWER: PowerChoice = 2
"""The design's default: fixed depth 2 when a request chooses neither auto nor a power."""


class PowerError(CapragError, ValueError):
    """A forced depth outside the configured ladder (the API answers 422)."""


class UnknownRequestError(CapragError):
    """Feedback names a request the decision log does not hold (the API answers 404)."""


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
    request_id: str = Field(default="", description="The id feedback on this answer refers to.")
    timed_out: bool = Field(default=False, description="The request's time limit cut a step.")
    stop_reason: str | None = Field(
        default=None,
        description="How retrieval stopped, or timeout:<step> when the time limit cut it.",
    )
    decision_log: DecisionRecord | None = Field(
        default=None, description="The request's rounds and steps, as the decision log keeps them."
    )
    memory_expired: bool = Field(
        default=False,
        description="The thread sat idle past the memory TTL: this turn started it afresh.",
    )

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
        choices={role: getattr(settings, role) for role in ROLES},
    )


def build_strategy(
    name: str, retriever: Retriever, steps: Steps, settings: Settings
) -> RetrievalStrategy:
    """The registered strategy the name selects, with its dependencies passed in and the
    options it takes from the settings (its `served_options`)."""
    cls = STRATEGIES.choose(name)
    return cls(retriever, steps, k=settings.k, **cls.served_options(settings))


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
        timeout_s: float | None = None,
        clock: Clock | None = None,
        decision_log: DecisionLog | None = None,
        default_power: PowerChoice = DEFAULT_POWER,
    ) -> None:
        # Every step and search goes through a wrapper that times it within a served request.
        strategy.steps = timed_steps(strategy.steps)
        strategy.retriever = timed_retriever(strategy.retriever)
        self.strategy = strategy
        self.steps = timed_steps(steps)
        self.timeout_s = timeout_s
        """The hard limit of one turn (None: no limit; `build_pipeline` uses the settings')."""
        self.clock = clock
        """What the limit reads (None: the real clock; tests pass one they move)."""
        self.decision_log = decision_log
        """Where every turn's decision record goes (None: kept nowhere, only returned; the
        harness's case; `build_pipeline` gives the file the settings name)."""
        self.default_power = default_power
        """The depth a served turn uses when it chooses neither auto nor a power (adaptive)."""
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

    async def conversation(self, thread_id: str) -> list[Turn]:
        """The thread's turns as its memory holds them (the last `history_window` answered ones,
        and a question still open), oldest first; empty for a thread never seen."""
        return turns(await self.history(thread_id))

    async def forget(self, thread_id: str) -> None:
        """Delete a conversation's memory (an evaluation case's thread once its last turn ends)."""
        await self.open()
        assert self.checkpointer is not None
        await self.checkpointer.adelete_thread(thread_id)

    @property
    def ladder(self) -> list[int] | None:
        """Chunks per depth of the strategy's ladder (None for strategies without depth)."""
        chunks = getattr(self.strategy, "depth_chunks", None)
        budget = getattr(self.strategy, "budget", None)
        if chunks is None or budget is None:
            return None
        return list(chunks[: budget.max_depth])

    def resolve_power(self, requested: PowerChoice | None) -> tuple[int | None, PowerChoice]:
        """The forced depth to run (None: automatic) and the choice it came from: the request's,
        or the pipeline's default when it chose neither auto nor a power; a depth outside the
        ladder is a PowerError."""
        choice = self.default_power if requested is None else requested
        if choice == "auto":
            return None, choice
        ladder = self.ladder
        if ladder is not None and not 1 <= int(choice) <= len(ladder):
            raise PowerError(f"power must be auto or 1-{len(ladder)} (the depths of the ladder)")
        return int(choice), choice

    async def ask(
        self,
        question: str,
        thread_id: str | None = None,
        power: int | None = None,
        *,
        power_source: PowerSource = "request",
    ) -> AskResult:
        """Answer one turn on a thread (a new thread when none is given); `power` forces the
        retrieval depth of strategies that have one (adaptive) for this turn only (None: the
        strategy's own setting). A turn waits for any other turn of the same thread to finish
        first, within the turn's time limit.

        When the limit cuts a step, the turn answers with what it has: the passages found so far
        as sources (the answer says it was cut), or RequestTimeoutError when no passage was found
        yet. Every turn's decision record goes to the decision log, cut ones included.
        """
        text = validate_question(question)
        thread = thread_id or str(uuid.uuid4())
        record = DecisionRecord(
            request_id=str(uuid.uuid4()),
            created_at=now_iso(),
            thread_id=thread,
            strategy=self.strategy.name,
            question=text,
            timeout_s=self.timeout_s,
        )
        if self.ladder is not None:
            forced = power if power is not None else getattr(self.strategy, "power", None)
            record.power = "auto" if forced is None else str(forced)
            record.power_source = power_source
            record.ladder = self.ladder
            record.max_depth = len(self.ladder)
        await self.open()
        graph = self.graph
        assert graph is not None
        start = time.perf_counter()
        deadline = Deadline(self.timeout_s, self.clock)
        done: dict[str, Any] = {}
        token = CURRENT.set(deadline)
        try:
            await deadline.run(self._turn(graph, text, thread, power, done))
        except Exception as exc:
            if not isinstance(exc, TimeoutError) or deadline.cut_step is None:
                # A failed turn (not the limit's doing) is logged, then reported as before.
                record.status, record.stop_reason = "error", f"error:{type(exc).__name__}"
                record.steps = [s.model_copy() for s in deadline.steps]
                await self._log(record)
                raise
        finally:
            CURRENT.reset(token)
        record.steps = [s.model_copy() for s in deadline.steps]
        record.main_question = done.get("main_question", "")
        kept = set(GraphState.__dataclass_fields__) - {"messages"}
        state = GraphState(**{k: v for k, v in done.items() if k in kept})
        usage = [u for u in (state.rewrite_usage,) if u]
        usage += [u for hop in state.hops for u in hop.usage]
        usage += [u for u in (state.generate_usage,) if u]
        record.rounds = [Round.model_validate(hop, from_attributes=True) for hop in state.hops]
        record.stop_reason = stop_reason(state.hops)
        answer, sources = "", state.answer.sources if state.answer else []
        status: Status = "answered"
        if deadline.cut_step is not None:
            record.stop_reason = f"timeout:{deadline.cut_step}"
            found = state.context or unique(deadline.found)[: self.strategy.k]
            if state.answer is not None:
                answer = state.answer.answer
            elif found:
                status = "partial"
                answer = (
                    f"No answer was written within the {self.timeout_s:g} s time limit "
                    f"(cut during {deadline.cut_step}); the passages found so far are listed "
                    "as sources."
                )
                sources = [Source.of(doc) for doc in found]
            else:
                status = "timeout"
        else:
            assert state.answer is not None
            answer = state.answer.answer
        result = AskResult(
            question=text,
            main_question=state.main_question or text,
            answer=answer,
            sources=sources,
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
            request_id=record.request_id,
            timed_out=deadline.cut_step is not None,
            stop_reason=record.stop_reason,
            memory_expired=expired(self.checkpointer, thread),
        )
        if status == "answered" and result.answer_error:
            status = "no_answer"
        record.status = status
        record.prompt_tokens, record.completion_tokens = (
            result.prompt_tokens,
            result.completion_tokens,
        )
        record.cost_usd, record.latency_s = result.cost_usd, round(result.latency_s, 6)
        result.decision_log = record
        await self._log(record)
        if status == "timeout":
            raise RequestTimeoutError(
                f"the request took longer than its {self.timeout_s:g} s limit "
                f"(cut during {deadline.cut_step}) before any passage was found "
                "(CAPRAG_REQUEST_TIMEOUT_S)",
                request_id=record.request_id,
                stop_reason=record.stop_reason or "timeout",
            )
        return result

    async def _turn(
        self, graph: Any, text: str, thread: str, power: int | None, done: dict[str, Any]
    ) -> None:
        """Run the graph for one turn, keeping each node's output in `done` as it finishes
        (so a turn cut by its time limit still has what the finished nodes made)."""
        deadline = CURRENT.get()
        assert deadline is not None
        async with contextlib.AsyncExitStack() as stack:
            with deadline.step("wait_for_thread"):
                await stack.enter_async_context(self.locks.hold(thread))
            async for update in graph.astream(
                {"question": text, "messages": [HumanMessage(text)], "power": power},
                {"configurable": {"thread_id": thread}},
                stream_mode="updates",
            ):
                for values in update.values():
                    timings = {**done.get("timings", {}), **values.pop("timings", {})}
                    done.update(values, timings=timings)

    async def _log(self, record: DecisionRecord) -> None:
        """Write a turn's record to the decision log, if there is one."""
        if self.decision_log is not None:
            await asyncio.to_thread(self.decision_log.write, record)

    async def feedback(self, request_id: str, enough: bool, comment: str = "") -> Feedback | None:
        """Store the user's verdict on an answer with its decision record (None: no such
        request in the log)."""
        if self.decision_log is None:
            return None
        return await asyncio.to_thread(self.decision_log.add_feedback, request_id, enough, comment)


def stop_reason(hops: list[HopTrace]) -> str | None:
    """How retrieval ended: the last round's decision (a multi-hop turn that still wanted
    another hop ran out of hops)."""
    if not hops:
        return None
    last = hops[-1].outcome
    return "budget_exhausted:hops" if last == "next" else last


def unique(documents: list[Document]) -> list[Document]:
    """Documents without repeats (by content hash), first found first."""
    seen: dict[str, Document] = {}
    for doc in documents:
        seen.setdefault(doc.content_hash, doc)
    return list(seen.values())


def retention_from_settings(settings: Settings) -> Retention:
    """How long the settings keep conversations."""
    return Retention(
        memory_ttl_s=settings.memory_ttl_s,
        memory_max_threads=settings.memory_max_threads,
        sqlite_ttl_days=settings.sqlite_ttl_days,
        prune_interval_s=settings.prune_interval_s,
    )


def build_pipeline(
    settings: Settings | None = None,
    *,
    ingest: bool = True,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
) -> Pipeline:
    """Open (and bring up to date) the index CAPRAG_RETRIEVER chooses, then build LLM, strategy
    and graph from settings. The conversation store is opened by `Pipeline.open()` (or the first
    turn), in the event loop that will use it; a given `checkpointer` is used instead (pipelines
    sharing one continue each other's threads)."""
    from caprag.ingest import ingest_path, open_retriever

    settings = settings or load_settings()
    steps = steps_from_settings(settings)
    index = open_retriever(settings)
    if ingest:
        ingest_path(settings.corpus, settings, index=index)
    strategy = build_strategy(settings.retrieval_strategy, index, steps, settings)
    opener = functools.partial(
        open_checkpointer, settings.checkpointer, retention_from_settings(settings)
    )
    return Pipeline(
        strategy,
        steps,
        checkpointer=checkpointer,
        open_saver=None if checkpointer is not None else opener,
        timeout_s=settings.request_timeout_s,
        decision_log=decision_log_from_settings(settings),
        default_power=settings.power,
    )


def decision_log_from_settings(settings: Settings) -> DecisionLog:
    """The decision log file the settings name (in memory when CAPRAG_DECISION_LOG=off)."""
    path = settings.decision_log
    return DecisionLog(":memory:" if str(path) == "off" else path)
