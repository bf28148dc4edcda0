"""A served request's time limits: retrieval's (`CAPRAG_REQUEST_TIMEOUT_S`, per strategy by
default) and generation's allowance (`CAPRAG_GENERATION_TIMEOUT_S`).

Retrieval (waiting for the thread's previous turn, rewrite, every retrieval step) runs under one
bound read from a `Clock`, generation under a second one counted from the end of retrieval; each
step the pipeline calls goes through a wrapper that
records when it started and ended, so when the bound fires the request knows which step it cut and
what retrieval had found by then. The wrappers find the current request through a context
variable: code outside a served request (the harness) runs them as plain calls.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from caprag.clock import Clock, MonotonicClock
from caprag.errors import CapragError
from caprag.schemas import Document
from caprag.serve.decision_log import StepTime
from caprag.steps import ROLES, Steps

T = TypeVar("T")

HOSTED_P95_S = 3.0
"""A hosted model's 95th-percentile latency of one structured reply, in seconds: what a served
limit allows per LLM call."""

MARGIN_S = 2.0
"""What a turn spends besides its LLM calls (searches, waiting for the thread, the network)."""


def served_limit_s(llm_calls: int) -> float:
    """A limit that covers `llm_calls` calls at a hosted model's p95, plus the margin."""
    return llm_calls * HOSTED_P95_S + MARGIN_S


GENERATION_ALLOWANCE_S = served_limit_s(1)
"""The default generation allowance: one call (5 s)."""


class RequestTimeoutError(CapragError):
    """A request ran out of its time limit before anything usable was found (the API: 504)."""

    def __init__(self, message: str, *, request_id: str, stop_reason: str) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.stop_reason = stop_reason


class Deadline:
    """One request's time limit, and the steps it ran (what a cut leaves behind)."""

    def __init__(self, seconds: float | None, clock: Clock | None = None) -> None:
        self.seconds = seconds
        self.clock: Clock = clock or MonotonicClock()
        self.start = self.clock.now()
        self.steps: list[StepTime] = []
        self.found: list[Document] = []
        """Every passage a search returned so far, in the order found."""
        self.cut_step: str | None = None
        """The step the last cut stopped (None: nothing was cut)."""
        self.cuts: list[str] = []
        """Every step a bound cut, in order (retrieval's, then generation's)."""
        self._lock = threading.Lock()  # searches record from worker threads

    def elapsed(self) -> float:
        """Seconds since the request started."""
        return self.clock.now() - self.start

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Record a step from its start to its end (one cancelled keeps latency None)."""
        record = StepTime(step=name, started_s=round(self.elapsed(), 6), latency_s=None)
        with self._lock:
            self.steps.append(record)
        try:
            yield
        except asyncio.CancelledError:
            raise  # cut: it never finished
        except BaseException:
            record.latency_s = round(self.elapsed() - record.started_s, 6)
            raise
        record.latency_s = round(self.elapsed() - record.started_s, 6)

    def running(self) -> list[StepTime]:
        """Steps started and neither finished nor cut."""
        with self._lock:
            return [s for s in self.steps if s.latency_s is None and not s.cut]

    def add_found(self, documents: list[Document]) -> None:
        """Keep what a search returned (a partial answer lists it)."""
        with self._lock:
            self.found.extend(documents)

    async def run(self, awaitable: Awaitable[T]) -> T:
        """Await the turn within the limit; on TimeoutError mark the step it cut (the innermost
        one still running: the last started)."""
        if self.seconds is None:
            return await awaitable
        return await self._bounded(awaitable, self.seconds - self.elapsed())

    async def run_within(self, awaitable: Awaitable[T], seconds: float | None) -> T:
        """Await a further phase (generation) within `seconds` counted from now (None: no
        bound); a cut is marked as `run` marks it."""
        if seconds is None:
            return await awaitable
        return await self._bounded(awaitable, seconds)

    async def _bounded(self, awaitable: Awaitable[T], seconds: float) -> T:
        try:
            return await self.clock.bounded(awaitable, seconds)
        except TimeoutError:
            running = self.running()
            for record in running:
                record.cut = True
            self.cut_step = running[-1].step if running else "pipeline"
            self.cuts.append(self.cut_step)
            raise


CURRENT: ContextVar[Deadline | None] = ContextVar("caprag_deadline", default=None)
"""The request being served in this context (None outside a served request)."""


class TimedStep:
    """A step that records itself in the current request's deadline; otherwise the step itself
    (its `kind`, `model` and other attributes are the wrapped step's)."""

    def __init__(self, name: str, inner: Any) -> None:
        self.name = name
        self.inner = inner

    def __getattr__(self, attribute: str) -> Any:
        if attribute == "inner":  # not set yet (a copy or unpickling in progress)
            raise AttributeError(attribute)
        return getattr(self.inner, attribute)

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        deadline = CURRENT.get()
        if deadline is None:
            return await self.inner(*args, **kwargs)
        with deadline.step(self.name):
            return await self.inner(*args, **kwargs)


class TimedRetriever:
    """A retriever whose searches record themselves (and what they found) in the current
    request's deadline."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, attribute: str) -> Any:
        if attribute == "inner":  # not set yet (a copy or unpickling in progress)
            raise AttributeError(attribute)
        return getattr(self.inner, attribute)

    def search(self, query: str, k: int) -> list[Document]:
        """The wrapped search, timed (runs in a worker thread; the context is copied there)."""
        deadline = CURRENT.get()
        if deadline is None:
            return list(self.inner.search(query, k))
        with deadline.step("search"):
            found = list(self.inner.search(query, k))
        deadline.add_found(found)
        return found


def timed_steps(steps: Steps) -> Steps:
    """The same steps, each recording itself in the current request (idempotent)."""
    wrapped = {}
    for name in ROLES.values():
        step = getattr(steps, name)
        wrapped[name] = step if isinstance(step, TimedStep) else TimedStep(name, step)
    return dataclasses.replace(steps, **wrapped)


def timed_retriever(retriever: Any) -> Any:
    """The retriever, recording its searches in the current request (idempotent)."""
    return retriever if isinstance(retriever, TimedRetriever) else TimedRetriever(retriever)
