"""The live decision log: every served request's retrieval decisions, kept in SQLite with the
user's feedback on the answer (`CAPRAG_DECISION_LOG`, `.caprag/decisions.db` by default).

One row per request (request id, thread, strategy, question, time, how it stopped, totals) with
its rounds (per round: depth, chunks, confidence, threshold, decision, latency, tokens, cost) and
the steps it ran; one feedback row per request (`enough`, a comment), the latest post winning.
The file is created on first use, in WAL mode; writes from concurrent requests go through one
connection under a lock, each in its own `BEGIN IMMEDIATE` transaction retried while the file is
busy, so other processes (the dashboard, a second server) on the same file never make a write
fail. A served turn never waits on the log past `QUEUE_AFTER_S`: a record the log cannot take
then (another process holds a lock, the file cannot be opened) is queued in memory and written
by a background thread when the log is free again, with one warning if it is given up after
`GIVE_UP_AFTER_S`. A log file deleted while the server runs is recreated on the next write.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, Field, field_validator

from caprag.errors import ConfigError
from caprag.secrets import redact

BUSY_TIMEOUT_MS = 10_000
QUEUE_AFTER_S = 0.5
"""Longest a served turn waits on a busy or unusable log before its record is queued."""
GIVE_UP_AFTER_S = 3600.0
"""A queued record still not written after this long is dropped, with a warning."""
RETRY_EVERY_S = (0.5, 30.0)
"""The background writer's first and longest pause between tries (doubling in between)."""
MAX_QUEUED = 10_000
"""Records held while the log is unusable; past it the oldest is dropped, with a warning."""

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS decisions (
    request_id TEXT PRIMARY KEY,
    created_at TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    strategy TEXT NOT NULL,
    question TEXT NOT NULL,
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS decisions_created ON decisions (created_at);
CREATE TABLE IF NOT EXISTS feedback (
    request_id TEXT PRIMARY KEY REFERENCES decisions (request_id),
    enough INTEGER NOT NULL,
    comment TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL
);
"""


class Round(BaseModel):
    """One retrieval round (a hop; for adaptive, one depth tried) as the decision log keeps it:
    a view of the hop's `caprag.trace.HopTrace`, made by `Round.model_validate(hop,
    from_attributes=True)` (the fields named as the hop's are taken as they are)."""

    round: int = Field(validation_alias=AliasChoices("round", "hop"))
    depth: int | None = Field(default=None, description="Depth searched (adaptive only).")
    chunks: int | None = Field(default=None, description="Passages in the context after the round.")
    confidence: float | None = Field(
        default=None, description="Confidence after the round (adaptive)."
    )
    threshold: float | None = Field(default=None, description="Confidence the question type needs.")
    decision: str = Field(
        validation_alias=AliasChoices("outcome", "decision"),
        description="adaptive: increase_depth, sufficient, forced_depth, budget_exhausted:<b>; "
        "other strategies: sufficient, next (another hop) or done (the hop's `outcome`).",
    )
    queries: int = Field(default=1, description="Queries searched (a hop's list: its length).")
    new_documents: int = 0
    latency_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0  # None: a model's price is unknown

    @field_validator("queries", mode="before")
    @classmethod
    def _count(cls, value: object) -> object:
        return len(value) if isinstance(value, list) else value


class StepTime(BaseModel):
    """A step the request ran (rewrite, classify, search, assess, generate, ...) and its time;
    `cut` marks the step the request's time limit stopped."""

    step: str
    started_s: float = Field(description="Seconds from the start of the request.")
    latency_s: float | None = Field(default=None, description="None when the step never finished.")
    cut: bool = False


class Feedback(BaseModel):
    """What the user said of an answer."""

    enough: bool
    comment: str = ""
    created_at: str = ""


Status = Literal["answered", "partial", "timeout", "no_answer", "error"]
PowerSource = Literal["request", "default"]


class DecisionRecord(BaseModel):
    """One request: what was asked, each retrieval round's decision, how it stopped, its cost."""

    request_id: str
    created_at: str = Field(description="UTC time the request started, ISO 8601.")
    thread_id: str
    strategy: str
    question: str
    main_question: str = ""
    power: str | None = Field(
        default=None, description="Adaptive only: auto or the forced depth (1-3) the turn used."
    )
    power_source: PowerSource | None = Field(
        default=None,
        description="Whether the request chose the power or the server's default applied.",
    )
    ladder: list[int] | None = Field(default=None, description="Adaptive only: chunks per depth.")
    query_type: str | None = Field(
        default=None,
        description="Adaptive only: the classifier's query type (factual, operational, decision, "
        "strategic), which set the starting depth and the threshold.",
    )
    max_depth: int | None = None
    status: Status = "answered"
    stop_reason: str | None = Field(
        default=None,
        description="The last round's decision, timeout:<step> when the request's time limit "
        "cut a step, or error:<exception type> when the turn failed.",
    )
    timeout_s: float | None = Field(
        default=None, description="The request's time limit (None: none)."
    )
    rounds: list[Round] = Field(default_factory=list)
    steps: list[StepTime] = Field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0  # None: a model's price is unknown
    latency_s: float = 0.0
    feedback: Feedback | None = None

    @property
    def final(self) -> Round | None:
        """The last round, if any."""
        return self.rounds[-1] if self.rounds else None


def now_iso() -> str:
    """The time now, UTC, to the millisecond."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _busy(exc: BaseException) -> bool:
    """Whether an SQLite error means another connection holds the file (worth another try)."""
    return isinstance(exc, sqlite3.OperationalError) and (
        "locked" in str(exc) or "busy" in str(exc)
    )


def _retrying(action: Callable[[], object], wait_s: float) -> None:
    """Run `action` again while SQLite says the file is busy, up to `wait_s` in all. Some busy
    answers come at once, without SQLite's busy handler (the switch to WAL racing another
    process: 53 of 300 tries of two threads; a stale snapshot): they are retried here."""
    deadline = time.monotonic() + wait_s
    pause = 0.002
    while True:
        try:
            action()
            return
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)


def _use_wal(db: sqlite3.Connection, wait_s: float = BUSY_TIMEOUT_MS / 1000) -> None:
    """Switch the file to WAL (two processes opening a new log at once race here)."""
    _retrying(lambda: db.execute("PRAGMA journal_mode = WAL"), wait_s)


class DecisionLog:
    """The SQLite file of decision records and feedback (`path` may be ':memory:')."""

    def __init__(self, path: Path | str, *, give_up_after_s: float = GIVE_UP_AFTER_S) -> None:
        self.path = str(path)
        self.give_up_after_s = give_up_after_s
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._inode: int | None = None
        self._queued: deque[tuple[float, DecisionRecord]] = deque()
        self._queue_lock = threading.Lock()
        self._wake = threading.Event()
        self._writer: threading.Thread | None = None
        self.dropped = 0
        """Queued records given up (too old, or pushed out of a full queue)."""

    def _file_inode(self) -> int | None:
        try:
            return os.stat(self.path).st_ino
        except OSError:
            return None

    def _connect(self, wait_s: float = BUSY_TIMEOUT_MS / 1000) -> sqlite3.Connection:
        if self._db is not None and self.path != ":memory:" and self._file_inode() != self._inode:
            # The file was deleted (or replaced) under the open connection, whose writes would
            # go to the unlinked file: open the path again, which recreates it.
            log.warning("decision log %s was deleted or replaced: recreating it", self.path)
            self._db.close()
            self._db = None
        if self._db is None:
            db: sqlite3.Connection | None = None
            try:
                if self.path != ":memory:":
                    Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                db = sqlite3.connect(
                    self.path, timeout=wait_s, check_same_thread=False, isolation_level=None
                )
                opened = db
                db.execute(f"PRAGMA busy_timeout = {int(wait_s * 1000)}")
                _use_wal(db, wait_s)
                _retrying(lambda: opened.executescript(SCHEMA), wait_s)
            except (OSError, sqlite3.Error) as exc:
                if db is not None:
                    db.close()
                raise ConfigError(
                    f"cannot open the decision log CAPRAG_DECISION_LOG={self.path}: {exc}"
                ) from exc
            self._db = db
            self._inode = self._file_inode()
        return self._db

    @contextmanager
    def _locked(self, wait_s: float = BUSY_TIMEOUT_MS / 1000) -> Iterator[sqlite3.Connection]:
        with self._lock:
            db = self._connect(wait_s)
            db.execute(f"PRAGMA busy_timeout = {int(wait_s * 1000)}")
            yield db

    def _transaction(
        self, action: Callable[[sqlite3.Connection], object], wait_s: float = BUSY_TIMEOUT_MS / 1000
    ) -> None:
        """Run `action` in one write transaction, taken up front (BEGIN IMMEDIATE: a busy file
        is waited on by SQLite's busy handler, never answered with a stale-snapshot error) and
        tried again while the file stays busy, up to `wait_s`."""

        def attempt() -> None:
            with self._locked(wait_s) as db:
                db.execute("BEGIN IMMEDIATE")
                try:
                    action(db)
                    db.execute("COMMIT")
                finally:
                    if db.in_transaction:
                        db.execute("ROLLBACK")

        _retrying(attempt, wait_s)

    def open(self) -> None:
        """Create the file and tables now (a path that cannot be used raises ConfigError)."""
        with self._locked():
            pass

    def close(self) -> None:
        """Close the connection (the next use opens it again); queued records are tried once."""
        self.flush()
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def write(self, record: DecisionRecord, wait_s: float = BUSY_TIMEOUT_MS / 1000) -> None:
        """Keep one request's record (a request id written twice keeps the later record); raise
        when the log stays busy or unusable for `wait_s`."""
        body = redact(record.model_dump_json(exclude={"feedback"}))  # errors may echo a key
        row = (
            record.request_id,
            record.created_at,
            record.thread_id,
            record.strategy,
            redact(record.question),
            body,
        )
        self._transaction(
            lambda db: db.execute(
                "INSERT OR REPLACE INTO decisions VALUES (?, ?, ?, ?, ?, ?)", row
            ),
            wait_s,
        )

    def write_or_queue(self, record: DecisionRecord, wait_s: float = QUEUE_AFTER_S) -> bool:
        """Write the record within `wait_s`, or queue it for the background writer (a served
        turn's path: the answer never waits on the log). True when it was written now."""
        self.flush(wait_s)
        if not self._queued:
            try:
                self.write(record, wait_s)
                return True
            except (ConfigError, sqlite3.Error, OSError) as exc:
                log.warning(
                    "decision log %s not writable now (%s): record %s queued",
                    self.path,
                    exc,
                    record.request_id,
                )
        self._enqueue(record)
        return False

    @property
    def queued(self) -> int:
        """Records waiting for the log to be writable."""
        with self._queue_lock:
            return len(self._queued)

    def _enqueue(self, record: DecisionRecord) -> None:
        with self._queue_lock:
            self._queued.append((time.monotonic(), record))
            if len(self._queued) > MAX_QUEUED:
                _, lost = self._queued.popleft()
                self.dropped += 1
                log.warning(
                    "decision log %s: queue full, record %s given up", self.path, lost.request_id
                )
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(
                    target=self._write_queued, name="decision-log-writer", daemon=True
                )
                self._writer.start()
        self._wake.set()

    def flush(self, wait_s: float = QUEUE_AFTER_S) -> int:
        """Write queued records, oldest first, while the log takes them (each within `wait_s`);
        drop those older than `give_up_after_s` with a warning. The records still queued."""
        while True:
            with self._queue_lock:
                if not self._queued:
                    return 0
                since, record = self._queued[0]
            if time.monotonic() - since > self.give_up_after_s:
                self.dropped += 1
                log.warning(
                    "decision log %s: record %s given up after %.0f s unwritten",
                    self.path,
                    record.request_id,
                    self.give_up_after_s,
                )
            else:
                try:
                    self.write(record, wait_s)
                except (ConfigError, sqlite3.Error, OSError):
                    return self.queued
            with self._queue_lock:
                if self._queued and self._queued[0][1] is record:
                    self._queued.popleft()

    def _write_queued(self) -> None:
        """The background writer: try the queue with growing pauses until it is empty."""
        pause = RETRY_EVERY_S[0]
        while True:
            self._wake.wait(pause)
            self._wake.clear()
            if self.flush() == 0:
                with self._queue_lock:
                    if not self._queued:
                        self._writer = None
                        return
            pause = min(pause * 2, RETRY_EVERY_S[1])

    def add_feedback(self, request_id: str, enough: bool, comment: str = "") -> Feedback | None:
        """Store the user's verdict on a request's answer; None when no such request is logged."""
        feedback = Feedback(enough=enough, comment=comment, created_at=now_iso())
        self.flush()  # a record still queued is written first, if the log takes it now
        found: list[bool] = []

        def store(db: sqlite3.Connection) -> None:
            found.clear()
            known = db.execute("SELECT 1 FROM decisions WHERE request_id = ?", (request_id,))
            found.append(known.fetchone() is not None)
            if found[0]:
                db.execute(
                    "INSERT OR REPLACE INTO feedback VALUES (?, ?, ?, ?)",
                    (request_id, int(enough), redact(comment), feedback.created_at),
                )

        self._transaction(store)
        return feedback if found and found[0] else None

    def get(self, request_id: str) -> DecisionRecord | None:
        """One request's record with its feedback, or None."""
        found = self.records(request_id=request_id, limit=1)
        return found[0] if found else None

    def records(
        self,
        *,
        strategy: str | None = None,
        feedback: Literal["any", "enough", "not_enough", "none"] = "any",
        request_id: str | None = None,
        limit: int = 1000,
    ) -> list[DecisionRecord]:
        """The newest records first, filtered by strategy and by the feedback they got."""
        where: list[str] = []
        args: list[str | int] = []
        if strategy:
            where.append("d.strategy = ?")
            args.append(strategy)
        if request_id:
            where.append("d.request_id = ?")
            args.append(request_id)
        if feedback == "none":
            where.append("f.request_id IS NULL")
        elif feedback in ("enough", "not_enough"):
            where.append("f.enough = ?")
            args.append(int(feedback == "enough"))
        sql = (
            "SELECT d.record, f.enough, f.comment, f.created_at FROM decisions d "
            "LEFT JOIN feedback f ON f.request_id = d.request_id"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY d.created_at DESC, d.rowid DESC LIMIT ?"
        )
        with self._locked() as db:
            rows = db.execute(sql, (*args, limit)).fetchall()
        out = []
        for body, enough, comment, at in rows:
            record = DecisionRecord.model_validate(json.loads(body))
            if enough is not None:
                record.feedback = Feedback(enough=bool(enough), comment=comment, created_at=at)
            out.append(record)
        return out

    def strategies(self) -> list[str]:
        """The strategies that have records."""
        with self._locked() as db:
            rows = db.execute("SELECT DISTINCT strategy FROM decisions ORDER BY strategy")
            return [name for (name,) in rows.fetchall()]
