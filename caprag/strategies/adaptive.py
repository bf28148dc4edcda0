"""Adaptive depth: classify the question, search shallow, go deeper while confidence is too low."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, get_args

from caprag.calibration import DEFAULT_CALIBRATION, Calibration, load_calibration
from caprag.clock import Clock, MonotonicClock
from caprag.llm.prompt import format_passages
from caprag.llm.usage import count_tokens
from caprag.options import (
    DEFAULT_PROFILES,
    AdaptiveOptions,
    ClockChoice,
    QueryProfile,
)
from caprag.retrieval.catalog import Catalog
from caprag.schemas import CallUsage, Document, Question, RetrievedRef
from caprag.state import GraphState
from caprag.steps import Steps
from caprag.steps.analyze import MAX_NEW_QUERIES, follow_up
from caprag.steps.assess import NOT_FOUND
from caprag.strategies.base import (
    FollowedContext,
    RetrievalStrategy,
    Retriever,
    elapsed,
)
from caprag.text import searchable
from caprag.trace import HopTrace, report_round

BUDGETS = ("depth", "iterations", "chunks", "tokens", "cost", "timeout")
T = TypeVar("T")


@dataclass(frozen=True)
class Budget:
    """Limits on one turn's retrieval; each one reached is its own stop reason."""

    max_depth: int = 3
    max_iterations: int = 3
    max_chunks: int = 50
    max_context_tokens: int = 10_000
    timeout_s: float = 5.0
    max_cost_usd: float | None = None
    """USD the turn's retrieval steps (classify, assess, expand) may spend; None: no limit."""


@dataclass(frozen=True)
class Progress:
    """Where the loop stands after one iteration: what the stop rule looks at."""

    confidence: float
    threshold: float
    depth: int
    iteration: int
    chunks: int
    trimmed: bool
    elapsed_s: float
    timed_out: bool = False
    forced: bool = False
    nothing_new: bool = False
    """A deeper round searched something new and added no passage to the context."""
    cost_usd: float = 0.0
    """What the turn's retrieval steps have cost so far (USD)."""


def decide(progress: Progress, budget: Budget) -> str:
    """Next step: sufficient, forced_depth, no_new_evidence, increase_depth or
    budget_exhausted:<budget>.

    A retrieval cut off by the timeout ends the turn; a forced depth never deepens; otherwise
    confidence at the threshold is enough; below it, a deeper round that did not change the top
    passages stops the loop (going deeper again would not pay), and else the first budget reached
    (in the order depth, iterations, chunks, tokens, timeout) does.
    """
    if progress.timed_out:
        return "budget_exhausted:timeout"
    if progress.forced:
        return "forced_depth"
    if progress.confidence >= progress.threshold:
        return "sufficient"
    if progress.nothing_new:
        return "no_new_evidence"
    reached = {
        "depth": progress.depth >= budget.max_depth,
        "iterations": progress.iteration >= budget.max_iterations,
        "chunks": progress.chunks >= budget.max_chunks,
        "tokens": progress.trimmed,
        "cost": budget.max_cost_usd is not None and progress.cost_usd >= budget.max_cost_usd,
        "timeout": progress.elapsed_s >= budget.timeout_s,
    }
    which = next((name for name in BUDGETS if reached[name]), None)
    return f"budget_exhausted:{which}" if which else "increase_depth"


class SearchClock:
    """A clock that moves only by the searches it bounds: each costs `seconds_per_search`.

    The harness's clock: the timeout budget then counts deeper searches instead of reading the
    wall clock, so a run's results are the same on an idle and on a busy machine. A fresh one
    per turn (the strategy takes a factory), so concurrent questions never share its count.
    """

    def __init__(self, seconds_per_search: float = 1.0) -> None:
        if seconds_per_search < 0:
            raise ValueError("seconds_per_search must not be negative")
        self.seconds_per_search = seconds_per_search
        self.time = 0.0

    def now(self) -> float:
        """Seconds charged so far."""
        return self.time

    async def bounded(self, awaitable: Awaitable[T], seconds: float) -> T:
        """Run the search to its end, charge it, and time out when its charge exceeds `seconds`."""
        result = await awaitable
        self.time += self.seconds_per_search
        if self.seconds_per_search > seconds:
            raise TimeoutError
        return result


CLOCKS: tuple[ClockChoice, ...] = get_args(ClockChoice)


def clock_factory(
    clock: ClockChoice | Clock | Callable[[], Clock], seconds_per_search: float = 1.0
) -> Clock | Callable[[], Clock]:
    """What `AdaptiveDepthStrategy(clock=...)` keeps: a factory of per-turn clocks for
    `searches` and `wall`, or the clock or factory given."""
    if clock == "searches":
        return functools.partial(SearchClock, seconds_per_search)
    if clock == "wall":
        return MonotonicClock
    if isinstance(clock, str):
        raise ValueError(f"clock={clock!r}: use one of {', '.join(CLOCKS)}")
    return clock


def fit_tokens(documents: Sequence[Document], max_tokens: int) -> tuple[list[Document], int]:
    """The longest prefix of the ranked documents whose prompt text fits the token budget."""
    kept: list[Document] = []
    tokens = 0
    for doc in documents:
        cost = count_tokens(format_passages([doc])) + (1 if kept else 0)
        if tokens + cost > max_tokens:
            break
        kept.append(doc)
        tokens += cost
    return kept, tokens


class AdaptiveDepthStrategy(RetrievalStrategy):
    """Search the question at the depth its type calls for, and deeper while confidence is short
    of that type's threshold and every budget allows.

    Budget choice: unlike the other strategies, generation does not get `k` passages; it gets
    min(depth_chunks[depth], max_chunks) of everything gathered, cut further to
    max_context_tokens: the question's own ranking first, as it was, then what the deeper rounds'
    queries found. Depth is the point of the strategy, so its context grows with it; each hop
    records `chunks` and `context_tokens`, and the harness reports the passages handed on beside
    every score. `k` is accepted for the common constructor and not used.
    """

    name = "adaptive"
    served_retrieval_s = 5.0  # the design target: adaptive retrieval answers within 5 s served

    Options = AdaptiveOptions
    options: AdaptiveOptions

    def __init__(self, retriever: Retriever, steps: Steps, k: int = 8, **options: Any) -> None:
        super().__init__(retriever, steps, k, **options)
        checked = self.options
        self._clock = clock_factory(checked.clock, checked.seconds_per_search)
        """What the timeout budget reads: `searches` (a SearchClock per turn: every search after
        the first costs seconds_per_search, so a turn decides the same on any machine, served or
        in the harness), `wall` (the monotonic clock), or a clock (tests pass one that moves only
        when told)."""
        calibration = checked.calibration
        if calibration == "auto":  # the dataset's choice; the harness resolves it before
            calibration = DEFAULT_CALIBRATION
        self.calibration = (
            load_calibration(calibration)
            if isinstance(calibration, str)
            else Calibration.from_config(calibration)
        )
        """Maps the rule's signals to the confidence compared with the thresholds (a saved
        calibration by name, `none`: the weighted heuristic as it is). An LLM self-assessment,
        which has no signals, is used as the model gives it."""
        self.depth_chunks = tuple(checked.depth_chunks)
        self.profiles: dict[str, QueryProfile] = {t: p for t, p in DEFAULT_PROFILES.items()}
        self.profiles.update({t: p for t, p in checked.query_types.items()})
        """Every query type's threshold and starting depth (the ones given replace the
        defaults of their types)."""
        self.budget = Budget(
            checked.deepest,
            checked.max_iterations,
            checked.max_chunks,
            checked.max_context_tokens,
            checked.timeout_s,
            checked.max_cost_usd,
        )
        self._catalog: Catalog | None = None
        self.power = None if checked.power == "auto" else checked.power

    def _check_power(self, power: int | str | None) -> int | None:
        """A request's power (state.power): auto (None) or a depth this strategy reaches."""
        if power is None:
            return None
        if isinstance(power, bool) or not isinstance(power, int):
            raise ValueError(f"power must be 'auto' or 1-{self.budget.max_depth}, not {power!r}")
        if not 1 <= power <= self.budget.max_depth:
            raise ValueError(f"power must be 'auto' or 1-{self.budget.max_depth}, not {power}")
        return power

    def max_llm_calls(self) -> dict[str, int]:
        """A classification, and a self-assessment per iteration when confidence is the LLM's
        (the rule's heuristic is no call)."""
        calls = {"classify": 1}
        if self.steps.assess.kind == "llm":
            calls["assess"] = self.budget.max_iterations
        return calls

    def turn_clock(self) -> Clock:
        """The clock one turn's timeout reads (a new one when the strategy holds a factory)."""
        clock = self._clock
        if isinstance(clock, Clock) and not isinstance(clock, type):
            return clock
        return clock()

    def catalog(self) -> Catalog | None:
        """The titles of the passages the retriever searches (read once; see multi-hop)."""
        if self._catalog is None:
            self._catalog = Catalog.of(self.retriever)
        return self._catalog

    async def execute(self, state: GraphState) -> GraphState:
        """1. Classify. 2. Search the question at the type's depth. 3. Rate confidence. 4. Below
        the threshold, go a depth deeper with new evidence: the references or bridge names the
        assessment found unresolved (or, when it found none, the expansion of the question), each
        keeping its best new passages up to the deeper depth's chunks. 5. Stop when confident,
        when a round added nothing new, or on a budget."""
        clock = self.turn_clock()
        start = clock.now()
        question = state.main_question
        forced = self._check_power(state.power) if state.power is not None else self.power
        classified = await self.steps.classify(question)
        query_type = classified.value.query_type
        profile = self.profiles[query_type]
        depth = forced or min(profile.depth, self.budget.max_depth)
        gathered = FollowedContext(k=self.budget.max_chunks, max_followed=self.budget.max_chunks)
        context: list[Document] = []
        questions: list[Question] = []
        hops: list[HopTrace] = []
        usage: list[CallUsage] = [u for u in (classified.usage,) if u]
        searched: list[str] = []
        confidence = 0.0
        spent = 0.0
        missing: list[str] = []
        for iteration in range(1, self.budget.max_iterations + 1):
            hop_start = time.perf_counter()
            n = min(self.depth_chunks[depth - 1], self.budget.max_chunks)
            queries = (
                [question]
                if iteration == 1
                else await self._new_queries(question, missing, searched, usage)
            )
            hop = HopTrace(hop=iteration, queries=queries, depth=depth, query_type=query_type)
            found = (
                await self._search(queries, n, clock, None if iteration == 1 else start)
                if queries
                else []
            )
            searched += queries
            trimmed = False
            added = 0
            if found is not None:
                questions += found
                before = {doc.passage_id for doc in context}
                refs: list[RetrievedRef] = []
                if iteration == 1:
                    refs = gathered.add_first(found[0].context)
                else:
                    room = max(0, n - len(context))
                    share = -(-room // len(found)) if found else 0  # ceil: room split per query
                    for index, result in enumerate(found):
                        refs += gathered.add_follow_up(result.context, share, index)
                hop.documents = refs
                hop.new_documents = sum(r.new for r in refs)
                hop.duplicate_documents = sum(not r.new for r in refs)
                ranked = gathered.top()[:n]
                context, hop.context_tokens = fit_tokens(ranked, self.budget.max_context_tokens)
                trimmed = len(context) < len(ranked)
                added = len({doc.passage_id for doc in context} - before)
                confidence, missing = await self._assess(question, context, gathered, hop, usage)
            else:
                hop.context_tokens = count_tokens(format_passages(context))
                hop.confidence = confidence
            hop.chunks = len(context)
            hop.threshold = profile.threshold
            hop.usage, usage = usage, []
            spent += sum(
                u.cost_usd or 0.0 for u in hop.usage
            )  # an unknown price spends nothing known
            progress = Progress(
                confidence=confidence,
                threshold=profile.threshold,
                depth=depth,
                iteration=iteration,
                chunks=len(gathered.read),
                trimmed=trimmed,
                elapsed_s=clock.now() - start,
                timed_out=found is None,
                forced=forced is not None,
                nothing_new=iteration > 1 and added == 0,
                cost_usd=spent,
            )
            hop.adaptive_decision = decide(progress, self.budget)
            hop.latency_s = elapsed(hop_start)
            hops.append(hop)
            report_round(hop)  # shown live (the chat page polls), before any deeper search
            if hop.adaptive_decision != "increase_depth":
                break
            depth += 1
        self._explain(hops[-1], forced)
        return dataclasses.replace(state, questions=questions, context=context, hops=hops)

    async def _new_queries(
        self, question: str, missing: Sequence[str], searched: Sequence[str], usage: list[CallUsage]
    ) -> list[str]:
        """What a deeper round searches: what the assessment found missing (the rule gives the
        follow-up queries of the unresolved references or bridge names; a model's items are
        searched with the question), else the expansion of the question; never a junk query
        (`caprag.text.junk_query`: one word, stop words only, already searched)."""
        if self.steps.assess.kind == "rule":
            wanted = [item for item in missing if not item.startswith(NOT_FOUND)]
        else:
            wanted = [follow_up(question, item) for item in missing]
        wanted = searchable(wanted, [question, *searched])
        if not wanted:
            expansion, calls = await self.expanded(question, MAX_NEW_QUERIES)
            usage += calls
            wanted = searchable(expansion, [question, *searched])
        return wanted[:MAX_NEW_QUERIES]

    async def _search(
        self, queries: Sequence[str], n: int, clock: Clock, since: float | None
    ) -> list[Question] | None:
        """Search the queries n deep; a deeper round (`since` set) is cut off at the timeout
        (None).

        The first search always completes, as every other strategy's does: the timeout bounds
        what deepening adds, and a hung retriever is the harness's question timeout to catch.
        """
        if since is None:
            return await self.search_many(queries, n)
        remaining = self.budget.timeout_s - (clock.now() - since)
        try:
            return await clock.bounded(self.search_many(queries, n), remaining)
        except TimeoutError:
            return None

    async def _assess(
        self,
        question: str,
        context: list[Document],
        gathered: FollowedContext,
        hop: HopTrace,
        usage: list[CallUsage],
    ) -> tuple[float, list[str]]:
        """Rate the context with the `assess` step: the rule's heuristic (no call, its signals in
        the trace), mapped through the calibration when there is one, or the LLM's
        self-assessment. A calibrated hop keeps the uncalibrated value as signal `heuristic`."""
        catalog = self.catalog()
        unread = catalog.unread(gathered.read) if catalog is not None else None
        assessed = await self.steps.assess(question, context, catalog=unread)
        if assessed.usage:
            usage.append(assessed.usage)
        confidence = assessed.value.confidence
        signals = dict(assessed.signals) if assessed.signals is not None else None
        if self.calibration is not None and signals is not None:
            signals["heuristic"] = round(confidence, 4)
            confidence = self.calibration.probability(signals)
        hop.confidence = round(confidence, 4)
        hop.confidence_signals = signals
        hop.missing_info = assessed.value.missing_info
        return hop.confidence, list(assessed.value.missing_info)

    def _explain(self, last: HopTrace, forced: int | None) -> None:
        """Warn when retrieval stopped short of the threshold; hint at a higher forced power."""
        assert last.confidence is not None and last.threshold is not None
        if last.confidence >= last.threshold:
            return
        short = (
            f"confidence {last.confidence:.2f} is below the {last.threshold:.2f} threshold "
            f"for a {last.query_type} question"
        )
        if forced is not None and forced < self.budget.max_depth:
            last.hint = (
                f"{short}: raise the power to {forced + 1} to search deeper, or choose auto to "
                "let it deepen until it is confident"
            )
            return
        decision = last.adaptive_decision or ""
        if decision == "budget_exhausted:depth" or (forced and last.depth == self.budget.max_depth):
            last.warning = (
                f"maximum depth {last.depth} reached and {short}: the answer may be incomplete"
            )
        elif decision == "no_new_evidence":
            last.warning = (
                f"searching deeper (depth {last.depth}) added no new passage and {short}: "
                "stopped there, the answer may be incomplete"
            )
        elif decision.startswith("budget_exhausted:"):
            budget = decision.split(":", 1)[1]
            last.warning = (
                f"stopped by the {budget} budget at depth {last.depth} and {short}: "
                "the answer may be incomplete"
            )
