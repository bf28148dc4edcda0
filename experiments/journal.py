"""The journal of a run: every finished case, appended and synced as it ends, so a run killed
half-way (even by kill -9) resumes without losing or repeating a question.

One JSON line per finished case (all its turns' rows): a conversation is redone whole, because its
memory is not journaled. A line torn by the kill is ignored. While a run writes its journal it
holds an exclusive lock on it, so a second process can tell a live run from a dead one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from caprag.errors import CapragError
from caprag.secrets import redact_config
from experiments.evaluate import QuestionRow

VOLATILE = (
    "experiment.resume",
    "experiment.concurrency",
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


def config_hash(config: Mapping[str, Any], dataset_hash: str) -> str:
    """sha256 (16 hex) of the resolved config minus VOLATILE keys, plus the questions' hash."""
    kept = redact_config(_without(dict(config), VOLATILE), scan_text=False)
    blob = json.dumps({"config": kept, "dataset": dataset_hash}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _without(config: dict[str, Any], dotted: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key in dotted:
            continue
        inner = tuple(d.removeprefix(f"{key}.") for d in dotted if d.startswith(f"{key}."))
        out[key] = _without(value, inner) if isinstance(value, dict) and inner else value
    return out


def case_key(repeat: int, case_id: str) -> str:
    """A case's identity in the journal: the same question in two repeats is two cases."""
    return f"{repeat}:{case_id}"


class Journal:
    """Append-only record of finished cases for one run; locked while open."""

    def __init__(self, folder: Path | str, name: str) -> None:
        self.path = Path(folder) / f"{name}.jsonl"
        self._handle: IO[str] | None = None

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
        """Finished cases by case key; a torn last line (the kill hit mid-write) is skipped."""
        found: dict[str, list[QuestionRow]] = {}
        for entry in self._entries():
            found[entry["case"]] = [QuestionRow.from_json(row) for row in entry["rows"]]
        return found

    def _entries(self) -> Iterator[dict[str, Any]]:
        if not self.exists:
            return
        with self.path.open(encoding="utf-8") as handle:
            for line in handle:
                if not line.endswith("\n"):
                    return  # torn by a kill: that case was not finished
                yield json.loads(line)

    def append(self, key: str, rows: list[QuestionRow]) -> None:
        """Record a finished case durably (flushed and fsynced before returning)."""
        if self._handle is None:
            raise RuntimeError("journal is not open")
        line = json.dumps({"case": key, "rows": [r.to_json() for r in rows]}, ensure_ascii=False)
        self._handle.write(line + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self, *, remove: bool = False) -> None:
        """Release the lock; `remove` deletes the journal (the run is complete and logged)."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if remove:
            self.path.unlink(missing_ok=True)


def _drop_torn_tail(path: Path) -> None:
    """Cut a last line that a kill left without its newline, so appends start clean."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as handle:
            handle.truncate(data.rfind(b"\n") + 1)
