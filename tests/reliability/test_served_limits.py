"""Served limits that fit a real model (issue 31, point 3): retrieval is bounded per strategy,
generation has its own allowance, and a retrieval cut by its limit still answers from what it
found.

The model is the OpenAI-protocol stub answering "in 2 s per call": each call moves the service's
clock by 2 s (the stub's `on_request` hook) and costs no real time. No assertion reads the wall
clock; waits are hang guards only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from caprag.__main__ import render
from caprag.config import load_settings
from caprag.retrieval.store import PassageIndex
from caprag.serve.api import create_app
from caprag.serve.decision_log import DecisionLog
from caprag.serve.services import Pipeline, served_limits
from caprag.strategies import STRATEGIES, MultiHopStrategy
from experiments.support.openai_stub import AUTO, Reply, StubServer
from tests.fakes import openai_steps
from tests.reliability.test_request_timeout import AlarmClock, settle
from tests.reliability.test_serving import api

HANG_S = 600  # only catches a hang
CALL_S = 2.0  # a hosted model's latency for a structured reply
MORE: Reply = {
    "args": {
        "sufficient": False,
        "new_queries": ["Old Soldier cost", "torch burn time"],
        "reasoning": "need more",
    }
}
"""The analyzer asks for more (every hop)."""
FIRST = [MORE, MORE, AUTO]  # analyze hop 1, analyze hop 2, generate (hop 3 is the last)
FOLLOW_UP = [AUTO, MORE, MORE, AUTO]  # + the rewrite
QUESTION = "How long does a torch burn?"


class CallTime:
    """The stub's scripted latency on the service's clock: each call moves it by `seconds`, in
    the service's event loop, and lets the service react before the reply is sent."""

    def __init__(self, clock: AlarmClock, seconds: float) -> None:
        self.clock = clock
        self.seconds = seconds
        self.loop: asyncio.AbstractEventLoop | None = None

    def __call__(self, body: Any) -> None:
        assert self.loop is not None
        asyncio.run_coroutine_threadsafe(self._advance(), self.loop).result(HANG_S)

    async def _advance(self) -> None:
        self.clock.advance(self.seconds)
        await settle()  # a limit that ran out cuts the call before its reply arrives


@pytest.fixture
def clock() -> AlarmClock:
    return AlarmClock()


@pytest.fixture
def stub(clock: AlarmClock) -> Iterator[StubServer]:
    timing = CallTime(clock, CALL_S)
    with StubServer(FIRST + FOLLOW_UP, AUTO, on_request=timing) as server:
        server.timing = timing  # type: ignore[attr-defined]
        yield server


def multi_hop(
    index: PassageIndex,
    stub: StubServer,
    clock: AlarmClock,
    timeout_s: float | None,
    generation_timeout_s: float | None,
) -> Pipeline:
    stub.timing.loop = asyncio.get_running_loop()  # type: ignore[attr-defined]
    steps = openai_steps("gpt-4o-mini", api_key="sk-test", base_url=stub.base_url)
    return Pipeline(
        MultiHopStrategy(index, steps),
        steps,
        timeout_s=timeout_s,
        generation_timeout_s=generation_timeout_s,
        clock=clock,
        decision_log=DecisionLog(":memory:"),
    )


def test_each_strategy_s_default_covers_its_call_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retrieval: adaptive keeps 5 s; the others (1 rewrite + their bound) x 3 s + 2 s."""
    monkeypatch.delenv("CAPRAG_REQUEST_TIMEOUT_S", raising=False)
    monkeypatch.delenv("CAPRAG_GENERATION_TIMEOUT_S", raising=False)
    settings = load_settings()
    steps = openai_steps("gpt-4o-mini", api_key="sk-test", base_url="http://127.0.0.1:9/v1")
    limits = {
        name: served_limits(STRATEGIES.choose(name)(None, steps), settings)  # type: ignore[arg-type]
        for name in ("single", "multi-question", "multi-hop", "adaptive")
    }
    assert limits == {
        "single": (5.0, 5.0),
        "multi-question": (8.0, 5.0),
        "multi-hop": (11.0, 5.0),
        "adaptive": (5.0, 5.0),
    }
    monkeypatch.setenv("CAPRAG_REQUEST_TIMEOUT_S", "7")
    monkeypatch.setenv("CAPRAG_GENERATION_TIMEOUT_S", "3")
    hop = STRATEGIES.choose("multi-hop")(None, steps)  # type: ignore[arg-type]
    assert served_limits(hop, load_settings()) == (7.0, 3.0)
    monkeypatch.setenv("CAPRAG_REQUEST_TIMEOUT_S", "off")
    assert served_limits(hop, load_settings()) == (None, None)


async def test_multi_hop_at_2_s_per_call_answers_every_turn(
    fixture_index: PassageIndex, stub: StubServer, clock: AlarmClock
) -> None:
    """The issue's case: the analyzer asks for more at every hop, each call takes 2 s."""
    retrieval_s, generation_s = 11.0, 5.0  # multi-hop's defaults (test above)
    pipeline = multi_hop(fixture_index, stub, clock, retrieval_s, generation_s)
    thread = "5f0b8e57-0d0e-4f55-9a55-3f7f2f1a0001"
    async with api(create_app(pipeline)) as client:
        first = await client.post("/api/ask", json={"question": QUESTION, "thread_id": thread})
        calls_first = stub.requests
        second = await client.post(
            "/api/ask", json={"question": "And what does it cost?", "thread_id": thread}
        )
    for response in (first, second):
        data = response.json()
        assert response.status_code == 200, data
        assert data["answer_status"] == "generated" and not data["timed_out"], data
        assert data["answer"] and not data["answer"].startswith("No answer")
        assert [u["step"] for u in data["usage"]][-1] == "generate"
    assert calls_first == 3  # two analyses that asked for more, then generation
    assert stub.requests == 7  # + the follow-up's rewrite, two analyses and generation
    assert len(await pipeline.conversation(thread)) == 2


async def test_the_old_single_5_s_limit_cut_the_same_turn(
    fixture_index: PassageIndex, stub: StubServer, clock: AlarmClock
) -> None:
    """The control: one 5 s bound for the whole turn cuts generation (what the issue saw)."""
    pipeline = multi_hop(fixture_index, stub, clock, 5.0, None)
    result = await asyncio.wait_for(pipeline.ask(QUESTION), HANG_S)
    assert result.timed_out and result.stop_reason == "timeout:generate"
    assert result.answer_status == "not_generated"


async def test_a_retrieval_cut_by_its_limit_still_generates(
    fixture_index: PassageIndex, stub: StubServer, clock: AlarmClock
) -> None:
    pipeline = multi_hop(fixture_index, stub, clock, 3.0, 5.0)  # the 2nd analysis ends at 4 s
    thread = "5f0b8e57-0d0e-4f55-9a55-3f7f2f1a0002"
    result = await asyncio.wait_for(pipeline.ask(QUESTION, thread), HANG_S)
    assert result.timed_out and result.stop_reason == "timeout:analyze"
    assert result.answer_status == "generated_after_cut"
    assert result.answer and result.context, "generated from the passages found"
    assert result.usage[-1].step == "generate" and not result.usage[-1].error
    assert result.decision_log is not None and result.decision_log.status == "answered"
    assert [s.step for s in result.decision_log.steps if s.cut] == ["analyze"]
    assert "retrieval cut by its 3 s limit (timeout:analyze); answer generated" in render(result)
    turns = await pipeline.conversation(thread)
    assert len(turns) == 1 and turns[0].answer == result.answer  # kept in memory like any


async def test_no_answer_in_the_generation_allowance_says_so(
    fixture_index: PassageIndex, stub: StubServer, clock: AlarmClock
) -> None:
    pipeline = multi_hop(fixture_index, stub, clock, 11.0, 1.0)  # generation takes 2 s
    async with api(create_app(pipeline)) as client:
        response = await client.post("/api/ask", json={"question": QUESTION})
        page = await client.post(
            "/chat",
            data={"question": QUESTION, "thread_id": "5f0b8e57-0d0e-4f55-9a55-3f7f2f1a0003"},
        )
    data = response.json()
    assert response.status_code == 200, data
    assert data["answer_status"] == "not_generated" and data["timed_out"]
    assert data["stop_reason"] == "timeout:generate" and data["sources"]
    assert data["answer"].startswith(
        "No answer was generated: the 1 s generation allowance ran out (retrieval finished)"
    )
    assert "no answer generated" in page.text


async def test_a_model_missing_from_the_price_table_costs_unknown_not_0(
    fixture_index: PassageIndex,
) -> None:
    """Issue 31, point 5: the API, the CLI and the decision log say the cost is unknown."""
    with StubServer() as server:
        steps = openai_steps("my-finetune-7b", api_key="sk-test", base_url=server.base_url)
        pipeline = Pipeline(
            MultiHopStrategy(fixture_index, steps, max_hops=1),
            steps,
            decision_log=DecisionLog(":memory:"),
        )
        async with api(create_app(pipeline)) as client:
            response = await client.post("/api/ask", json={"question": QUESTION})
        result = await asyncio.wait_for(pipeline.ask(QUESTION), HANG_S)
    data = response.json()
    assert response.status_code == 200, data
    assert data["cost_usd"] is None and data["prompt_tokens"] > 0
    assert all(u["cost_usd"] is None for u in data["usage"] if u["model"] == "my-finetune-7b")
    assert result.cost_usd is None and "cost unknown" in render(result)
    assert result.decision_log is not None and result.decision_log.cost_usd is None
