"""The live decision log and answer feedback (issue 19, point 5), through the API and the chat
page: what each request logs, feedback round trips and bad input, the log surviving a restart and
concurrent writers, the default depth 2, and the configured ladder on the page."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from caprag.config import PROJECT_ROOT
from caprag.retrieval.store import PassageIndex
from caprag.serve.api import create_app
from caprag.serve.decision_log import DecisionLog, DecisionRecord, Round
from caprag.serve.services import Pipeline
from caprag.steps import StepResult, rule_steps
from caprag.steps.assess import ConfidenceAssessment
from caprag.strategies import AdaptiveDepthStrategy, MultiHopStrategy
from tests.conftest import FIXTURE_BOOKS
from tests.reliability.test_serving import api

HANG_S = 600  # only catches a hang
CROSS_REF = "What penalty does the second attack of a Flurry suffer?"
SIMPLE = "How long does a torch burn?"


class Unsure:
    """An assessor that is never confident: adaptive goes through every depth of its ladder."""

    kind = "rule"
    model = "offline"

    async def __call__(
        self, question: str, documents: Any, **_: Any
    ) -> StepResult[ConfidenceAssessment]:
        return StepResult(value=ConfidenceAssessment(confidence=0.1), usage=None)


def adaptive(
    index: PassageIndex, log: DecisionLog | None = None, unsure: bool = False, **options: Any
) -> Pipeline:
    steps = rule_steps()
    if unsure:
        steps = dataclasses.replace(steps, assess=Unsure())
    return Pipeline(AdaptiveDepthStrategy(index, steps, **options), steps, decision_log=log)


@pytest.fixture
def log(tmp_path: Path) -> DecisionLog:
    return DecisionLog(tmp_path / "logs" / "decisions.db")


@pytest.fixture
def client(fixture_index: PassageIndex, log: DecisionLog) -> Iterator[TestClient]:
    with TestClient(
        create_app(adaptive(fixture_index, log)), base_url="http://127.0.0.1"
    ) as test_client:
        yield test_client


def test_every_request_is_logged_with_its_rounds(
    fixture_index: PassageIndex, log: DecisionLog
) -> None:
    with TestClient(
        create_app(adaptive(fixture_index, log, unsure=True)), base_url="http://127.0.0.1"
    ) as client:
        data = client.post("/api/ask", json={"question": CROSS_REF, "power": "auto"}).json()
    record = log.get(data["request_id"])
    assert record is not None
    assert (record.thread_id, record.strategy, record.question) == (
        data["thread_id"],
        "adaptive",
        CROSS_REF,
    )
    assert record.created_at.endswith("+00:00") and record.status == "answered"
    assert len(record.rounds) == len(data["hops"]) >= 2  # never confident: it deepens
    for logged, hop in zip(record.rounds, data["hops"], strict=True):
        assert (logged.depth, logged.chunks, logged.confidence, logged.threshold) == (
            hop["depth"],
            hop["chunks"],
            hop["confidence"],
            hop["threshold"],
        )
        assert logged.decision == hop["adaptive_decision"]
        assert logged.latency_s == hop["latency_s"]
    assert {r.decision for r in record.rounds[:-1]} == {"increase_depth"}
    assert record.stop_reason == record.rounds[-1].decision != "increase_depth"
    assert record.prompt_tokens == data["prompt_tokens"] and record.cost_usd == data["cost_usd"]
    assert data["decision_log"]["request_id"] == data["request_id"]  # returned as well


def test_other_strategies_are_logged_too(fixture_index: PassageIndex, log: DecisionLog) -> None:
    steps = rule_steps()
    pipeline = Pipeline(MultiHopStrategy(fixture_index, steps, k=2), steps, decision_log=log)
    with TestClient(create_app(pipeline), base_url="http://127.0.0.1") as client:
        data = client.post("/api/ask", json={"question": CROSS_REF}).json()
    record = log.get(data["request_id"])
    assert record is not None and record.strategy == "multi-hop"
    assert record.power is None and record.ladder is None  # no depth ladder
    assert [r.queries for r in record.rounds] == [len(h["queries"]) for h in data["hops"]]
    assert record.rounds[-1].decision in ("sufficient", "next")


def test_feedback_round_trip(client: TestClient, log: DecisionLog) -> None:
    data = client.post("/api/ask", json={"question": SIMPLE}).json()
    rid = data["request_id"]
    said = client.post("/api/feedback", json={"request_id": rid, "enough": False})
    assert said.status_code == 200
    assert said.json()["enough"] is False and said.json()["comment"] == ""
    record = log.get(rid)
    assert record is not None and record.feedback is not None and not record.feedback.enough
    again = client.post(
        "/api/feedback", json={"request_id": rid, "enough": True, "comment": "found it"}
    )
    assert again.status_code == 200
    record = log.get(rid)
    assert record is not None and record.feedback is not None
    assert (record.feedback.enough, record.feedback.comment) == (True, "found it")  # replaced
    assert [r.request_id for r in log.records(feedback="enough")] == [rid]
    assert log.records(feedback="not_enough") == []


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (
            {"request_id": "123e4567-e89b-42d3-a456-426614174000", "enough": True},
            404,
            "no answer with request_id 123e4567-e89b-42d3-a456-426614174000 in the decision log",
        ),
        ({"request_id": "abc", "enough": True}, 422, "request_id must be the UUID"),
        ({"request_id": str(uuid.uuid4())}, 422, "enough: Field required"),
        ({"request_id": str(uuid.uuid4()), "enough": "yes"}, 422, "enough must be true or false"),
        ({"request_id": str(uuid.uuid4()), "enough": 1}, 422, "enough must be true or false"),
        (
            {"request_id": str(uuid.uuid4()), "enough": True, "comment": "x" * 2001},
            422,
            "the comment is longer than 2000 characters",
        ),
        ({"enough": True}, 422, "request_id: Field required"),
    ],
    ids=["unknown", "not-uuid", "no-verdict", "string", "number", "long-comment", "no-id"],
)
def test_bad_feedback_is_a_clear_4xx(
    client: TestClient, body: dict[str, Any], status: int, message: str
) -> None:
    response = client.post("/api/feedback", json=body)
    assert response.status_code == status
    assert message in response.json()["error"]


def test_malformed_feedback_json_is_422(client: TestClient) -> None:
    response = client.post(
        "/api/feedback", content=b'{"enough": ', headers={"content-type": "application/json"}
    )
    assert (response.status_code, response.json()) == (
        422,
        {"error": "the request body is not valid JSON"},
    )


@pytest.mark.parametrize("power", ["deep", 0, 4, True])
def test_a_bad_power_is_422(client: TestClient, power: object) -> None:
    response = client.post("/api/ask", json={"question": SIMPLE, "power": power})
    assert response.status_code == 422
    assert "power must be auto, 1, 2 or 3" in response.json()["error"]


# The design's default: fixed depth 2 when neither auto nor a power is chosen


def test_no_power_chosen_is_fixed_depth_2(client: TestClient, log: DecisionLog) -> None:
    data = client.post("/api/ask", json={"question": SIMPLE}).json()
    assert [(h["depth"], h["adaptive_decision"]) for h in data["hops"]] == [(2, "forced_depth")]
    record = log.get(data["request_id"])
    assert record is not None and (record.power, record.power_source) == ("2", "default")
    assert record.query_type == data["hops"][0]["query_type"] == "factual"  # persisted with it
    auto = client.post("/api/ask", json={"question": SIMPLE, "power": "auto"}).json()
    assert [(h["depth"], h["adaptive_decision"]) for h in auto["hops"]] == [(1, "sufficient")]
    chosen = log.get(auto["request_id"])
    assert chosen is not None and (chosen.power, chosen.power_source) == ("auto", "request")
    page = client.get("/").text
    assert '<option value="2" selected>2 (balanced) — default</option>' in page
    form = client.post("/chat", data={"question": SIMPLE, "thread_id": str(uuid.uuid4())}).text
    assert "depth used 2/3" in form and "power 2 (balanced)" in form and "factual question" in form


def test_the_server_default_power_comes_from_the_settings(
    fixture_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RETRIEVAL_STRATEGY", "adaptive")
    monkeypatch.setenv("CAPRAG_DECISION_LOG", str(fixture_env / "log.db"))
    monkeypatch.setenv("CAPRAG_POWER", "auto")
    with TestClient(create_app(), base_url="http://127.0.0.1") as client:
        data = client.post("/api/ask", json={"question": SIMPLE}).json()
        assert [h["adaptive_decision"] for h in data["hops"]] == ["sufficient"]
        assert data["decision_log"]["power"] == "auto"
        assert '<option value="auto" selected>auto — default</option>' in client.get("/").text


# The configured ladder on the page


def test_the_page_shows_the_configured_ladder(
    fixture_index: PassageIndex, log: DecisionLog
) -> None:
    pipeline = adaptive(fixture_index, log, unsure=True, depth_chunks=(2, 4), max_depth=2)
    with TestClient(create_app(pipeline), base_url="http://127.0.0.1") as client:
        page = client.get("/").text
        turn = client.post(
            "/chat", data={"question": CROSS_REF, "thread_id": str(uuid.uuid4()), "power": "auto"}
        ).text
    assert "depth 1: 2 / depth 2: 4 chunks" in page
    assert '<option value="3"' not in page  # only the ladder's depths can be forced
    assert "/3" not in turn and "depth used 2/2" in turn
    assert "round 1: depth 1/2, 2 chunks" in turn and "round 2: depth 2/2, 4 chunks" in turn
    with TestClient(create_app(pipeline), base_url="http://127.0.0.1") as client:
        refused = client.post("/api/ask", json={"question": SIMPLE, "power": 3})
    assert refused.status_code == 422 and "power must be auto or 1-2" in refused.json()["error"]


def test_the_chat_page_feedback_control_records(client: TestClient, log: DecisionLog) -> None:
    turn = client.post("/chat", data={"question": SIMPLE, "thread_id": str(uuid.uuid4())}).text
    rid = log.records()[0].request_id
    assert f'name="request_id" value="{rid}"' in turn and "not enough" in turn
    recorded = client.post(
        "/chat/feedback", data={"request_id": rid, "enough": "false", "comment": "too short"}
    )
    assert recorded.status_code == 200
    assert "Feedback recorded: <b>not enough</b>" in recorded.text and "too short" in recorded.text
    record = log.get(rid)
    assert record is not None and record.feedback is not None and not record.feedback.enough
    foreign = client.post(
        "/chat/feedback",
        data={"request_id": rid, "enough": "true"},
        headers={"origin": "http://evil.example"},
    )
    assert foreign.status_code == 403
    unknown = client.post("/chat/feedback", data={"request_id": str(uuid.uuid4()), "enough": "x"})
    assert unknown.status_code == 422


# Persistence


def test_the_log_survives_a_restart_of_the_app(
    fixture_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = fixture_env / "state" / "decisions.db"
    monkeypatch.setenv("CAPRAG_DECISION_LOG", str(path))
    with TestClient(create_app(), base_url="http://127.0.0.1") as first:
        data = first.post("/api/ask", json={"question": SIMPLE}).json()
    assert path.is_file()  # created on first use, folder included
    with TestClient(
        create_app(), base_url="http://127.0.0.1"
    ) as second:  # a new app, its pipeline built again
        said = second.post("/api/feedback", json={"request_id": data["request_id"], "enough": True})
        assert said.status_code == 200, said.text
        later = second.post("/api/ask", json={"question": "What does Old Soldier cost?"}).json()
    records = DecisionLog(path).records()
    assert [r.request_id for r in records] == [later["request_id"], data["request_id"]]
    assert records[1].feedback is not None and records[1].feedback.enough
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_an_unusable_log_path_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(Exception, match="cannot open the decision log CAPRAG_DECISION_LOG="):
        DecisionLog(tmp_path / "file" / "decisions.db").open()


async def test_concurrent_requests_all_reach_the_log(
    fixture_index: PassageIndex, tmp_path: Path
) -> None:
    path = tmp_path / "decisions.db"
    pipeline = adaptive(fixture_index, DecisionLog(path))
    questions = [f"How long does torch number {n} burn?" for n in range(40)]
    async with api(create_app(pipeline)) as client:
        replies = await asyncio.wait_for(
            asyncio.gather(
                *(client.post("/api/ask", json={"question": q, "power": "auto"}) for q in questions)
            ),
            HANG_S,
        )
        assert {r.status_code for r in replies} == {200}
        verdicts = await asyncio.wait_for(
            asyncio.gather(
                *(
                    client.post(
                        "/api/feedback",
                        json={"request_id": r.json()["request_id"], "enough": n % 2 == 0},
                    )
                    for n, r in enumerate(replies)
                )
            ),
            HANG_S,
        )
        assert {v.status_code for v in verdicts} == {200}
    logged = DecisionLog(path).records()  # read back through a second connection
    assert sorted(r.question for r in logged) == sorted(questions)
    assert len({r.request_id for r in logged}) == 40
    assert len(DecisionLog(path).records(feedback="enough")) == 20


def test_two_writers_on_one_file_lose_nothing(tmp_path: Path) -> None:
    """Two logs on one file (two server processes) writing at once: WAL and the busy timeout."""
    path = tmp_path / "decisions.db"
    logs = [DecisionLog(path), DecisionLog(path)]
    errors: list[BaseException] = []

    def write(log: DecisionLog, writer: int) -> None:
        try:
            for n in range(100):
                log.write(
                    DecisionRecord(
                        request_id=f"{writer}-{n}",
                        created_at=f"2026-01-01T00:00:{n % 60:02d}.000+00:00",
                        thread_id="t",
                        strategy="adaptive" if writer else "single",
                        question=f"q{n}",
                        rounds=[Round(round=1, decision="sufficient")],
                    )
                )
                log.add_feedback(f"{writer}-{n}", enough=bool(n % 2))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(log, w)) for w, log in enumerate(logs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG_S)
    assert errors == []
    everything = DecisionLog(path).records()
    assert len(everything) == 200
    assert len(DecisionLog(path).records(strategy="single", feedback="not_enough")) == 50
    assert DecisionLog(path).strategies() == ["adaptive", "single"]


def test_two_processes_opening_a_new_log_at_once_both_open(tmp_path: Path) -> None:
    """Two servers starting together on a new file: the switch to WAL races (without a retry,
    about one pair in six failed with 'database is locked')."""

    def open_log(log: DecisionLog, together: threading.Barrier, errors: list[Exception]) -> None:
        together.wait(HANG_S)
        try:
            log.open()
        except Exception as exc:
            errors.append(exc)

    for attempt in range(50):
        logs = [DecisionLog(tmp_path / f"{attempt}.db") for _ in range(2)]
        together = threading.Barrier(2)
        errors: list[Exception] = []
        threads = [threading.Thread(target=open_log, args=(log, together, errors)) for log in logs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(HANG_S)
        assert errors == [], attempt
        for log in logs:
            log.close()


def test_the_server_refuses_to_start_on_an_unusable_log(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    env = {
        **os.environ,
        "CAPRAG_CORPUS": str(FIXTURE_BOOKS),
        "CAPRAG_CHROMA_DIR": str(tmp_path / "store"),
        "CAPRAG_DECISION_LOG": str(tmp_path / "file" / "decisions.db"),
        "CAPRAG_PORT": "1",  # never reached: the check comes first
    }
    done = subprocess.run(
        [sys.executable, "-m", "caprag.api"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: cannot open the decision log CAPRAG_DECISION_LOG=")
    assert done.stderr.count("\n") == 1


def test_the_chat_page_polls_the_rounds_of_a_running_turn(client: TestClient) -> None:
    progress_id = str(uuid.uuid4())
    waiting = client.get(f"/chat/progress/{progress_id}").text
    assert "classifying the question" in waiting  # before its first round is decided
    form = {"question": SIMPLE, "thread_id": str(uuid.uuid4()), "power": "auto"}
    client.post("/chat", data={**form, "progress_id": progress_id})
    rounds = client.get(f"/chat/progress/{progress_id}").text
    assert "round 1: depth 1/3" in rounds and "→ sufficient" in rounds
    page = client.get("/").text
    assert "htmx:configRequest" in page and "/chat/progress/" in page  # the page polls it
