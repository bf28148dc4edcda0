"""The unscripted OpenAI-protocol stub, driven through the real `openai` backend."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from caprag.schemas import Document
from caprag.steps.analyze import SufficiencyDecision
from caprag.steps.assess import ConfidenceAssessment
from caprag.steps.classify import QueryClass
from caprag.steps.generate import GeneratedAnswer
from experiments.perf.openai_stub import StubServer, fill, fill_schema
from tests.fakes import openai_steps

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
    with StubServer() as server:
        yield server


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
        async with httpx.AsyncClient(base_url=stub.base_url, timeout=120, limits=limits) as client:
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
            timeout=10,
        )
        assert reply.json()["choices"][0]["message"]["content"] == "Why?"
        assert httpx.get(f"{base_url}/stats", timeout=10).json()["requests"] == 1
    finally:
        process.terminate()
        process.wait(timeout=10)
