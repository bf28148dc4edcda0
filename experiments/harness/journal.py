"""The journal of a run: every finished case, written as it ends, so a run killed half-way
(even by kill -9) resumes without losing or repeating a question.

One JSON line per finished case (all its turns' rows): a conversation is redone whole, because its
memory is not journaled. A line torn by the kill is ignored. While a run writes its journal it
holds an exclusive lock on it, so a second process can tell a live run from a dead one.

What survives what: `append` writes and flushes the line before it returns, so the line is in the
kernel and survives the harness being killed (kill -9, OOM) at any later moment. It reaches the
disk (surviving a power cut or an operating system crash) when a background thread fsyncs the
file: as soon as the previous fsync ends, one fsync for every line written meanwhile (a group
commit), usually within milliseconds. `close` and `sync` wait until every line is on disk. The
event loop never waits for the disk (an fsync took 3.6-3.9 ms per case, on the loop).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ValidationError

from caprag.errors import CapragError
from caprag.secrets import redact_config
from experiments.results.row import QuestionRow

VOLATILE = (
    "experiment.resume",
    "experiment.concurrency",
    "experiment.workers",
    "experiment.progress",
    "experiment.dry_run",
    "experiment.dry_run_sample",
    "experiment.question_timeout_s",
    "experiment.cache",
    "tracking",
    "paths.store",
    "paths.cache",
    "paths.journals",
)
"""Config that does not change a run's rows: left out of the config hash."""


class JournalBusyError(CapragError):
    """Another live process is writing this run's journal."""


class JournalSyncError(CapragError):
    """The journal's lines could not be synced to disk."""


def config_hash(config: Mapping[str, Any], dataset_hash: str) -> str:
    """sha256 (16 hex) of the resolved config minus VOLATILE keys, plus the questions' hash."""
    kept = redact_config(without_keys(dict(config), VOLATILE), scan_text=False)
    blob = json.dumps({"config": kept, "dataset": dataset_hash}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def without_keys(config: dict[str, Any], dotted: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key in dotted:
            continue
        inner = tuple(d.removeprefix(f"{key}.") for d in dotted if d.startswith(f"{key}."))
        out[key] = without_keys(value, inner) if isinstance(value, dict) and inner else value
    return out


def case_key(repeat: int, case_id: str) -> str:
    """A case's identity in the journal: the same question in two repeats is two cases."""
    return f"{repeat}:{case_id}"


class JournalEntry(BaseModel):
    """One line of a journal: a finished case and its rows (one per turn)."""

    case: str
    rows: list[QuestionRow]


class Journal:
    """Append-only record of finished cases for one run; locked while open."""

    def __init__(self, folder: Path | str, name: str) -> None:
        self.path = Path(folder) / f"{name}.jsonl"
        self._handle: IO[str] | None = None
        self._syncer: _Syncer | None = None

    @property
    def exists(self) -> bool:
        """Whether an earlier process left finished cases."""
        return self.path.exists()

    def open(self) -> Journal:
        """Take the lock (JournalBusyError when a live run holds it) and open for appending."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise JournalBusyError(
                f"run journal {self.path} is held by a live process: that run is still going"
            ) from None
        _drop_torn_tail(self.path)
        self._handle = handle
        self._syncer = _Syncer(self.path)
        # A journal dropped without close (a run that raised) stops its thread; the lock goes
        # with the handle.
        weakref.finalize(self, self._syncer.stop)
        return self

    def busy(self) -> bool:
        """Whether a live process holds the journal right now."""
        if not self.exists:
            return False
        with self.path.open("a", encoding="utf-8") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
        return False

    def done(self) -> dict[str, list[QuestionRow]]:
        """Finished cases by case key; a torn last line (the kill hit mid-write) is skipped, and
        so is a line whose rows are not rows of this code (a journal left by an older caprag:
        those cases are asked again)."""
        found: dict[str, list[QuestionRow]] = {}
        for entry in self._entries():
            found[entry.case] = entry.rows
        return found

    def _entries(self) -> Iterator[JournalEntry]:
        if not self.exists:
            return
        with self.path.open(encoding="utf-8") as handle:
            for line in handle:
                if not line.endswith("\n"):
                    return  # torn by a kill: that case was not finished
                try:
                    yield JournalEntry.model_validate_json(line)
                except ValidationError:
                    continue

    def append(self, key: str, rows: list[QuestionRow]) -> None:
        """Record a finished case: written and flushed to the kernel before returning (it
        survives a kill of this process); the background thread fsyncs it soon after."""
        if self._handle is None or self._syncer is None:
            raise RuntimeError("journal is not open")
        line = JournalEntry(case=key, rows=rows).model_dump_json()
        self._handle.write(line + "\n")
        self._handle.flush()
        self._syncer.written()

    def sync(self) -> None:
        """Wait until every line appended so far is on disk (JournalSyncError if it cannot be)."""
        if self._syncer is not None:
            self._syncer.wait()

    def close(self, *, remove: bool = False) -> None:
        """Sync every line to disk and release the lock; `remove` deletes the journal (the run
        is complete and logged)."""
        try:
            if self._handle is not None and self._syncer is not None:
                self._syncer.stop()
                self._syncer.check()
                os.fsync(self._handle.fileno())
        finally:
            if self._handle is not None:
                self._handle.close()
                self._handle = None
            self._syncer = None
        if remove:
            self.path.unlink(missing_ok=True)


class _Syncer:
    """fsyncs the journal file in a background thread, once for all the lines written since the
    last fsync. It syncs through its own read-only descriptor (fsync flushes the file, whichever
    descriptor names it), so it neither holds the journal's lock nor keeps its handle alive."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY)
        self._lines = 0
        self._synced = 0
        self._stopping = False
        self._error: OSError | None = None
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._serve, name="journal-fsync", daemon=True)
        self._thread.start()

    def written(self) -> None:
        """One more line is in the kernel: sync it (and raise an earlier sync's error)."""
        self.check()
        with self._changed:
            self._lines += 1
            self._changed.notify_all()

    def wait(self) -> None:
        """Block until every line written so far is synced."""
        with self._changed:
            wanted = self._lines
            self._changed.wait_for(lambda: self._synced >= wanted or self._error is not None)
        self.check()

    def check(self) -> None:
        """Raise the error of a failed fsync, once."""
        error, self._error = self._error, None
        if error is not None:
            raise JournalSyncError(f"cannot sync the run journal {self.path}: {error}") from error

    def stop(self) -> None:
        """Sync what is pending, end the thread and close the descriptor (idempotent)."""
        with self._changed:
            if self._stopping:
                return
            self._stopping = True
            self._changed.notify_all()
        self._thread.join()
        os.close(self._fd)

    def _serve(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._lines > self._synced or self._stopping)
                target, stopping = self._lines, self._stopping
            if target > self._synced:
                try:
                    os.fsync(self._fd)
                except OSError as exc:
                    self._error = exc
                with self._changed:
                    self._synced = target
                    self._changed.notify_all()
            if stopping:
                return


def _drop_torn_tail(path: Path) -> None:
    """Cut a last line that a kill left without its newline, so appends start clean."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as handle:
            handle.truncate(data.rfind(b"\n") + 1)
