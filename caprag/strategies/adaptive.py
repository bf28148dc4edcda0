"""Adaptive depth: classify the question, search shallow, go deeper while confidence is too low."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from caprag.clock import Clock, MonotonicClock
from caprag.llm.prompt import format_passages
from caprag.llm.usage import count_tokens
from caprag.schemas import CallUsage, Document, Question
from caprag.state import GraphState
from caprag.steps import Steps
from caprag.steps.assess import Calibration
from caprag.strategies.base import (
    DocumentPool,
    RetrievalStrategy,
    Retriever,
    ServedSettings,
    elapsed,
)
from caprag.trace import HopTrace

BUDGETS = ("depth", "iterations", "chunks", "tokens", "timeout")
T = TypeVar("T")


@dataclass(frozen=True)
class QueryProfile:
    """How sure retrieval must be for a query type, and the depth it starts at."""

    threshold: float
    depth: int


DEFAULT_PROFILES: dict[str, QueryProfile] = {
    "factual": QueryProfile(threshold=0.9, depth=1),
    "operational": QueryProfile(threshold=0.7, depth=1),
    "decision": QueryProfile(threshold=0.85, depth=2),
    "strategic": QueryProfile(threshold=0.9, depth=3),
}
DEFAULT_DEPTH_CHUNKS = (5, 15, 30)


@dataclass(frozen=True)
class Budget:
    """Limits on one turn's retrieval; each one reached is its own stop reason."""

    max_depth: int = 3
    max_iterations: int = 3
    max_chunks: int = 50
    max_context_tokens: int = 10_000
    timeout_s: float = 5.0


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
    unchanged: bool = False
    """A deeper round left the top passages as they were (see top_k_agreement)."""


def decide(progress: Progress, budget: Budget) -> str:
    """Next step: sufficient, forced_depth, top_k_unchanged, increase_depth or
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
    if progress.unchanged:
        return "top_k_unchanged"
    reached = {
        "depth": progress.depth >= budget.max_depth,
        "iterations": progress.iteration >= budget.max_iterations,
        "chunks": progress.chunks >= budget.max_chunks,
        "tokens": progress.trimmed,
        "timeout": progress.elapsed_s >= budget.timeout_s,
    }
    which = next((name for name in BUDGETS if reached[name]), None)
    return f"budget_exhausted:{which}" if which else "increase_depth"


def top_k_agreement(before: Sequence[Document], after: Sequence[Document], k: int) -> float:
    """Share of the passages that led before a deeper round that lead the deeper search too, 0-1.

    Compared over the top min(k, len(before)) of each (the passages recall@k and the first
    lines of generation's context see); 1.0 means going deeper changed nothing at the top.
    `after` is the deeper search's own ranking, not the fused pool: fusion by reciprocal rank
    keeps passages found twice ahead of any found once, so the pool's top never changes.
    """
    m = min(k, len(before))
    if m == 0:
        return 0.0
    leading = {doc.content_hash for doc in before[:m]}
    return len(leading & {doc.content_hash for doc in after[:m]}) / m


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

    Budget choice: unlike the other strategies, generation does not get `k` passages; it gets the
    top min(depth_chunks[depth], max_chunks) of everything gathered (fused by RRF), cut further to
    max_context_tokens. Depth is the point of the strategy, so its context grows with it; each hop
    records `chunks` and `context_tokens` so runs can be compared at equal spend. `k` is accepted
    for the common constructor and not used.
    """

    name = "adaptive"

    def __init__(
        self,
        retriever: Retriever,
        steps: Steps,
        k: int = 8,
        *,
        query_types: Mapping[str, QueryProfile | Mapping[str, float]] | None = None,
        depth_chunks: Sequence[int] = DEFAULT_DEPTH_CHUNKS,
        power: int | Literal["auto"] = "auto",
        max_depth: int = 3,
        max_iterations: int = 3,
        max_chunks: int = 50,
        max_context_tokens: int = 10_000,
        timeout_s: float = 5.0,
        clock: Clock | Callable[[], Clock] | None = None,
        calibration: Calibration | Mapping[str, object] | None = None,
        stop_when_unchanged: bool = True,
    ) -> None:
        super().__init__(retriever, steps, k)
        self._clock = clock
        """What the timeout budget reads: one clock for every turn (tests pass one that moves
        only when told), or a factory called once per turn (the harness's SearchClock); None:
        the wall clock."""
        self.turn_clock()  # a clock factory with bad settings fails here, not at a question
        self.calibration = Calibration.from_config(calibration)
        """Maps the rule's signals to the confidence compared with the thresholds (None: the
        weighted heuristic as it is). An LLM self-assessment, which has no signals, is used as
        the model gives it."""
        if not isinstance(stop_when_unchanged, bool):
            raise ValueError(
                f"stop_when_unchanged must be true or false, not {stop_when_unchanged!r}"
            )
        self.stop_when_unchanged = stop_when_unchanged
        """Stop deepening when a deeper round left the top passages unchanged."""
        self.depth_chunks = tuple(int(n) for n in depth_chunks)
        if not 1 <= max_depth <= len(self.depth_chunks):
            raise ValueError(f"max_depth must be 1-{len(self.depth_chunks)} (one per depth_chunks)")
        if any(n < 1 for n in self.depth_chunks):
            raise ValueError("every depth_chunks entry must be at least 1")
        self.profiles: dict[str, QueryProfile] = dict(DEFAULT_PROFILES)
        for query_type, profile in (query_types or {}).items():
            if query_type not in DEFAULT_PROFILES:
                known = sorted(DEFAULT_PROFILES)
                raise ValueError(f"unknown query type {query_type!r}; use one of {known}")
            if not isinstance(profile, QueryProfile):
                profile = QueryProfile(float(profile["threshold"]), int(profile["depth"]))
            self.profiles[query_type] = profile
        self.budget = Budget(max_depth, max_iterations, max_chunks, max_context_tokens, timeout_s)
        self.power = self._check_power(None if power == "auto" else power)

    def _check_power(self, power: int | str | None) -> int | None:
        if power is None:
            return None
        if isinstance(power, bool) or not isinstance(power, int):
            raise ValueError(f"power must be 'auto' or 1-{self.budget.max_depth}, not {power!r}")
        if not 1 <= power <= self.budget.max_depth:
            raise ValueError(f"power must be 'auto' or 1-{self.budget.max_depth}, not {power}")
        return power

    @classmethod
    def served_options(cls, settings: ServedSettings) -> dict[str, Any]:
        """CAPRAG_DEPTH_CHUNKS: the ladder, every depth of it usable."""
        return {"depth_chunks": settings.depth_chunks, "max_depth": len(settings.depth_chunks)}

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
        if clock is None:
            return MonotonicClock()
        if isinstance(clock, type) or not hasattr(clock, "now"):
            return clock()
        return clock  # type: ignore[return-value]

    async def execute(self, state: GraphState) -> GraphState:
        """1. Classify. 2. Search at the type's depth. 3. Rate confidence. 4. Deeper or stop."""
        clock = self.turn_clock()
        start = clock.now()
        question = state.main_question
        forced = self._check_power(state.power) if state.power is not None else self.power
        classified = await self.steps.classify(question)
        query_type = classified.value.query_type
        profile = self.profiles[query_type]
        depth = forced or min(profile.depth, self.budget.max_depth)
        pool = DocumentPool()
        context: list[Document] = []
        questions: list[Question] = []
        hops: list[HopTrace] = []
        usage: list[CallUsage] = [u for u in (classified.usage,) if u]
        confidence = 0.0
        for iteration in range(1, self.budget.max_iterations + 1):
            hop_start = time.perf_counter()
            n = min(self.depth_chunks[depth - 1], self.budget.max_chunks)
            found = await self._search(question, n, clock, None if iteration == 1 else start)
            hop = HopTrace(hop=iteration, queries=[question], depth=depth, query_type=query_type)
            trimmed = False
            unchanged = False
            compared = 0
            if found is not None:
                questions += found
                refs = pool.add(found[0].context)
                hop.documents = refs
                hop.new_documents = sum(r.new for r in refs)
                hop.duplicate_documents = sum(not r.new for r in refs)
                ranked = pool.top(n)
                before, (context, hop.context_tokens) = (
                    context,
                    fit_tokens(ranked, self.budget.max_context_tokens),
                )
                trimmed = len(context) < len(ranked)
                confidence = await self._assess(question, context, hop, usage)
                if iteration > 1:
                    agreement = top_k_agreement(before, found[0].context, self.k)
                    hop.confidence_signals = {
                        **(hop.confidence_signals or {}),
                        "top_k_agreement": round(agreement, 4),
                    }
                    unchanged = self.stop_when_unchanged and agreement >= 1.0
                    compared = min(self.k, len(before))
            else:
                hop.context_tokens = count_tokens(format_passages(context))
                hop.confidence = confidence
            hop.chunks = len(context)
            hop.threshold = profile.threshold
            hop.usage, usage = usage, []
            progress = Progress(
                confidence=confidence,
                threshold=profile.threshold,
                depth=depth,
                iteration=iteration,
                chunks=len(pool),
                trimmed=trimmed,
                elapsed_s=clock.now() - start,
                timed_out=found is None,
                forced=forced is not None,
                unchanged=unchanged,
            )
            hop.adaptive_decision = decide(progress, self.budget)
            hop.latency_s = elapsed(hop_start)
            hops.append(hop)
            if hop.adaptive_decision != "increase_depth":
                break
            depth += 1
        self._explain(hops[-1], forced, compared)
        return dataclasses.replace(state, questions=questions, context=context, hops=hops)

    async def _search(
        self, question: str, n: int, clock: Clock, since: float | None
    ) -> list[Question] | None:
        """Search n passages; a deeper search (`since` set) is cut off at the timeout (None).

        The first search always completes, as every other strategy's does: the timeout bounds
        what deepening adds, and a hung retriever is the harness's question timeout to catch.
        """
        if since is None:
            return await self.search_many([question], n)
        remaining = self.budget.timeout_s - (clock.now() - since)
        try:
            return await clock.bounded(self.search_many([question], n), remaining)
        except TimeoutError:
            return None

    async def _assess(
        self, question: str, context: list[Document], hop: HopTrace, usage: list[CallUsage]
    ) -> float:
        """Rate the context with the `assess` step: the rule's heuristic (no call, its signals in
        the trace), mapped through the calibration when there is one, or the LLM's
        self-assessment. A calibrated hop keeps the uncalibrated value as signal `heuristic`."""
        assessed = await self.steps.assess(question, context)
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
        return hop.confidence

    def _explain(self, last: HopTrace, forced: int | None, compared: int = 0) -> None:
        """Warn when retrieval stopped short of the threshold; hint at a higher forced power."""
        assert last.confidence is not None and last.threshold is not None
        if last.confidence >= last.threshold:
            return
        short = (
            f"confidence {last.confidence:.2f} is below the {last.threshold:.2f} threshold "
            f"for a {last.query_type} question"
        )
        if forced is not None and forced < self.budget.max_depth:
            last.hint = f"{short}: raise the power to {forced + 1} to search deeper"
            return
        decision = last.adaptive_decision or ""
        if decision == "budget_exhausted:depth" or (forced and last.depth == self.budget.max_depth):
            last.warning = (
                f"maximum depth {last.depth} reached and {short}: the answer may be incomplete"
            )
        elif decision == "top_k_unchanged":
            last.warning = (
                f"searching deeper (depth {last.depth}) did not change the top {compared} passages "
                f"and {short}: stopped there, the answer may be incomplete"
            )
        elif decision.startswith("budget_exhausted:"):
            budget = decision.split(":", 1)[1]
            last.warning = (
                f"stopped by the {budget} budget at depth {last.depth} and {short}: "
                "the answer may be incomplete"
            )
