"""No worker process outlives the harness: the real CLI (`python -m experiments.run` with
experiment.workers=2) is killed with SIGKILL or interrupted like Ctrl-C while its workers are
answering, and every process it started must be gone (a generous deadline only catches a hang)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from caprag.config import PROJECT_ROOT
from experiments.support.openai_stub import StubServer
from tests.conftest import FIXTURE_BOOKS, FIXTURE_QUESTIONS, sigint_as_in_a_terminal

DEADLINE_S = 600.0  # only catches a hang

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def descendants(pid: int) -> set[int]:
    """Every living process below `pid` (children, their children...)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return {p for p in found if _alive(p)}


def wait_for(condition: object, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {what}")
        time.sleep(0.2)


def start_harness(tmp: Path, stub: StubServer) -> subprocess.Popen[str]:
    args = [
        f"paths.corpus={FIXTURE_BOOKS}",
        f"paths.questions={FIXTURE_QUESTIONS}",
        f"paths.store={tmp / 'store'}",
        f"paths.journals={tmp / 'journals'}",
        f"paths.cache={tmp / 'cache.sqlite'}",
        "tracking.enabled=false",
        "retriever=wordllama",
        "experiment.progress=false",
        "experiment.ragas=false",
        "experiment.cache=false",
        "llm=openai",
        f"llm.client.base_url={stub.base_url}",
        "llm.client.api_key_env=CAPRAG_TEST_KEY",
        "dataset=all",
        "experiment.concurrency=2",
        "experiment.workers=2",
        # No timeout may end a held question first: only the harness's end may stop a worker.
        "llm.client.timeout_s=1000",
        "experiment.question_timeout_s=1000",
    ]
    env = {**os.environ, "CAPRAG_TEST_KEY": "test-key", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "experiments.run", *args],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_in_a_terminal,
    )


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
def test_no_worker_outlives_a_killed_or_interrupted_harness(
    how: signal.Signals, tmp_path: Path
) -> None:
    # Every request is held until 99 are in flight, which never happens: the workers are busy
    # answering when the harness is stopped.
    with StubServer(hold_until=99) as stub:
        harness = start_harness(tmp_path, stub)
        started: set[int] = set()
        try:
            wait_for(lambda: stub.in_flight >= 2, "both workers asking the model")
            started = descendants(harness.pid)
            assert len(started) >= 3, started  # the fork server and two workers
            harness.send_signal(how)
            harness.wait(DEADLINE_S)
            wait_for(lambda: not any(_alive(p) for p in started), f"{started} to end")
        finally:
            for pid in started | descendants(harness.pid):
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)
            if harness.poll() is None:
                harness.kill()
            harness.communicate()
    assert harness.returncode != 0
