"""DNS rebinding and look-alike origins are refused.

Probe: a page on attacker.example whose DNS was rebound to 127.0.0.1 got 200 from `/chat`,
`/api/ask` and `/?thread_id=` (so it could read a conversation), because the Origin check
compared the Origin with the request's own Host header; `https://127.0.0.1:PORT` also counted as
the server's own origin of an http server.
"""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient

from caprag.config import load_settings
from caprag.retrieval.store import PassageIndex
from caprag.serve.api import create_app, host_allowed, split_host
from caprag.serve.services import Pipeline
from caprag.steps import rule_steps
from caprag.strategies import SingleQueryStrategy

PORT = 8765
SERVER = f"http://127.0.0.1:{PORT}"
REBOUND = f"attacker.example:{PORT}"
QUESTION = "How long does a torch burn?"


def client(index: PassageIndex, **settings: str) -> TestClient:
    steps = rule_steps()
    pipeline = Pipeline(SingleQueryStrategy(index, steps, k=2), steps)
    return TestClient(create_app(pipeline, load_settings(**settings)), base_url=SERVER)


def test_a_rebound_name_reaches_no_endpoint(fixture_index: PassageIndex) -> None:
    thread = str(uuid.uuid4())
    with client(fixture_index) as api:
        asked = api.post("/chat", data={"question": QUESTION, "thread_id": thread})
        assert asked.status_code == 200
        rebound = {"host": REBOUND, "origin": f"http://{REBOUND}"}
        answers = {
            "chat": api.post(
                "/chat", data={"question": QUESTION, "thread_id": thread}, headers=rebound
            ),
            "ask": api.post("/api/ask", json={"question": QUESTION}, headers=rebound),
            "page": api.get(f"/?thread_id={thread}", headers={"host": REBOUND}),
            "health": api.get("/health", headers={"host": REBOUND}),
        }
        own = api.get(f"/?thread_id={thread}")
    for name, answer in answers.items():
        assert answer.status_code == 421, name
        assert answer.json()["error"].startswith(f"host '{REBOUND}' is not served here"), name
        assert "one hour" not in answer.text, name
    assert own.status_code == 200 and "one hour" in own.text


def test_local_names_at_the_server_port_and_configured_hosts_are_served(
    fixture_index: PassageIndex,
) -> None:
    with client(fixture_index, allowed_hosts="chat.example.org, proxy.example:8443") as api:
        for host in (f"127.0.0.1:{PORT}", f"localhost:{PORT}", f"[::1]:{PORT}", "chat.example.org"):
            assert api.get("/health", headers={"host": host}).status_code == 200, host
        assert api.get("/health", headers={"host": "proxy.example:8443"}).status_code == 200
        for host in (
            "127.0.0.1:9999",  # another port: another server
            "127.0.0.1",  # no port: port 80, not this server's
            "proxy.example:9000",
            "127.0.0.1.attacker.example",
            "",
            "local host",
        ):
            refused = api.get("/health", headers={"host": host})
            assert refused.status_code == 421, host
            assert set(refused.json()) == {"error"}


@pytest.mark.parametrize(
    ("origin", "status"),
    [
        (SERVER, 200),
        (f"http://localhost:{PORT}", 403),  # another origin, even if it is the same machine
        (f"https://127.0.0.1:{PORT}", 403),  # another scheme
        ("http://127.0.0.1", 403),  # another port
        (f"http://127.0.0.1:{PORT}.attacker.example", 403),
        ("null", 403),
    ],
)
def test_the_origin_must_match_scheme_host_and_port(
    origin: str, status: int, fixture_index: PassageIndex
) -> None:
    form = {"question": QUESTION, "thread_id": str(uuid.uuid4())}
    with client(fixture_index) as api:
        response = api.post("/chat", data=form, headers={"origin": origin})
    assert response.status_code == status, response.text


def test_host_parsing() -> None:
    assert split_host("[::1]:8000") == ("[::1]", 8000)
    assert split_host("LocalHost") == ("localhost", None)
    assert split_host("::1") is None
    assert split_host("a:b") is None
    assert host_allowed("127.0.0.1", "http", 80, frozenset())
    assert host_allowed("localhost:443", "https", 443, frozenset())
    assert not host_allowed("localhost", "https", 8443, frozenset())
