"""The openai backend's thin call path against LangChain's runnables, over real HTTP on 127.0.0.1.

Both paths are played the same scripted replies by their own stub: the requests the stub records
must be the same, and so must every value, usage record (latency aside) and error that comes out.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from caprag.llm import StructuredClient, build_openai_client
from caprag.llm.client import LangChainCalls
from caprag.llm.openai import OpenAICalls
from caprag.steps.analyze import ANALYZE, SufficiencyDecision, prompt_values
from caprag.steps.rewrite import REWRITE
from experiments.perf.openai_stub import StubServer

GOOD_ARGS = {"args": {"sufficient": True, "new_queries": ["Old Soldier"], "reasoning": "ref"}}
GOOD_JSON = {"content": '{"sufficient": false, "new_queries": ["Old Soldier"], "reasoning": "r"}'}
CUT_AT_CAP = {
    "content": '{"sufficient": false, "new_queries": ["Old',
    "finish": "length",
    "usage": {"prompt_tokens": 50, "completion_tokens": 16},
}
STRUCTURED = {
    "function_calling": [
        [GOOD_ARGS],
        [{"args": {"sufficient": False, "new_queries": ["a", "b", "c", "d", "e"]}}],
        [{"malformed": "{not json"}, GOOD_ARGS],
        [{"content": "no tool call at all"}, GOOD_ARGS],
        [{"args": {"sufficient": "maybe", "new_queries": "x"}}, GOOD_ARGS],
        [{"empty_choices": True}, GOOD_ARGS],
        [{"cut_body": GOOD_ARGS}, GOOD_ARGS],
        [{"args": {"sufficient": True}, "usage": {"prompt_tokens": 9, "completion_tokens": 3}}],
        [{"malformed": "nope"}] * 3,
        [{"status": 401}],
        [{"status": 500}, {"status": 429}, GOOD_ARGS],
    ],
    "json_schema": [
        [GOOD_JSON],
        [CUT_AT_CAP, GOOD_JSON],
        [{"content": "{not json"}, GOOD_JSON],
        [{"content": '```json\n{"sufficient": true}\n```'}],
        [{"content": '{"confidence": -1}'}, GOOD_JSON],
        [{"empty_choices": True}, GOOD_JSON],
        [{"cut_body": GOOD_JSON}, GOOD_JSON],
        [CUT_AT_CAP] * 3,
    ],
    "json_mode": [[GOOD_JSON], [{"content": "{not json"}, GOOD_JSON]],
}
CASES = [
    pytest.param(method, script, id=f"{method}-{n}")
    for method, scripts in STRUCTURED.items()
    for n, script in enumerate(scripts)
]


def clients(base_url: str, method: str) -> tuple[StructuredClient, StructuredClient]:
    """The openai backend as built (thin path), and the same chat model through LangChain."""
    thin = build_openai_client(
        "gpt-4o-mini",
        api_key="k",
        base_url=base_url,
        structured_method=method,
        max_retries=2,
        seed=7,
        parse_attempts=3,
    )
    assert isinstance(thin.calls, OpenAICalls)
    langchain = StructuredClient(
        thin.chat,
        thin.model,
        structured_method=method,
        parse_attempts=3,
        backend="openai",
        calls=LangChainCalls(thin.chat),
    )
    return thin, langchain


def outcome(call: Any) -> tuple[str, Any]:
    """What a call gave: its value and usage (latency aside), or its error and that usage."""
    try:
        value, usage = asyncio.run(call)
    except Exception as exc:  # compared, not swallowed: both paths must raise the same
        usage = getattr(exc, "usage", None)
        spent = usage.model_dump(exclude={"latency_s", "started_at"}) if usage is not None else None
        return "error", (type(exc).__name__, str(exc), spent)
    shown = value.model_dump() if hasattr(value, "model_dump") else value
    return "value", (shown, usage.model_dump(exclude={"latency_s", "started_at"}))


def played(
    script: list[dict[str, Any]], method: str, path: int, ask: Any
) -> tuple[tuple[str, Any], list[dict[str, Any]]]:
    with StubServer(script, default=None) as stub:
        client = clients(stub.base_url, method)[path]
        return outcome(ask(client)), stub.bodies


@pytest.mark.parametrize(("method", "script"), CASES)
def test_a_structured_call_sends_and_returns_what_langchain_does(
    method: str, script: list[dict[str, Any]]
) -> None:
    values = prompt_values("What does Rapid Strike do?", [], ["Rapid Strike"], 3)

    def ask(client: StructuredClient) -> Any:
        return client.structured("analyze", ANALYZE, SufficiencyDecision, **values)

    thin, thin_requests = played(script, method, 0, ask)
    langchain, langchain_requests = played(script, method, 1, ask)
    assert thin_requests == langchain_requests
    assert thin_requests and thin_requests[0]["max_tokens"] == 512
    assert thin == langchain


@pytest.mark.parametrize(
    "script",
    [[{"content": "What does Old Soldier cost?"}], [{"empty_choices": True}, {"content": '"q"'}]],
    ids=["text", "unreadable-then-text"],
)
def test_a_plain_call_sends_and_returns_what_langchain_does(script: list[dict[str, Any]]) -> None:
    def ask(client: StructuredClient) -> Any:
        return client.text("rewrite", REWRITE, question="and its cost?", history="User: Old")

    thin, thin_requests = played(script, "function_calling", 0, ask)
    langchain, langchain_requests = played(script, "function_calling", 1, ask)
    assert thin_requests == langchain_requests and "tools" not in thin_requests[0]
    assert thin == langchain
