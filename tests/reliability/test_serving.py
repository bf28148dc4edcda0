"""Serving under stress (issue 16): concurrent turns of one thread, bounded memory, request
limits, one error shape, start-up checks and LLM timeouts, each against the real app."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage

from caprag.config import PROJECT_ROOT, load_settings
from caprag.errors import ConfigError, EmptyQuestionError, LLMCallError, LLMTimeoutError
from caprag.graph import HISTORY_PAIRS
from caprag.retrieval.store import PassageIndex
from caprag.serve import web
from caprag.serve.api import create_app
from caprag.serve.checkpoint import (
    BoundedSaver,
    Retention,
    bounded_memory,
    expired,
    make_checkpointer,
    open_checkpointer,
)
from caprag.serve.services import Pipeline, ThreadLocks, steps_from_settings, validate_question
from caprag.steps import Steps, rule_steps
from caprag.steps.generate import RuleGenerator
from caprag.strategies import SingleQueryStrategy
from experiments.support.servers import free_port, running
from tests.conftest import FIXTURE_BOOKS
from tests.fakes import ManualClock

HANG_S = 600  # only catches a hang; every test here finishes in seconds
CHECKPOINTERS = ["memory", "sqlite"]
ZERO_WIDTH = "\u200b\u200c\ufeff"


class YieldingGenerator(RuleGenerator):
    """The rule generator after `passes` trips through the event loop: turns that run at the
    same time interleave (a scripted delay, counted in awaits, never in seconds)."""

    def __init__(self, passes: int = 25) -> None:
        super().__init__()
        self.passes = passes

    async def __call__(self, question: str, documents: Any, history: Any = (), **_: Any) -> Any:
        for _ in range(self.passes):
            await asyncio.sleep(0)
        return await super().__call__(question, documents, history)


class RaisingGenerator(RuleGenerator):
    """A generator whose call fails with the given exception."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    async def __call__(self, question: str, documents: Any, history: Any = (), **_: Any) -> Any:
        raise self.error


def offline(index: PassageIndex, steps: Steps | None = None, **kwargs: Any) -> Pipeline:
    llm = steps or rule_steps()
    return Pipeline(SingleQueryStrategy(index, llm, k=2), llm, **kwargs)


def spec_for(kind: str, tmp_path: Path) -> str:
    return "memory" if kind == "memory" else f"sqlite:{tmp_path / 'chat.db'}"


async def stored(pipeline: Pipeline, thread: str) -> list[AnyMessage]:
    """The messages the checkpointer holds for a thread."""
    assert pipeline.checkpointer is not None
    saved = await pipeline.checkpointer.aget_tuple({"configurable": {"thread_id": thread}})
    return [] if saved is None else list(saved.checkpoint["channel_values"].get("messages", []))


def pairs_of(messages: Sequence[AnyMessage]) -> list[tuple[str, str]]:
    """Question/answer pairs, asserting the messages alternate question, answer."""
    kinds = [type(m) for m in messages]
    assert kinds == [HumanMessage, AIMessage] * (len(messages) // 2), kinds
    return [
        (str(q.content), str(a.content)) for q, a in zip(messages[::2], messages[1::2], strict=True)
    ]


@contextlib.asynccontextmanager
async def api(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An async client of the app in this event loop (no server, no lifespan)."""
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://127.0.0.1", timeout=HANG_S
    ) as client:
        yield client


def torch_questions(count: int) -> list[str]:
    return [f"How long does torch number {n:02d} burn?" for n in range(count)]


# 1. Simultaneous turns on one thread


@pytest.mark.parametrize("kind", CHECKPOINTERS)
async def test_simultaneous_turns_of_one_thread_are_all_remembered(
    kind: str, fixture_index: PassageIndex, tmp_path: Path
) -> None:
    turns = 50
    steps = dataclasses.replace(rule_steps(), generate=YieldingGenerator())
    saver = make_checkpointer(spec_for(kind, tmp_path))
    pipeline = offline(fixture_index, steps, checkpointer=saver, history_window=turns)
    thread = str(uuid.uuid4())
    questions = torch_questions(turns)
    try:
        async with api(create_app(pipeline)) as client:
            replies = await asyncio.wait_for(
                asyncio.gather(
                    *(
                        client.post("/api/ask", json={"question": q, "thread_id": thread})
                        for q in questions
                    )
                ),
                HANG_S,
            )
        acknowledged = [q for q, r in zip(questions, replies, strict=True) if r.status_code == 200]
        assert len(acknowledged) == turns
        remembered = pairs_of(await stored(pipeline, thread))
        assert sorted(q for q, _ in remembered) == sorted(acknowledged)
        assert len(pipeline.locks) == 0  # no lock outlives its turns
    finally:
        await pipeline.aclose()


async def test_thread_locks_are_dropped_when_no_turn_holds_or_awaits_them() -> None:
    locks = ThreadLocks()
    holding, release = asyncio.Event(), asyncio.Event()

    async def first() -> None:
        async with locks.hold("t"):
            holding.set()
            await release.wait()

    async def second() -> None:
        async with locks.hold("t"):
            pass

    held = asyncio.create_task(first())
    await holding.wait()
    waiting = asyncio.create_task(second())
    await asyncio.sleep(0)
    assert len(locks) == 1
    waiting.cancel()  # a client that gave up while waiting for its turn
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    release.set()
    await held
    assert len(locks) == 0


async def test_a_failed_turn_releases_its_thread(fixture_index: PassageIndex) -> None:
    steps = dataclasses.replace(rule_steps(), generate=RaisingGenerator(RuntimeError("boom")))
    failing = offline(fixture_index, steps)
    for _ in range(2):  # the second turn is not stuck behind the first one's lock
        with pytest.raises(RuntimeError, match="boom"):
            await asyncio.wait_for(failing.ask("How long does a torch burn?", "t"), HANG_S)
    assert len(failing.locks) == 0


# 2b. Memory per thread is bounded


@pytest.mark.parametrize("kind", CHECKPOINTERS)
async def test_a_long_thread_keeps_only_the_history_window(
    kind: str, fixture_index: PassageIndex, tmp_path: Path
) -> None:
    saver = make_checkpointer(spec_for(kind, tmp_path))
    pipeline = offline(fixture_index, checkpointer=saver)
    questions = torch_questions(HISTORY_PAIRS + 25)
    footprints = []
    try:
        for number, question in enumerate(questions, start=1):
            await pipeline.ask(question, "long")
            if kind == "memory" and number in (HISTORY_PAIRS + 5, len(questions)):
                assert isinstance(saver, BoundedSaver)
                mine = [t async for t in saver.alist({"configurable": {"thread_id": "long"}})]
                assert len(mine) == 1  # only the latest checkpoint
                values = mine[0].checkpoint["channel_values"]
                footprints.append((len(values), len(saver.serde.dumps_typed(values)[1])))
        remembered = pairs_of(await stored(pipeline, "long"))
        assert [q for q, _ in remembered] == questions[-HISTORY_PAIRS:]
        follow_up = await pipeline.ask("Does it burn in the rain?", "long")
        assert follow_up.usage[0].step == "rewrite"
    finally:
        await pipeline.aclose()
    if kind == "memory":
        (count_then, bytes_then), (count_now, bytes_now) = footprints
        assert count_now == count_then and bytes_now <= 1.1 * bytes_then
    else:
        with contextlib.closing(sqlite3.connect(tmp_path / "chat.db")) as db:
            rows = db.execute("SELECT count(*) FROM checkpoints WHERE thread_id = 'long'")
            assert rows.fetchone()[0] == 1


async def test_idle_threads_leave_memory(fixture_index: PassageIndex) -> None:
    clock = ManualClock()
    saver = bounded_memory(Retention(memory_ttl_s=600, memory_max_threads=2, clock=clock.now))
    pipeline = offline(fixture_index, checkpointer=saver)
    await pipeline.ask("What does Old Soldier cost?", "idle")
    clock.advance(601)
    await pipeline.ask("How long does a torch burn?", "busy")
    assert await stored(pipeline, "idle") == []  # idle past the TTL: dropped
    fresh = await pipeline.ask("What penalty does it halve?", "idle")
    assert fresh.main_question == "What penalty does it halve?"  # nothing left to resolve "it"
    clock.advance(1)
    await pipeline.ask("Is it wet-proof?", "busy")
    await pipeline.ask("What does Old Soldier cost?", "third")  # over the cap of 2
    assert list(saver.last_used) == ["busy", "third"]  # the least recently used went
    assert await stored(pipeline, "idle") == []
    assert len(await stored(pipeline, "busy")) == 4


@pytest.mark.parametrize("kind", CHECKPOINTERS)
async def test_a_thread_idle_past_its_ttl_starts_fresh_when_continued(
    kind: str, fixture_index: PassageIndex, tmp_path: Path
) -> None:
    clock = ManualClock()
    policy = Retention(memory_ttl_s=600, sqlite_ttl_days=1, clock=clock.now)
    saver = await open_checkpointer(spec_for(kind, tmp_path), policy)
    pipeline = offline(fixture_index, checkpointer=saver)
    try:
        await pipeline.ask("What does Old Soldier cost?", "idle")
        clock.advance(DAY + 1)  # no other thread is written: the TTL is enforced on read
        fresh = await pipeline.ask("What penalty does it halve?", "idle")
        assert fresh.memory_expired  # the API's field; the chat page says it in words
        assert "started afresh" in web.turn(fresh)
        assert fresh.main_question == "What penalty does it halve?"  # nothing to resolve "it"
        assert len(await stored(pipeline, "idle")) == 2  # the fresh turn only
        follow_up = await pipeline.ask("Does it burn in the rain?", "idle")
        assert not follow_up.memory_expired and not expired(saver, "idle")
    finally:
        await pipeline.aclose()


# 2c. Pruning the SQLite store


DAY = 86_400.0


def checkpoint_rows(path: Path) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = db.execute("SELECT thread_id, count(*) FROM checkpoints GROUP BY thread_id")
        return dict(rows.fetchall())


async def test_the_sqlite_store_drops_idle_threads_at_start_up_and_periodically(
    fixture_index: PassageIndex, tmp_path: Path
) -> None:
    clock = ManualClock()
    policy = Retention(sqlite_ttl_days=30, prune_interval_s=3600, clock=clock.now)
    spec = f"sqlite:{tmp_path / 'chat.db'}"
    first = offline(fixture_index, checkpointer=await open_checkpointer(spec, policy))
    await first.ask("What does Old Soldier cost?", "old")
    await first.ask("What penalty does it halve?", "old")
    clock.advance(20 * DAY)
    await first.ask("How long does a torch burn?", "recent")
    await first.aclose()
    assert checkpoint_rows(tmp_path / "chat.db") == {"old": 1, "recent": 1}

    clock.advance(11 * DAY)  # "old" idle 31 days, "recent" 11
    second = offline(fixture_index, checkpointer=await open_checkpointer(spec, policy))
    try:
        assert await stored(second, "old") == []  # pruned on opening (start-up)
        assert len(await stored(second, "recent")) == 2
        clock.advance(20 * DAY)  # now "recent" is idle 31 days too
        await second.ask("How long does a torch burn?", "other")  # writes prune every interval
        assert await stored(second, "recent") == []
    finally:
        await second.aclose()
    assert checkpoint_rows(tmp_path / "chat.db") == {"other": 1}


async def test_a_store_written_before_the_policy_is_compacted_on_opening(
    fixture_index: PassageIndex, tmp_path: Path
) -> None:
    import aiosqlite
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from caprag.serve.checkpoint import serializer

    path = tmp_path / "old.db"
    async with aiosqlite.connect(path) as conn:
        legacy = offline(fixture_index, checkpointer=AsyncSqliteSaver(conn, serde=serializer()))
        await legacy.ask("What does Old Soldier cost?", "kept")
        await legacy.ask("How many gift points is that?", "kept")
        await legacy.aclose()
    assert checkpoint_rows(path)["kept"] > 1
    pipeline = offline(fixture_index, checkpointer=await open_checkpointer(f"sqlite:{path}"))
    try:
        assert checkpoint_rows(path) == {"kept": 1}
        follow_up = await pipeline.ask("What penalty does it halve?", "kept")
        assert follow_up.main_question == "What penalty does Old Soldier halve?"
    finally:
        await pipeline.aclose()


# 2a. Request bodies over the limit


def http_scope(path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1"), *headers],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }


async def test_a_declared_oversized_body_is_refused_unread(fixture_index: PassageIndex) -> None:
    app = create_app(offline(fixture_index), load_settings(max_body_bytes=4096))
    reads = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": b"x" * 1024, "more_body": True}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    headers = [(b"content-type", b"application/json"), (b"content-length", b"1000000000")]
    await app(http_scope("/api/ask", headers), receive, send)
    assert reads == 0
    assert sent[0]["status"] == 413
    assert json.loads(sent[1]["body"]) == {"error": "the request body is larger than 4096 bytes"}


async def test_a_streamed_oversized_body_is_cut_off_with_413(fixture_index: PassageIndex) -> None:
    app = create_app(offline(fixture_index), load_settings(max_body_bytes=4096))
    chunks_sent = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal chunks_sent
        for _ in range(1000):
            chunks_sent += 1
            yield b" " * 1024

    async with api(app) as client:
        json_type = {"content-type": "application/json"}
        refused = await client.post("/api/ask", content=endless(), headers=json_type)
        assert refused.status_code == 413
        assert refused.json() == {"error": "the request body is larger than 4096 bytes"}
        assert chunks_sent <= 6  # reading stopped as soon as the limit was passed
        fine = await client.post("/api/ask", json={"question": "How long does a torch burn?"})
        assert fine.status_code == 200


# 2d. Cross-origin chat posts


@pytest.mark.parametrize(
    ("origin", "status"),
    [
        ("http://evil.example", 403),
        ("null", 403),
        ("http://127.0.0.1.evil.example", 403),
        ("http://127.0.0.1", 200),
        ("http://127.0.0.1:80", 200),
        ("https://127.0.0.1", 403),
        ("http://127.0.0.1:8000", 403),
        ("http://localhost", 403),
        ("https://proxy.example", 200),
        (None, 200),
    ],
)
def test_chat_posts_are_taken_only_from_this_origin(
    origin: str | None, status: int, fixture_index: PassageIndex
) -> None:
    settings = load_settings(allowed_origins="https://proxy.example")
    form = {"question": "How long does a torch burn?", "thread_id": str(uuid.uuid4())}
    headers = {"origin": origin} if origin else {}
    with TestClient(
        create_app(offline(fixture_index), settings), base_url="http://127.0.0.1"
    ) as client:
        response = client.post("/chat", data=form, headers=headers)
    assert response.status_code == status
    if status == 403:
        assert response.json()["error"].startswith(f"cross-origin post refused: Origin {origin}")
    else:
        assert "one hour" in response.text


# 2e. One error shape


def test_every_error_is_one_json_shape(fixture_index: PassageIndex) -> None:
    json_type = {"content-type": "application/json"}
    with TestClient(create_app(offline(fixture_index)), base_url="http://127.0.0.1") as client:
        answers = {
            "404": client.get("/no/such/page"),
            "405": client.get("/api/ask"),
            "utf-8": client.post(
                "/api/ask", content=b'{"question": "\xff\xfe?"}', headers=json_type
            ),
            "nested": client.post(
                "/api/ask", content=b"[" * 10_000 + b"]" * 10_000, headers=json_type
            ),
            "json": client.post("/api/ask", content=b'{"question": ', headers=json_type),
        }
    expected = {
        "404": (404, "not found: /no/such/page"),
        "405": (405, "method GET not allowed on /api/ask (allowed: POST)"),
        "utf-8": (400, "the request body is not valid UTF-8"),
        "nested": (400, "the request body is nested too deeply"),
        "json": (422, "the request body is not valid JSON"),
    }
    seen = {name: (r.status_code, r.json()) for name, r in answers.items()}
    assert seen == {name: (code, {"error": said}) for name, (code, said) in expected.items()}


def test_an_unexpected_exception_is_a_500_without_a_traceback(
    fixture_index: PassageIndex,
) -> None:
    boom = RuntimeError("the index vanished")
    steps = dataclasses.replace(rule_steps(), generate=RaisingGenerator(boom))
    app = create_app(offline(fixture_index, steps))
    with TestClient(app, raise_server_exceptions=False, base_url="http://127.0.0.1") as client:
        response = client.post("/api/ask", json={"question": "How long does a torch burn?"})
        page = client.post(
            "/chat",
            data={"question": "How long does a torch burn?", "thread_id": str(uuid.uuid4())},
        )
    for answer in (response, page):
        assert answer.status_code == 500
        assert answer.json() == {"error": "internal error: RuntimeError: the index vanished"}
        assert "Traceback" not in answer.text


# 2f. Invisible questions


@pytest.mark.parametrize(
    "question",
    [ZERO_WIDTH, "\u2060\u00ad", " \u200d\n\u3164 ", "\u2800", "\u0301\u200e"],
    ids=["zero-width", "joiner-soft-hyphen", "filler", "braille-blank", "lone-mark"],
)
def test_a_question_of_invisible_characters_is_empty(question: str) -> None:
    with pytest.raises(EmptyQuestionError, match="the question is empty"):
        validate_question(question)


def test_visible_text_around_invisible_characters_is_kept() -> None:
    assert validate_question("\ufeff How long does a torch burn?\u200b ") == (
        "How long does a torch burn?"
    )
    assert validate_question("caf\u00e9 na\u0308ive?") == "caf\u00e9 na\u0308ive?"


def test_the_api_refuses_invisible_questions(fixture_index: PassageIndex) -> None:
    with TestClient(create_app(offline(fixture_index)), base_url="http://127.0.0.1") as client:
        answer = client.post("/api/ask", json={"question": ZERO_WIDTH})
        page = client.post("/chat", data={"question": ZERO_WIDTH, "thread_id": str(uuid.uuid4())})
    assert (answer.status_code, answer.json()) == (
        422,
        {"error": "question: the question is empty"},
    )
    assert (page.status_code, page.json()) == (422, {"error": "the question is empty"})


# 3. LLM timeouts


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (LLMTimeoutError("generate: the LLM call took longer than 30 s"), 504),
        (LLMCallError("generate: the LLM endpoint failed: HTTP 500"), 502),
    ],
)
def test_llm_failures_answer_gateway_errors(
    error: Exception, status: int, fixture_index: PassageIndex
) -> None:
    steps = dataclasses.replace(rule_steps(), generate=RaisingGenerator(error))
    with TestClient(
        create_app(offline(fixture_index, steps)), base_url="http://127.0.0.1"
    ) as client:
        response = client.post("/api/ask", json={"question": "How long does a torch burn?"})
    assert (response.status_code, response.json()) == (status, {"error": str(error)})


def test_the_llm_time_limit_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPRAG_LLM", "openai")
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.delenv("CAPRAG_LLM_TIMEOUT_S", raising=False)

    def timeout() -> float:
        generate = steps_from_settings(load_settings()).generate
        return float(generate.client.chat.request_timeout)  # type: ignore[attr-defined]

    assert timeout() == 30.0
    monkeypatch.setenv("CAPRAG_LLM_TIMEOUT_S", "7.5")
    assert timeout() == 7.5
    monkeypatch.setenv("CAPRAG_LLM_TIMEOUT_S", "soon")
    with pytest.raises(ConfigError, match="CAPRAG_LLM_TIMEOUT_S='soon'"):
        load_settings()


# 2g, 2h. Start-up of `python -m caprag.api`


def server_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "CAPRAG_CORPUS": str(FIXTURE_BOOKS),
        "CAPRAG_CHROMA_DIR": str(tmp_path / "store"),
        "CAPRAG_K": "2",
        "CAPRAG_PORT": str(free_port()),
        **extra,
    }


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ({"CAPRAG_K": "abc"}, "error: invalid settings: CAPRAG_K='abc'"),
        ({"CAPRAG_CHECKPOINTER": "bogus"}, "unknown checkpointer 'bogus'; allowed: memory"),
        ({"CAPRAG_PORT": "abc"}, "error: CAPRAG_PORT='abc': not a port number"),
        (
            {"CAPRAG_CHECKPOINTER": "sqlite:/nonexistent/x.db"},
            "error: cannot open the conversation store CAPRAG_CHECKPOINTER=sqlite:/nonexistent",
        ),
    ],
    ids=["k", "checkpointer", "port", "unopenable-store"],
)
def test_a_bad_start_up_setting_is_one_line_and_exit_2(
    setting: dict[str, str], said: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "caprag.api"],
        cwd=PROJECT_ROOT,
        env=server_env(tmp_path, **setting),
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and said in done.stderr, done.stderr
    assert done.stdout == ""


def test_the_server_serves_from_a_sqlite_store_and_refuses_big_bodies(tmp_path: Path) -> None:
    env = server_env(
        tmp_path,
        CAPRAG_CHECKPOINTER=f"sqlite:{tmp_path / 'chat.db'}",
        CAPRAG_MAX_BODY_BYTES="4096",
    )
    base = f"http://127.0.0.1:{env['CAPRAG_PORT']}"
    with running([sys.executable, "-m", "caprag.api"], f"{base}/health", env, tmp_path / "log"):
        first = httpx.post(
            f"{base}/api/ask", json={"question": "What does Old Soldier cost?"}, timeout=HANG_S
        )
        assert first.status_code == 200, first.text
        body = {"question": "What penalty does it halve?", "thread_id": first.json()["thread_id"]}
        second = httpx.post(f"{base}/api/ask", json=body, timeout=HANG_S)
        assert second.json()["main_question"] == "What penalty does Old Soldier halve?"
        big = httpx.post(
            f"{base}/api/ask",
            content=b" " * 8192,
            headers={"content-type": "application/json"},
            timeout=HANG_S,
        )
        assert (big.status_code, big.json()) == (
            413,
            {"error": "the request body is larger than 4096 bytes"},
        )
    assert checkpoint_rows(tmp_path / "chat.db") == {first.json()["thread_id"]: 1}
