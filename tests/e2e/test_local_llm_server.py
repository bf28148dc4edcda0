"""The real local llama.cpp server (experiments/perf/local_llm.py) speaks the OpenAI protocol the
project relies on: forced tool calls, usage, and a token cap. Loopback only; bounded requests."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip(
    "xllamacpp",
    reason="the local-llm group is not installed: uv sync --frozen --inexact --group local-llm",
)

from experiments.perf.local_llm import (
    ANSWER_SCHEMA,
    LocalServer,
    gguf_path,
    local_llm_server,
)

pytestmark = pytest.mark.slow

REQUEST_TIMEOUT_S = 600.0  # only catches a hang
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    log = tmp_path_factory.mktemp("local-llm") / "server.log"
    with local_llm_server(log_path=log) as running_server:
        yield running_server


@pytest.fixture(scope="module")
def client(server: LocalServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=REQUEST_TIMEOUT_S) as http:
        yield http


@pytest.fixture
def chat(client: httpx.Client, server: LocalServer) -> Callable[..., httpx.Response]:
    def send(**body: Any) -> httpx.Response:
        response = client.post("/chat/completions", json={"model": server.model, **body})
        assert response.status_code == 200, response.text
        return response

    return send


def test_the_model_ships_in_a_wheel() -> None:
    path = gguf_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000


def test_a_json_schema_reply_fits_the_schema(chat: Callable[..., httpx.Response]) -> None:
    """What caprag's json_schema structured output relies on: llama.cpp constrains the reply."""
    response = chat(
        messages=QUESTION,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA},
        },
        max_tokens=96,
    )
    reply = json.loads(response.json()["choices"][0]["message"]["content"])
    assert {"answer", "confidence"} <= reply.keys()
    assert isinstance(reply["answer"], str) and isinstance(reply["confidence"], int | float)


def test_usage_comes_back(chat: Callable[..., httpx.Response]) -> None:
    usage = chat(messages=QUESTION, max_tokens=32).json()["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_the_token_cap_is_honoured(chat: Callable[..., httpx.Response], field: str) -> None:
    story = [{"role": "user", "content": "Write a very long story about a dragon."}]
    reply = chat(messages=story, **{field: 16}).json()
    assert 0 < reply["usage"]["completion_tokens"] <= 16
