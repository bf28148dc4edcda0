"""What a real OpenAI-protocol server receives, through the API as a user drives it: every step's
messages filled whole, for every strategy, on a first question and on a follow-up."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from caprag.config import load_settings
from caprag.serve.api import create_app
from caprag.serve.services import build_pipeline
from experiments.support.openai_stub import StubServer
from tests.fakes import serve

PLACEHOLDER = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")
FIRST = "What penalty does the second attack of a Flurry suffer?"
FOLLOW_UP = "And what does it cost?"
EXPECTED_STEPS = {
    "single": {"rewrite", "generate"},
    "multi-question": {"expand", "rewrite", "generate"},
    "multi-hop": {"expand", "analyze", "rewrite", "generate"},
    "adaptive": {"classify", "assess", "rewrite", "generate"},
    "ircot": {"reason", "rewrite", "generate"},
    "self-ask": {"ask", "rewrite", "generate"},
    "iter-retgen": {"rewrite", "generate"},
}


@pytest.fixture
def stub() -> Iterator[StubServer]:
    yield from serve()


def step_of(body: dict[str, object]) -> str:
    """Which step a request came from: its forced tool, or the plain-text rewrite."""
    tools = body.get("tools")
    if not tools:
        return "rewrite"
    name = tools[0]["function"]["name"]  # type: ignore[index]
    return {
        "Questions": "expand",
        "SufficiencyDecision": "analyze",
        "GeneratedAnswer": "generate",
        "QueryClass": "classify",
        "ConfidenceAssessment": "assess",
        "Thought": "reason",
        "SelfAskTurn": "ask",
    }[name]


@pytest.mark.parametrize("strategy", sorted(EXPECTED_STEPS))
def test_no_placeholder_reaches_the_server(
    strategy: str, stub: StubServer, fixture_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAPRAG_LLM", "openai")
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("OPENAI_BASE_URL", stub.base_url)
    monkeypatch.setenv("RETRIEVAL_STRATEGY", strategy)
    monkeypatch.setenv("CAPRAG_EXPAND_FIRST_HOP", "true")
    app = create_app(build_pipeline(load_settings()))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        first = client.post("/api/ask", json={"question": FIRST})
        assert first.status_code == 200, first.text
        thread = first.json()["thread_id"]
        second = client.post("/api/ask", json={"question": FOLLOW_UP, "thread_id": thread})
        assert second.status_code == 200, second.text
    assert stub.bodies, "no request reached the server"
    seen = set()
    for body in stub.bodies:
        seen.add(step_of(body))
        for message in body["messages"]:
            assert not PLACEHOLDER.search(message["content"]), (step_of(body), message)
        assert body["messages"][0]["role"] == "system" and body["messages"][1]["role"] == "user"
    assert seen == EXPECTED_STEPS[strategy]
    # What the trace keeps is what was sent.
    recorded = [u for u in second.json()["usage"] if u["messages"]]
    assert recorded and all(u["reply"] is not None for u in recorded)
    sent = [
        [{"role": m["role"], "content": m["content"]} for m in b["messages"]] for b in stub.bodies
    ]
    assert all(u["messages"] in sent for u in recorded)


def test_steps_mix_from_the_environment(
    stub: StubServer, fixture_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAPRAG_LLM", "openai")
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("OPENAI_BASE_URL", stub.base_url)
    monkeypatch.setenv("RETRIEVAL_STRATEGY", "multi-hop")
    monkeypatch.setenv("CAPRAG_ANALYZER", "rule")
    monkeypatch.setenv("CAPRAG_GENERATOR", "llm")
    app = create_app(build_pipeline(load_settings()))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        data = client.post("/api/ask", json={"question": FIRST}).json()
    assert {step_of(b) for b in stub.bodies} == {"generate"}
    models = {u["step"]: u["model"] for u in data["usage"]}
    assert models["analyze"] == "offline" and models["generate"] == "gpt-4o-mini"


def test_an_llm_step_without_a_model_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from caprag.errors import ConfigError

    monkeypatch.setenv("CAPRAG_CLASSIFIER", "llm")
    with pytest.raises(ConfigError, match="CAPRAG_CLASSIFIER=llm needs a language model"):
        load_settings()
    monkeypatch.setenv("CAPRAG_CLASSIFIER", "neural")
    with pytest.raises(ConfigError, match="CAPRAG_CLASSIFIER='neural'"):
        load_settings()


@pytest.mark.slow
def test_a_harness_run_keeps_every_call_as_sent_in_table_and_trace(
    tmp_path: Path, stub: StubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow

    from experiments.harness.run import run
    from tests.integration.test_harness import make_cfg

    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("OPENAI_BASE_URL", stub.base_url)
    cfg = make_cfg(
        tmp_path,
        "llm=openai",
        "dataset=single_book",
        "strategy=multi-hop",
        "experiment.ragas=false",
    )
    result = run(cfg)
    sent = [
        [{"role": m["role"], "content": m["content"]} for m in b["messages"]] for b in stub.bodies
    ]
    calls = [call for row in result.rows for call in row.calls or []]
    assert len(calls) == len(sent) > 0
    assert sorted(map(str, (c.messages for c in calls))) == sorted(map(str, sent))
    assert all(c.reply is not None and c.counted == "reported" for c in calls)
    traces = mlflow.search_traces(run_id=result.run_id, return_type="list")
    spans = [s for t in traces for s in t.data.spans if s.name.startswith("llm ")]
    assert sorted(map(str, (s.inputs["messages"] for s in spans))) == sorted(map(str, sent))
    assert {s.name for s in spans} == {"llm analyze", "llm generate"}
    # each reply is the span's output as an OpenAI chat completion (what the MLflow UI renders)
    replies = [s.outputs["choices"][0]["message"]["content"] for s in spans]
    assert sorted(replies) == sorted(c.reply or "" for c in calls) and all(replies)
