"""A load test whose time runs out reports what finished, exits non-zero and prints no traceback.

The in-process test scripts both the server (an httpx transport that answers first turns at once
and never answers a follow-up) and the time limit (a clock that runs out once every conversation
is waiting): nothing depends on how fast this machine is. The CLI test starts the real server.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import httpx

from caprag.config import PROJECT_ROOT
from experiments.perf.loadtest import drive
from tests.conftest import FIXTURE_BOOKS

T = TypeVar("T")
TOPICS = ["Shield Wall", "Old Soldier", "Night Eyes"]


class FirstTurnsOnly:
    """A scripted API: a first turn is answered at once, a follow-up never."""

    def __init__(self, conversations: int) -> None:
        self.conversations = conversations
        self.waiting = 0
        self.all_waiting = asyncio.Event()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if "thread_id" not in body:
            question = body["question"]
            reply = {"thread_id": str(uuid.uuid4()), "main_question": question, "answer": "x"}
            return httpx.Response(200, json=reply)
        self.waiting += 1
        if self.waiting == self.conversations:
            self.all_waiting.set()
        await asyncio.Event().wait()  # never answered
        raise AssertionError("unreachable")


class RunsOutWhenAllWait:
    """A time limit that runs out once every conversation waits on an unanswered follow-up."""

    def __init__(self, server: FirstTurnsOnly) -> None:
        self.server = server
        self.seconds: float | None = None

    def now(self) -> float:
        return 0.0

    async def bounded(self, awaitable: Awaitable[T], seconds: float) -> T:
        self.seconds = seconds
        work = asyncio.ensure_future(awaitable)
        all_waiting = asyncio.ensure_future(self.server.all_waiting.wait())
        await asyncio.wait({work, all_waiting}, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            all_waiting.cancel()
            return work.result()
        work.cancel()
        raise TimeoutError


async def test_a_timed_out_load_test_reports_the_requests_that_finished() -> None:
    server = FirstTurnsOnly(len(TOPICS))
    clock = RunsOutWhenAllWait(server)
    result = await drive(
        "http://api.test",
        TOPICS,
        turns=4,
        timeout_s=900,
        transport=httpx.MockTransport(server.handle),
        clock=clock,
    )
    assert clock.seconds == 900
    assert result.timed_out_s == 900
    assert result.requests == 3 and len(result.latencies) == 3
    assert result.unfinished == 9  # three follow-ups of each of three conversations
    assert result.errors == [] and result.cross_talk == []
    assert (
        result.timeout_line()
        == "timed out after 900 s: 3 of 12 requests finished, 9 did not finish"
    )
    table = result.markdown()
    assert "| did not finish |" in table and "| 3 × 4 | 3 | 9 |" in table
    assert table.endswith("Timed out after 900 s: 3 of 12 requests finished, 9 did not finish.")


async def test_a_load_test_that_ends_in_time_reports_no_timeout() -> None:
    server = FirstTurnsOnly(len(TOPICS))
    result = await drive(
        "http://api.test",
        TOPICS,
        turns=1,
        timeout_s=900,
        transport=httpx.MockTransport(server.handle),
        clock=RunsOutWhenAllWait(server),  # never runs out: nobody waits on a follow-up
    )
    assert result.timed_out_s is None and result.unfinished == 0
    assert result.requests == 3 and result.timeout_line() == ""
    assert "Timed out" not in result.markdown()


def test_the_cli_prints_the_table_and_exits_1_when_time_runs_out(tmp_path: Path) -> None:
    # Two turns cannot both be answered in a millisecond, however idle the machine.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.loadtest",
            "--conversations",
            "2",
            "--turns",
            "2",
            "--timeout",
            "0.001",
        ],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=600,
        env={
            "PATH": "/usr/bin:/bin",
            "CAPRAG_CORPUS": str(FIXTURE_BOOKS),
            "CAPRAG_CHROMA_DIR": str(tmp_path / "store"),
            "CAPRAG_EMBEDDING": "wordllama",
        },
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "| conversations × turns | requests | did not finish |" in done.stdout
    assert "| 2 × 2 |" in done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: timed out after 0.001 s: ")
    assert errors[0].endswith("of 4 requests finished, " + errors[0].split(", ")[-1])


def test_the_cli_refuses_a_timeout_that_is_not_positive() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "experiments.loadtest", "--timeout", "0"],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=600,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    assert "--timeout 0: expected a number of seconds above 0" in done.stderr
    assert "Traceback" not in done.stderr
