"""The live decision log: every served request's retrieval decisions, kept in SQLite with the
user's feedback on the answer (`CAPRAG_DECISION_LOG`, `.caprag/decisions.db` by default).

One row per request (request id, thread, strategy, question, time, how it stopped, totals) with
its rounds (per round: depth, chunks, confidence, threshold, decision, latency, tokens, cost) and
the steps it ran; one feedback row per request (`enough`, a comment), the latest post winning.
The file is created on first use, in WAL mode; writes from concurrent requests go through one
connection under a lock, and other processes (the dashboard, a second server) wait on SQLite's
busy timeout rather than fail.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, Field, field_validator

from caprag.errors import ConfigError

BUSY_TIMEOUT_MS = 10_000

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


def _use_wal(db: sqlite3.Connection) -> None:
    """Switch the file to WAL. Two processes opening a new log at once race here, and SQLite
    answers the loser "database is locked" at once, without its busy handler (53 of 300 tries
    of two threads): try again until the busy timeout has passed."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class DecisionLog:
    """The SQLite file of decision records and feedback (`path` may be ':memory:')."""

    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            try:
                if self.path != ":memory:":
                    Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                db = sqlite3.connect(
                    self.path, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False
                )
                db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
                _use_wal(db)
                db.executescript(SCHEMA)
            except (OSError, sqlite3.Error) as exc:
                raise ConfigError(
                    f"cannot open the decision log CAPRAG_DECISION_LOG={self.path}: {exc}"
                ) from exc
            self._db = db
        return self._db

    @contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            db = self._connect()
            with db:  # one transaction: committed on success, rolled back on error
                yield db

    def open(self) -> None:
        """Create the file and tables now (a path that cannot be used raises ConfigError)."""
        with self._locked():
            pass

    def close(self) -> None:
        """Close the connection (the next use opens it again)."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def write(self, record: DecisionRecord) -> None:
        """Keep one request's record (a request id written twice keeps the later record)."""
        body = record.model_dump_json(exclude={"feedback"})
        with self._locked() as db:
            db.execute(
                "INSERT OR REPLACE INTO decisions VALUES (?, ?, ?, ?, ?, ?)",
                (
                    record.request_id,
                    record.created_at,
                    record.thread_id,
                    record.strategy,
                    record.question,
                    body,
                ),
            )

    def add_feedback(self, request_id: str, enough: bool, comment: str = "") -> Feedback | None:
        """Store the user's verdict on a request's answer; None when no such request is logged."""
        feedback = Feedback(enough=enough, comment=comment, created_at=now_iso())
        with self._locked() as db:
            known = db.execute("SELECT 1 FROM decisions WHERE request_id = ?", (request_id,))
            if known.fetchone() is None:
                return None
            db.execute(
                "INSERT OR REPLACE INTO feedback VALUES (?, ?, ?, ?)",
                (request_id, int(enough), comment, feedback.created_at),
            )
        return feedback

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
