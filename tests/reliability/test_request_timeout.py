"""The hard time limit of a served turn (issue 19, point 4): every step is bounded, a cut answers
with what it has (or 504 when nothing was found), and the cut step is the logged stop reason.

Steps are scripted to block until released and the clock moves only when the test moves it: no
assertion here reads the wall clock except the hang guards.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest

from caprag.clock import MonotonicClock
from caprag.config import load_settings
from caprag.retrieval.store import PassageIndex
from caprag.schemas import Document
from caprag.serve.api import create_app
from caprag.serve.decision_log import DecisionLog
from caprag.serve.services import Pipeline
from caprag.steps import StepResult, rule_steps
from caprag.steps.assess import ConfidenceAssessment
from caprag.strategies import AdaptiveDepthStrategy
from tests.reliability.test_serving import api

T = TypeVar("T")
HANG_S = 600  # only catches a hang; each turn here is scripted
LIMIT_S = 5.0
QUESTION = "How long does a torch burn?"


class AlarmClock:
    """A clock that moves only when told; a bounded wait is cut as soon as the clock is moved to
    its end (what the real clock's `asyncio.wait_for` does in real time)."""

    def __init__(self) -> None:
        self.time = 0.0
        self._alarms: list[tuple[float, asyncio.Event]] = []

    def now(self) -> float:
        return self.time

    def advance(self, seconds: float) -> None:
        self.time += seconds
        for end, alarm in self._alarms:
            if self.time >= end:
                alarm.set()

    async def bounded(self, awaitable: Awaitable[T], seconds: float) -> T:
        task = asyncio.ensure_future(awaitable)
        alarm = asyncio.Event()
        entry = (self.time + seconds, alarm)
        self._alarms.append(entry)
        if seconds <= 0:
            alarm.set()
        ring = asyncio.ensure_future(alarm.wait())
        try:
            done, _ = await asyncio.wait({task, ring}, return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                return task.result()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise TimeoutError
        finally:
            ring.cancel()
            self._alarms.remove(entry)


class Blocking:
    """A step that blocks until released, counting its calls and the calls the limit cut."""

    def __init__(self, inner: Any, on_call: int = 1) -> None:
        self.inner = inner
        self.on_call = on_call
        self.calls = 0
        self.cut = 0
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.inner, attribute)

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.on_call:
            self.entered.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cut += 1
                raise
        return await self.inner(*args, **kwargs)


class BlockingIndex:
    """A retriever whose `on_call`-th search blocks its worker thread until released."""

    def __init__(self, inner: PassageIndex, on_call: int) -> None:
        self.inner = inner
        self.on_call = on_call
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()

    def search(self, query: str, k: int) -> list[Document]:
        self.calls += 1
        if self.calls == self.on_call:
            self.entered.set()
            self.release.wait(HANG_S)
        return self.inner.search(query, k)


class Unsure:
    """An assessor that is never confident: adaptive always goes one depth deeper."""

    kind = "rule"
    model = "offline"

    async def __call__(
        self, question: str, documents: Any, **_: Any
    ) -> StepResult[ConfidenceAssessment]:
        return StepResult(value=ConfidenceAssessment(confidence=0.1), usage=None)


async def wait_entered(blocked: Blocking | BlockingIndex) -> None:
    if isinstance(blocked, BlockingIndex):
        await asyncio.wait_for(asyncio.to_thread(blocked.entered.wait, HANG_S), HANG_S)
    else:
        await asyncio.wait_for(blocked.entered.wait(), HANG_S)


async def settle(rounds: int = 50) -> None:
    """Let every ready task run (a scripted pause counted in loop passes, not seconds)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


def adaptive_pipeline(index: Any, steps: Any, clock: AlarmClock) -> Pipeline:
    # The strategy's own soft limit on deeper rounds is set out of the way: this is the turn's.
    strategy = AdaptiveDepthStrategy(index, steps, timeout_s=HANG_S, clock=MonotonicClock())
    return Pipeline(
        strategy,
        steps,
        timeout_s=LIMIT_S,
        clock=clock,
        decision_log=DecisionLog(":memory:"),
        default_power="auto",
    )


@pytest.mark.parametrize(
    ("where", "status", "stop_reason"),
    [
        ("rewrite", 504, "timeout:rewrite"),
        ("classify", 504, "timeout:classify"),
        ("first-search", 504, "timeout:search"),
        ("assess", 200, "timeout:assess"),
        ("second-round-search", 200, "timeout:search"),
        ("generate", 200, "timeout:generate"),
    ],
)
async def test_the_limit_cuts_any_step_and_says_which(
    where: str, status: int, stop_reason: str, fixture_index: PassageIndex
) -> None:
    clock = AlarmClock()
    steps = rule_steps()
    index: Any = fixture_index
    blocked: Blocking | BlockingIndex
    if where in ("first-search", "second-round-search"):
        blocked = index = BlockingIndex(fixture_index, on_call=1 if where == "first-search" else 2)
        steps = dataclasses.replace(steps, assess=Unsure())
    else:
        step = {"rewrite": "rewrite", "classify": "classify", "assess": "assess"}.get(
            where, "generate"
        )
        blocked = Blocking(getattr(steps, step))
        steps = dataclasses.replace(steps, **{step: blocked})
    pipeline = adaptive_pipeline(index, steps, clock)
    thread = "7d0f5b0e-2c36-4a8e-9d7c-0c1b7ad1c001"
    try:
        async with api(create_app(pipeline)) as client:
            if where == "rewrite":  # the rewrite step runs only on a follow-up
                first = await client.post(
                    "/api/ask",
                    json={"question": "What does Old Soldier cost?", "thread_id": thread},
                )
                assert first.status_code == 200, first.text
            body = {"question": QUESTION if where != "rewrite" else "What does it halve?"}
            request = asyncio.create_task(
                client.post("/api/ask", json={**body, "thread_id": thread})
            )
            await wait_entered(blocked)
            clock.advance(LIMIT_S - 0.1)
            await settle()
            assert not request.done()  # under the limit: still waiting for the step
            clock.advance(0.2)
            response = await asyncio.wait_for(request, HANG_S)
    finally:
        if isinstance(blocked, BlockingIndex):
            blocked.release.set()
    data = response.json()
    assert response.status_code == status, data
    assert data["stop_reason"] == stop_reason
    assert pipeline.decision_log is not None
    record = pipeline.decision_log.get(data["request_id"])
    assert record is not None and record.stop_reason == stop_reason
    cut = [s.step for s in record.steps if s.cut]
    assert cut == [stop_reason.removeprefix("timeout:")]
    if isinstance(blocked, Blocking):
        assert blocked.cut == 1  # the step was cancelled, not left running
    if status == 504:
        assert record.status == "timeout"
        assert f"cut during {cut[0]}" in data["error"] and "5 s limit" in data["error"]
        return
    assert record.status == "partial" and data["timed_out"] is True
    assert "No answer was written within the 5 s time limit" in data["answer"]
    assert data["sources"], "a partial answer lists the passages found so far"
    if where == "generate":  # retrieval finished: its rounds are in the log
        assert [r.decision for r in record.rounds] == [h["adaptive_decision"] for h in data["hops"]]
        assert record.rounds and record.rounds[-1].chunks == len(data["sources"])


async def test_under_the_limit_nothing_is_cut(fixture_index: PassageIndex) -> None:
    clock = AlarmClock()
    steps = rule_steps()
    pipeline = adaptive_pipeline(fixture_index, steps, clock)
    result = await asyncio.wait_for(pipeline.ask(QUESTION), HANG_S)
    assert not result.timed_out and result.stop_reason == "sufficient"
    assert result.decision_log is not None
    ran = [s.step for s in result.decision_log.steps]
    assert ran[:3] == ["wait_for_thread", "classify", "search"] and ran[-1] == "generate"
    assert all(s.latency_s is not None and not s.cut for s in result.decision_log.steps)


async def test_a_cut_while_waiting_for_the_thread_is_the_wait(fixture_index: PassageIndex) -> None:
    clock = AlarmClock()
    blocked = Blocking(rule_steps().generate)
    steps = dataclasses.replace(rule_steps(), generate=blocked)
    pipeline = adaptive_pipeline(fixture_index, steps, clock)
    first = asyncio.create_task(pipeline.ask(QUESTION, "t"))
    await wait_entered(blocked)
    second = asyncio.create_task(pipeline.ask("What does Old Soldier cost?", "t"))
    await settle()
    clock.advance(LIMIT_S + 1)  # both turns run out: the first in generate, the second waiting
    done = await asyncio.wait_for(first, HANG_S)
    assert done.stop_reason == "timeout:generate"
    with pytest.raises(Exception, match="cut during wait_for_thread") as raised:
        await asyncio.wait_for(second, HANG_S)
    assert getattr(raised.value, "stop_reason", None) == "timeout:wait_for_thread"
    assert len(pipeline.locks) == 0


async def test_the_real_clock_cuts_a_hung_step(fixture_index: PassageIndex) -> None:
    """The default clock (asyncio.wait_for) ends a turn whose step never returns."""
    blocked = Blocking(rule_steps().generate)
    steps = dataclasses.replace(rule_steps(), generate=blocked)
    strategy = AdaptiveDepthStrategy(fixture_index, steps)
    pipeline = Pipeline(strategy, steps, timeout_s=0.5)
    result = await asyncio.wait_for(pipeline.ask(QUESTION), HANG_S)  # hang guard only
    assert result.timed_out and result.stop_reason == "timeout:generate"
    assert blocked.cut == 1


def test_the_limit_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CAPRAG_REQUEST_TIMEOUT_S", raising=False)
    assert load_settings().request_timeout_s is None  # each strategy's own
    monkeypatch.setenv("CAPRAG_REQUEST_TIMEOUT_S", "12.5")
    assert load_settings().request_timeout_s == 12.5
    monkeypatch.setenv("CAPRAG_REQUEST_TIMEOUT_S", "off")
    assert load_settings().request_timeout_s == "off"
    monkeypatch.setenv("CAPRAG_REQUEST_TIMEOUT_S", "0")
    with pytest.raises(Exception, match="CAPRAG_REQUEST_TIMEOUT_S='0'"):
        load_settings()


async def test_the_served_pipeline_takes_the_limit_from_the_settings(
    fixture_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from caprag.serve.services import build_pipeline

    monkeypatch.setenv("CAPRAG_REQUEST_TIMEOUT_S", "7")
    monkeypatch.setenv("CAPRAG_DECISION_LOG", str(fixture_env / "log.db"))
    pipeline = build_pipeline(load_settings())
    assert pipeline.timeout_s == 7.0
    result = await asyncio.wait_for(pipeline.ask(QUESTION), HANG_S)
    assert result.decision_log is not None and result.decision_log.timeout_s == 7.0
    await pipeline.aclose()


async def test_the_chat_page_shows_a_cut_turn(fixture_index: PassageIndex) -> None:
    clock = AlarmClock()
    blocked = Blocking(rule_steps().generate)
    steps = dataclasses.replace(rule_steps(), generate=blocked)
    pipeline = adaptive_pipeline(fixture_index, steps, clock)
    form = {"question": QUESTION, "thread_id": "7d0f5b0e-2c36-4a8e-9d7c-0c1b7ad1c002"}
    async with api(create_app(pipeline)) as client:
        request = asyncio.create_task(client.post("/chat", data=form))
        await wait_entered(blocked)
        clock.advance(LIMIT_S)
        fragment = (await asyncio.wait_for(request, HANG_S)).text
    assert "time limit reached (timeout:generate): no answer generated" in fragment
    assert "No answer was written within the 5 s time limit (cut during generate)" in fragment
    assert "Was this answer enough?" in fragment  # a cut answer can be rated too


async def test_a_failed_turn_is_logged_as_an_error_not_a_timeout(
    fixture_index: PassageIndex,
) -> None:
    from caprag.errors import LLMCallError
    from tests.reliability.test_serving import RaisingGenerator

    steps = dataclasses.replace(
        rule_steps(), generate=RaisingGenerator(LLMCallError("generate: HTTP 500"))
    )
    pipeline = adaptive_pipeline(fixture_index, steps, AlarmClock())
    with pytest.raises(LLMCallError):
        await asyncio.wait_for(pipeline.ask(QUESTION), HANG_S)
    assert pipeline.decision_log is not None
    [record] = pipeline.decision_log.records()
    assert (record.status, record.stop_reason) == ("error", "error:LLMCallError")
    assert not any(s.cut for s in record.steps)
    assert [s.step for s in record.steps][-1] == "generate"
    assert record.steps[-1].latency_s is not None  # it ended (failing); nothing was cut


async def test_a_timeout_error_of_a_step_is_not_the_limit(fixture_index: PassageIndex) -> None:
    """Without a limit, a step's own TimeoutError reaches the caller unchanged."""
    from tests.reliability.test_serving import RaisingGenerator

    steps = dataclasses.replace(rule_steps(), generate=RaisingGenerator(TimeoutError("socket")))
    pipeline = Pipeline(AdaptiveDepthStrategy(fixture_index, steps), steps)
    with pytest.raises(TimeoutError, match="socket"):
        await asyncio.wait_for(pipeline.ask(QUESTION), HANG_S)
