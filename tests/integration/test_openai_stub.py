"""The OpenAI-protocol stub: unscripted, driven through the real `openai` backend; scripted, reply
by reply; and its command line."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from caprag.schemas import Document
from caprag.steps.analyze import SufficiencyDecision
from caprag.steps.assess import ConfidenceAssessment
from caprag.steps.classify import QueryClass
from caprag.steps.generate import GeneratedAnswer
from experiments.support.openai_stub import StubServer, fill, fill_schema
from tests.fakes import openai_steps, serve

HANG_S = 600  # only catches a hang; every request here is answered at once or on purpose never
ASK = {"model": "m", "messages": [{"role": "user", "content": "Question: Why?"}]}

DOCS = [
    Document(
        passage_id="core/torches",
        book_id="core",
        book_short="Core",
        section="Torches",
        page=12,
        text="A torch burns for one hour. See Light, p. 13.",
    ),
    Document(
        passage_id="core/light",
        book_id="core",
        book_short="Core",
        section="Light",
        page=13,
        text="Bright light reaches 20 feet.",
    ),
]


@pytest.fixture
def stub() -> Iterator[StubServer]:
    yield from serve()


async def test_every_backend_step_parses_and_costs_one_request(stub: StubServer) -> None:
    llm = openai_steps(api_key="x", base_url=stub.base_url)
    question = "How long does a torch burn?"

    async def once(call: object) -> object:
        stub.reset()
        result = await call  # type: ignore[misc]
        assert stub.requests == 1, f"{stub.requests} requests for one call"
        assert result.usage.counted == "reported"
        assert result.usage.prompt_tokens > 0 and result.usage.completion_tokens > 0
        return result.value

    expanded = await once(llm.expand(question, 3))
    assert expanded == [question]
    decision = await once(llm.analyze(question, DOCS, [question]))
    assert isinstance(decision, SufficiencyDecision)
    assert decision.sufficient is True and decision.new_queries == [question]
    answer = await once(llm.generate(question, DOCS))
    assert isinstance(answer, GeneratedAnswer) and answer.answer == question
    kind = await once(llm.classify(question))
    assert isinstance(kind, QueryClass) and kind.query_type == "factual"
    assessment = await once(llm.assess(question, DOCS))
    assert isinstance(assessment, ConfidenceAssessment)
    assert 0.0 <= assessment.confidence <= 1.0
    rewritten = await once(llm.rewrite("and how far?", [(question, "One hour.")]))
    assert rewritten == "and how far?"

    assert "tools" not in stub.bodies[0]  # the rewrite is a plain chat completion


async def test_structured_requests_carry_the_forced_tool(stub: StubServer) -> None:
    llm = openai_steps(api_key="x", base_url=stub.base_url)
    await llm.classify("Can I dodge after a Flurry?")
    body = stub.bodies[-1]
    assert body["tools"][0]["function"]["name"] == "QueryClass"
    assert body["tool_choice"]["function"]["name"] == "QueryClass"


async def test_concurrent_requests_overlap() -> None:
    # Every request is held until all 16 are in flight: no clock involved, a busy machine only
    # makes it slower.
    with StubServer(hold_until=16) as stub:
        limits = httpx.Limits(max_connections=16)
        async with httpx.AsyncClient(
            base_url=stub.base_url, timeout=HANG_S, limits=limits
        ) as client:
            body = {"model": "m", "messages": [{"role": "user", "content": "Say hi"}]}
            replies = await asyncio.gather(
                *(client.post("/chat/completions", json=body) for _ in range(16))
            )
    assert all(r.status_code == 200 for r in replies)
    assert stub.requests == 16
    assert stub.max_in_flight == 16, "the 16 requests were not all in flight at once"


def test_json_object_mode_fills_the_schema_in_the_prompt(stub: StubServer) -> None:
    schema = {
        "type": "object",
        "properties": {
            "statements": {"type": "array", "items": {"type": "string"}},
            "verdict": {"type": "integer", "minimum": 0, "maximum": 1},
        },
    }
    prompt = f"Judge it.\nJSON Schema: {json.dumps(schema)}\nQuestion: Is fire hot?"
    reply = httpx.post(
        f"{stub.base_url}/chat/completions",
        json={
            "model": "judge",
            "messages": [{"role": "user", "content": prompt}],
            "response_format": {"type": "json_object"},
        },
    ).json()
    assert json.loads(reply["choices"][0]["message"]["content"]) == {
        "statements": ["Is fire hot?"],
        "verdict": 1,
    }
    assert reply["usage"]["prompt_tokens"] == len(prompt.split())


def test_fill_respects_refs_choices_bounds_and_lengths() -> None:
    schema = {
        "$defs": {"Kind": {"enum": ["decision", "factual"]}},
        "type": "object",
        "properties": {
            "kind": {"$ref": "#/$defs/Kind"},
            "maybe": {"anyOf": [{"type": "null"}, {"type": "number", "maximum": 0.5}]},
            "count": {"type": "integer", "minimum": 3},
            "share": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "tags": {"type": "array", "minItems": 2, "items": {"type": "string"}},
            "short": {"type": "string", "maxLength": 4},
        },
    }
    assert fill(schema, "torch light") == {
        "kind": "decision",
        "maybe": 0.5,
        "count": 3,
        "share": 0.5,
        "tags": ["torch light", "torch light 1"],
        "short": "torc",
    }
    assert fill_schema("no schema here", "x") == {}


def test_cli_prints_its_url_and_serves_until_killed() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "experiments.openai_stub", "--port", "0", "--latency", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        base_url = process.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        reply = httpx.post(
            f"{base_url}/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "Question: Why?"}]},
            timeout=HANG_S,
        )
        assert reply.json()["choices"][0]["message"]["content"] == "Why?"
        assert httpx.get(f"{base_url}/stats", timeout=HANG_S).json()["requests"] == 1
    finally:
        process.terminate()
        process.wait(timeout=HANG_S)


def test_a_script_is_played_in_order_then_the_default() -> None:
    script = [{"content": "first"}, {"status": 429, "retry_after": 2}, {"cut_body": {"auto": True}}]
    with StubServer(script, default=None) as stub, httpx.Client(timeout=HANG_S) as client:
        url = f"{stub.base_url}/chat/completions"
        first = client.post(url, json=ASK)
        limited = client.post(url, json=ASK)
        cut = client.post(url, json=ASK)
        unforeseen = client.post(url, json=ASK)
    assert first.json()["choices"][0]["message"]["content"] == "first"
    assert first.json()["usage"] == {
        "prompt_tokens": 42,
        "completion_tokens": 7,
        "total_tokens": 49,
    }
    assert (limited.status_code, limited.headers["retry-after"]) == (429, "2")
    with pytest.raises(json.JSONDecodeError):
        cut.json()
    assert unforeseen.status_code == 500
    assert unforeseen.json()["error"]["message"] == "stub has no scripted reply"
    assert stub.requests == 4 and [b["model"] for b in stub.bodies] == ["m"] * 4


def test_a_script_can_follow_with_automatic_replies_and_name_the_key() -> None:
    with StubServer([{"status": 401, "echo_key": True}]) as stub:
        headers = {"authorization": "Bearer sk-test"}
        refused = httpx.post(
            f"{stub.base_url}/chat/completions", json=ASK, headers=headers, timeout=HANG_S
        )
        answered = httpx.post(f"{stub.base_url}/chat/completions", json=ASK, timeout=HANG_S)
    assert refused.json()["error"]["message"] == "Incorrect API key provided: Bearer sk-test"
    assert answered.json()["choices"][0]["message"]["content"] == "Why?"


def test_a_hanging_reply_waits_for_the_stop_not_for_a_clock() -> None:
    stub = StubServer(default={"hang": True}, latency_s=3600).start()
    outcome: list[BaseException] = []

    def ask() -> None:
        try:
            httpx.post(f"{stub.base_url}/chat/completions", json=ASK, timeout=HANG_S)
        except httpx.HTTPError as exc:
            outcome.append(exc)

    asking = threading.Thread(target=ask)
    asking.start()
    guard = time.monotonic() + HANG_S
    while stub.in_flight < 1:  # a condition polled: the request arrived and waits
        assert time.monotonic() < guard, "the request never reached the stub"
        time.sleep(0.01)
    stub.stop()  # ends the hour of latency and the hang at once
    asking.join(HANG_S)
    assert not asking.is_alive()
    assert [type(e) for e in outcome] == [httpx.RemoteProtocolError]
