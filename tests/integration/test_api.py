"""The JSON API and the chat page: threads, validation with clear 4xx messages."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from caprag.retrieval.store import PassageIndex
from caprag.serve.api import create_app
from caprag.serve.services import Pipeline
from caprag.steps import rule_steps
from caprag.strategies import MultiHopStrategy


@pytest.fixture
def client(fixture_index: PassageIndex) -> Iterator[TestClient]:
    llm = rule_steps()
    app = create_app(Pipeline(MultiHopStrategy(fixture_index, llm, k=2), llm))
    with TestClient(app, base_url="http://127.0.0.1") as test_client:
        yield test_client


def test_ask_without_thread_makes_a_new_isolated_thread(client: TestClient) -> None:
    first = client.post("/api/ask", json={"question": "What does Old Soldier cost?"}).json()
    other = client.post("/api/ask", json={"question": "What does it halve?"}).json()
    assert uuid.UUID(first["thread_id"]) and first["thread_id"] != other["thread_id"]
    assert other["main_question"] == "What does it halve?"  # no history on a new thread
    assert first["sources"][0]["passage_id"] == "gifts/old-soldier"
    assert first["hop_count"] >= 1 and first["prompt_tokens"] > 0 and first["latency_s"] > 0


def test_follow_up_on_the_same_thread(client: TestClient) -> None:
    first = client.post("/api/ask", json={"question": "What does Old Soldier cost?"}).json()
    second = client.post(
        "/api/ask",
        json={"question": "What penalty does it halve?", "thread_id": first["thread_id"]},
    ).json()
    assert second["thread_id"] == first["thread_id"]
    assert second["main_question"] == "What penalty does Old Soldier halve?"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"question": "   "}, "question: the question is empty"),
        ({"question": "x" * 4001}, "longer than 4000 characters"),
        ({"question": "ok?", "thread_id": "not-a-uuid"}, "thread_id must be a UUID"),
        ({}, "question: Field required"),
    ],
)
def test_bad_input_is_a_clear_4xx(
    client: TestClient, body: dict[str, object], message: str
) -> None:
    response = client.post("/api/ask", json=body)
    assert response.status_code == 422
    assert message in response.json()["error"]


def test_malformed_json_is_a_clear_4xx_and_the_server_keeps_serving(client: TestClient) -> None:
    response = client.post(
        "/api/ask",
        content=b'{"question": "unterminated',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 422
    assert "not valid JSON" in response.json()["error"]
    assert (
        client.post("/api/ask", json={"question": "How long does a torch burn?"}).status_code == 200
    )


def test_page_and_fragment(client: TestClient) -> None:
    page = client.get("/").text
    assert "/static/vendor/htmx-2.0.11.min.js" in page and "crypto.randomUUID()" in page
    assert 'name="thread_id"' in page
    assert client.get("/static/vendor/htmx-2.0.11.min.js").status_code == 200
    thread = str(uuid.uuid4())
    fragment = client.post(
        "/chat", data={"question": "How long does a torch burn?", "thread_id": thread}
    ).text
    assert "one hour" in fragment and "Pebble Saga Basics, p. 5" in fragment
    assert "hop(s)" in fragment and "tokens" in fragment
    bad = client.post("/chat", data={"question": "x", "thread_id": "nope"})
    assert bad.status_code == 422


def test_openapi_docs_are_served(client: TestClient) -> None:
    assert client.get("/docs").status_code == 200
    assert "/api/ask" in client.get("/openapi.json").json()["paths"]


def test_power_is_validated(client: TestClient) -> None:
    response = client.post("/api/ask", json={"question": "ok?", "power": 7})
    assert response.status_code == 422
    assert "power must be auto, 1, 2 or 3" in response.json()["error"]


def test_forced_power_on_the_adaptive_strategy(fixture_index: PassageIndex) -> None:
    from caprag.strategies import STRATEGIES

    llm = rule_steps()
    app = create_app(Pipeline(STRATEGIES["adaptive"](fixture_index, llm), llm))
    with TestClient(app, base_url="http://127.0.0.1") as adaptive:
        body = {"question": "How long does a torch burn?", "power": 2}
        data = adaptive.post("/api/ask", json=body).json()
        assert data["hops"][-1]["depth"] == 2
        assert data["hops"][-1]["adaptive_decision"] == "forced_depth"
        page = adaptive.post(
            "/chat",
            data={
                "question": "How long does a torch burn?",
                "thread_id": str(uuid.uuid4()),
                "power": "3",
            },
        ).text
        assert "depth used 3/3" in page and "confidence" in page
