"""Asking questions: build the pipeline from settings, run one turn, report what it cost."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import unicodedata
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Literal

from langchain_core.messages import AnyMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from pydantic import BaseModel, Field

from caprag.clock import Clock
from caprag.config import PowerChoice, Settings, load_settings
from caprag.errors import CapragError, EmptyQuestionError
from caprag.graph import HISTORY_PAIRS, build_graph
from caprag.llm import StructuredClient
from caprag.llm.usage import total_cost
from caprag.retrieval.books import corpus_library
from caprag.schemas import MAX_QUESTION_CHARS, CallUsage, Document, Source
from caprag.serve.checkpoint import (
    Retention,
    close_checkpointer,
    expired,
    make_checkpointer,
    open_checkpointer,
)
from caprag.serve.conversation import Turn, turns
from caprag.serve.deadline import (
    CURRENT,
    Deadline,
    RequestTimeoutError,
    served_limit_s,
    timed_retriever,
    timed_steps,
)
from caprag.serve.decision_log import (
    DecisionLog,
    DecisionRecord,
    Feedback,
    PowerSource,
    Round,
    Status,
    now_iso,
)
from caprag.state import GraphState
from caprag.steps import ROLES, Steps, Wording, build_steps
from caprag.strategies import STRATEGIES, RetrievalStrategy, Retriever
from caprag.trace import HopTrace

AnswerStatus = Literal["generated", "generated_after_cut", "not_generated"]
"""Whether a turn's answer was written by the generator: with retrieval finished, from what a
retrieval cut by its limit had found, or not at all."""

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
    cost_usd: float | None = Field(
        description="USD of every call; None when a model's price is unknown (never 0)."
    )
    latency_s: float
    request_id: str = Field(default="", description="The id feedback on this answer refers to.")
    timed_out: bool = Field(default=False, description="The request's time limit cut a step.")
    answer_status: AnswerStatus = Field(
        default="generated",
        description="generated; generated_after_cut (retrieval's limit cut it, generation ran on "
        "what was found); not_generated (the answer says why).",
    )
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
    refused: bool = Field(
        default=False,
        description="The generator found no answer in the passages: the answer is its refusal "
        "(CAPRAG_REFUSAL), whatever its wording.",
    )

    @property
    def answer_error(self) -> str | None:
        """Why there is no answer, when the generator's reply could not be used."""
        failed = [u for u in self.usage if u.step == "generate" and u.error]
        return f"generate: {failed[-1].error}" if failed else None

    @property
    def cost_text(self) -> str:
        """The cost for a reader: dollars, or 'cost unknown' (a model missing from the price
        table; never shown as $0)."""
        return "cost unknown" if self.cost_usd is None else f"${self.cost_usd:.6f}"

    @property
    def limit_note(self) -> str | None:
        """What the time limits did to the turn, in words (None: nothing was cut)."""
        if not self.timed_out:
            return None
        if self.answer_status == "generated_after_cut":
            return (
                f"retrieval cut by its {self._limit()} ({self.stop_reason}); answer generated "
                f"from the {len(self.context)} passages found by then"
            )
        return f"time limit reached ({self.stop_reason}): no answer generated"

    def _limit(self) -> str:
        seconds = self.decision_log.timeout_s if self.decision_log else None
        return "time limit" if seconds is None else f"{seconds:g} s limit"

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
    from caprag.llm.openai import build_openai_client  # the openai SDK: only for CAPRAG_LLM=openai

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
        links=settings.links,
        wording=Wording(
            library=settings.library or corpus_library(settings.corpus), refusal=settings.refusal
        ),
    )


def build_strategy(
    name: str,
    retriever: Retriever,
    steps: Steps,
    settings: Settings,
    options: Mapping[str, Any] | None = None,
) -> RetrievalStrategy:
    """The registered strategy the name selects, with its dependencies passed in and the
    options the environment sets for it (its `served_options`: `CAPRAG_<STRATEGY>_<OPTION>`;
    `options`: those, read already)."""
    cls = STRATEGIES.choose(name)
    served = cls.served_options() if options is None else options
    return cls(retriever, steps, k=settings.k, **served)


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
        generation_timeout_s: float | None = None,
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
        """The limit of one turn's retrieval, or of the whole turn when there is no generation
        allowance (None: no limit; `build_pipeline` uses `served_limits`)."""
        self.generation_timeout_s = generation_timeout_s
        """Generation's own allowance, counted from the end of retrieval: a retrieval cut by
        its limit still answers from what it found (None: generation counts against
        `timeout_s`, and a cut turn answers with the passages only)."""
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
        phased = self.timeout_s is not None and self.generation_timeout_s is not None
        token = CURRENT.set(deadline)
        try:
            async with contextlib.AsyncExitStack() as held:  # the thread's lock, both phases
                try:
                    await deadline.run(self._turn(graph, held, text, thread, power, done, phased))
                except TimeoutError:
                    if deadline.cut_step is None:
                        raise  # a step's own TimeoutError, not the limit's
                if phased and (not deadline.cuts or self._found(deadline)):
                    with contextlib.suppress(TimeoutError):  # marked in deadline.cuts
                        await deadline.run_within(
                            self._generate(graph, thread, deadline, done),
                            self.generation_timeout_s,
                        )
        except Exception as exc:
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
        record.query_type = next((h.query_type for h in state.hops if h.query_type), None)
        record.stop_reason = stop_reason(state.hops)
        answer, sources = "", state.answer.sources if state.answer else []
        status: Status = "answered"
        if deadline.cuts:
            record.stop_reason = f"timeout:{deadline.cuts[0]}"
            found = state.context or self._found(deadline)
            if state.answer is not None:
                answer = state.answer.answer
            elif found:
                status = "partial"
                answer = self._not_generated(deadline)
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
            cost_usd=total_cost(u.cost_usd for u in usage),
            latency_s=time.perf_counter() - start,
            request_id=record.request_id,
            timed_out=bool(deadline.cuts),
            answer_status="generated_after_cut" if deadline.cuts else "generated",
            stop_reason=record.stop_reason,
            memory_expired=expired(self.checkpointer, thread),
            refused=bool(status == "answered" and state.answer and state.answer.refused),
        )
        if state.answer is None or result.answer_error:
            result.answer_status = "not_generated"
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
                f"(cut during {deadline.cuts[0]}) before any passage was found "
                "(CAPRAG_REQUEST_TIMEOUT_S)",
                request_id=record.request_id,
                stop_reason=record.stop_reason or "timeout",
            )
        return result

    async def _turn(
        self,
        graph: Any,
        held: contextlib.AsyncExitStack,
        text: str,
        thread: str,
        power: int | None,
        done: dict[str, Any],
        pause: bool,
    ) -> None:
        """Run the graph for one turn (`pause`: up to generation), keeping each node's output in
        `done` as it finishes (so a turn cut by its time limit still has what the finished nodes
        made); the thread's lock is taken into `held`, which the caller releases."""
        deadline = CURRENT.get()
        assert deadline is not None
        with deadline.step("wait_for_thread"):
            await held.enter_async_context(self.locks.hold(thread))
        await self._stream(
            graph,
            {"question": text, "messages": [HumanMessage(text)], "power": power},
            thread,
            done,
            interrupt_before=["generate"] if pause else None,
        )

    async def _generate(
        self, graph: Any, thread: str, deadline: Deadline, done: dict[str, Any]
    ) -> None:
        """Run generation, paused for by `_turn`; after a retrieval cut by its limit, on the
        passages found by then (recorded as retrieval's output, so the conversation's memory
        keeps the answer like any other)."""
        config = {"configurable": {"thread_id": thread}}
        if deadline.cuts:
            found = self._found(deadline)
            await graph.aupdate_state(config, {"context": found}, as_node="retrieve")
            done["context"] = found
        await self._stream(graph, None, thread, done)

    @staticmethod
    async def _stream(
        graph: Any,
        values: dict[str, Any] | None,
        thread: str,
        done: dict[str, Any],
        interrupt_before: list[str] | None = None,
    ) -> None:
        """Stream the graph's node updates into `done` (None: resume where it paused)."""
        async for update in graph.astream(
            values,
            {"configurable": {"thread_id": thread}},
            stream_mode="updates",
            interrupt_before=interrupt_before,
        ):
            for node, output in update.items():
                if node.startswith("__") or not isinstance(output, dict):
                    continue  # the pause before generation, not a node's output
                timings = {**done.get("timings", {}), **output.pop("timings", {})}
                done.update(output, timings=timings)

    def _found(self, deadline: Deadline) -> list[Document]:
        """What a cut retrieval's searches had returned, the first k (none: an empty list)."""
        return unique(deadline.found)[: self.strategy.k]

    def _not_generated(self, deadline: Deadline) -> str:
        """The answer of a turn whose time ran out before an answer was written."""
        if self.generation_timeout_s is None:
            return (
                f"No answer was written within the {self.timeout_s:g} s time limit "
                f"(cut during {deadline.cuts[0]}); the passages found so far are listed "
                "as sources."
            )
        retrieval = (
            f"retrieval was cut by its {self.timeout_s:g} s limit during {deadline.cuts[0]}"
            if deadline.cuts[0] != "generate"
            else "retrieval finished"
        )
        return (
            f"No answer was generated: the {self.generation_timeout_s:g} s generation allowance "
            f"ran out ({retrieval}); the passages found are listed as sources."
        )

    async def _log(self, record: DecisionRecord) -> None:
        """Write a turn's record to the decision log, if there is one."""
        if self.decision_log is not None:
            # Bounded: a busy or unusable log queues the record rather than delay the answer.
            await asyncio.to_thread(self.decision_log.write_or_queue, record)

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
    from caprag.retrieval.ingest import ingest_path, open_retriever

    settings = settings or load_settings()
    name = settings.retrieval_strategy
    options = STRATEGIES.choose(name).served_options()  # a bad one fails before the index opens
    steps = steps_from_settings(settings)
    index = open_retriever(settings)
    if ingest:
        ingest_path(settings.corpus, settings, index=index)
    strategy = build_strategy(name, index, steps, settings, options)
    opener = functools.partial(
        open_checkpointer, settings.checkpointer, retention_from_settings(settings)
    )
    retrieval_s, generation_s = served_limits(strategy, settings)
    return Pipeline(
        strategy,
        steps,
        checkpointer=checkpointer,
        open_saver=None if checkpointer is not None else opener,
        timeout_s=retrieval_s,
        generation_timeout_s=generation_s,
        decision_log=decision_log_from_settings(settings),
        default_power=settings.power,
    )


def served_limits(
    strategy: RetrievalStrategy, settings: Settings
) -> tuple[float | None, float | None]:
    """A served turn's retrieval limit and generation allowance, in seconds (None: no limit).

    Retrieval: `CAPRAG_REQUEST_TIMEOUT_S` when set, else the strategy's own (`served_retrieval_s`:
    adaptive 5 s), else its LLM-call bound (`max_llm_calls`, plus the rewrite of a follow-up) at
    a hosted model's p95 of 3 s per call, plus 2 s for searches and waiting: single 5 s,
    multi-question 8 s, multi-hop 11 s (3 hops: 2 analyses). Generation:
    `CAPRAG_GENERATION_TIMEOUT_S` (5 s: one call at p95 + 2 s), counted from the end of retrieval.
    """
    if settings.request_timeout_s == "off":
        return None, None
    if isinstance(settings.request_timeout_s, float):
        return settings.request_timeout_s, settings.generation_timeout_s
    if strategy.served_retrieval_s is not None:
        return strategy.served_retrieval_s, settings.generation_timeout_s
    calls = 1 + sum((strategy.max_llm_calls() or {}).values())  # + a follow-up's rewrite
    return served_limit_s(calls), settings.generation_timeout_s


def decision_log_from_settings(settings: Settings) -> DecisionLog:
    """The decision log file the settings name (in memory when CAPRAG_DECISION_LOG=off)."""
    path = settings.decision_log
    return DecisionLog(":memory:" if str(path) == "off" else path)
