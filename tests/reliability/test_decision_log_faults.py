"""The decision log never costs an answer or a record.

Probe: another process holding a lock on the log turned an answered turn into a 500 "database is
locked" after 10.75 s, past the turn's limit, the answer thrown away; a log deleted while the
server ran was not recreated and later records were lost; two processes writing one log lost
records on a busy machine.
"""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from caprag.retrieval.store import PassageIndex
from caprag.serve.api import create_app
from caprag.serve.decision_log import DecisionLog, DecisionRecord, Round
from caprag.serve.services import Pipeline
from caprag.steps import rule_steps
from caprag.strategies import SingleQueryStrategy

HANG_S = 600  # only catches a hang
QUESTION = "How long does a torch burn?"


def served(index: PassageIndex, log: DecisionLog) -> TestClient:
    steps = rule_steps()
    pipeline = Pipeline(SingleQueryStrategy(index, steps, k=2), steps, decision_log=log)
    return TestClient(create_app(pipeline), base_url="http://127.0.0.1")


def record(request_id: str) -> DecisionRecord:
    return DecisionRecord(
        request_id=request_id,
        created_at="2026-01-01T00:00:00.000+00:00",
        thread_id="t",
        strategy="single",
        question="q",
        rounds=[Round(round=1, decision="sufficient")],
    )


def test_a_log_locked_by_another_process_costs_neither_answer_nor_record(
    fixture_index: PassageIndex, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "decisions.db"
    log = DecisionLog(path)
    log.open()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process writing, or stuck mid-transaction
    try:
        with served(fixture_index, log) as api, caplog.at_level(logging.WARNING):
            answered = api.post("/api/ask", json={"question": QUESTION})
            assert answered.status_code == 200, answered.text
            assert "one hour" in answered.json()["answer"]
            assert log.queued == 1
            assert "record" in caplog.text and "queued" in caplog.text
            holder.execute("ROLLBACK")
            assert log.flush() == 0  # the log is free: the queued record is written
            request_id = answered.json()["request_id"]
            rated = api.post("/api/feedback", json={"request_id": request_id, "enough": True})
            assert rated.status_code == 200
    finally:
        holder.close()
    (kept,) = DecisionLog(path).records()
    assert kept.request_id == request_id and kept.feedback is not None


def test_a_queued_record_given_up_is_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "decisions.db"
    log = DecisionLog(path, give_up_after_s=0.0)
    log.open()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    with caplog.at_level(logging.WARNING):
        assert log.write_or_queue(record("r1"), wait_s=0.0) is False
        holder.execute("ROLLBACK")
        holder.close()
        assert log.flush() == 0
    assert log.dropped == 1
    assert "record r1 given up" in caplog.text
    assert DecisionLog(path).records() == []


def test_a_deleted_log_is_recreated(
    fixture_index: PassageIndex, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "logs" / "decisions.db"
    log = DecisionLog(path)
    with served(fixture_index, log) as api, caplog.at_level(logging.WARNING):
        assert api.post("/api/ask", json={"question": QUESTION}).status_code == 200
        for leftover in path.parent.iterdir():
            leftover.unlink()
        path.parent.rmdir()
        later = api.post("/api/ask", json={"question": QUESTION})
        assert later.status_code == 200
        rated = api.post(
            "/api/feedback", json={"request_id": later.json()["request_id"], "enough": False}
        )
        assert rated.status_code == 200
    assert "was deleted or replaced: recreating it" in caplog.text
    (kept,) = DecisionLog(path).records()
    assert kept.request_id == later.json()["request_id"]


WRITER = textwrap.dedent(
    """
    import sys
    from caprag.serve.decision_log import DecisionLog, DecisionRecord, Round

    log = DecisionLog(sys.argv[1])
    writer = sys.argv[2]
    for n in range(150):
        log.write(DecisionRecord(request_id=f"{writer}-{n}", created_at="2026-01-01T00:00:00Z",
                                 thread_id="t", strategy=writer, question="q",
                                 rounds=[Round(round=1, decision="sufficient")]))
        assert log.add_feedback(f"{writer}-{n}", enough=True) is not None
    """
)


def test_three_processes_writing_one_log_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "decisions.db"
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(path), name], stderr=subprocess.PIPE)
        for name in ("a", "b", "c")
    ]
    for process in writers:
        _, err = process.communicate(timeout=HANG_S)
        assert process.returncode == 0, err.decode()
    kept = DecisionLog(path).records(limit=10_000)
    assert len(kept) == 450
    assert len(DecisionLog(path).records(feedback="enough", limit=10_000)) == 450
