"""LLM replies on disk: an identical call (same provider, model, prompt, parameters and prompt
version) is answered from the cache instead of the endpoint.

One SQLite file holds every reply; parallel sweep jobs share it (WAL mode, busy timeout), and a
reply is written only after it parsed, so a failed call is never replayed.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

from caprag.errors import CapragError
from caprag.secrets import redact

SCHEMA_VERSION = "llm-cache-v1"
"""Part of every key: changing what is stored changes it, so old entries are never misread."""


class CacheError(CapragError):
    """The cache file cannot be opened or written."""


def cache_key(**parts: Any) -> str:
    """sha256 over the parts as canonical JSON (sorted keys; non-JSON values by str)."""
    blob = json.dumps(
        {"schema": SCHEMA_VERSION, **parts}, sort_keys=True, default=str, ensure_ascii=False
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def open_table(path: Path, table: str) -> sqlite3.Connection:
    """A connection to the SQLite file at `path` (created with its folder; WAL mode, a busy
    timeout, shared across threads) with `table` ("name (columns...)") created if missing.
    Raises OSError or sqlite3.Error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=30, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"CREATE TABLE IF NOT EXISTS {table}")
    db.commit()
    return db


class ResponseCache:
    """A key → JSON reply store in one SQLite file, safe across threads and processes."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()
        try:
            self._db = open_table(
                self.path,
                "replies (key TEXT PRIMARY KEY, model TEXT, step TEXT, value TEXT NOT NULL,"
                " created REAL DEFAULT (julianday('now')))",
            )
        except (OSError, sqlite3.Error) as exc:
            raise CacheError(
                f"cannot open the LLM response cache {self.path}: {exc} "
                "(set paths.cache to a writable file, or experiment.cache=false)"
            ) from exc

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored reply, or None (and a miss counted)."""
        with self._lock:
            row = self._db.execute("SELECT value FROM replies WHERE key = ?", (key,)).fetchone()
            if row is None:
                self.misses += 1
                return None
            self.hits += 1
        value: dict[str, Any] = json.loads(row[0])
        return value

    def put(self, key: str, value: dict[str, Any], *, model: str = "", step: str = "") -> None:
        """Store a reply (a concurrent writer of the same key wins; both wrote the same call)."""
        blob = redact(json.dumps(value, ensure_ascii=False))  # no secret on disk, whatever came
        with self._lock:
            try:
                self._db.execute(
                    "INSERT OR REPLACE INTO replies (key, model, step, value) VALUES (?, ?, ?, ?)",
                    (key, model, step, blob),
                )
                self._db.commit()
            except sqlite3.Error as exc:
                raise CacheError(f"cannot write the LLM response cache {self.path}: {exc}") from exc

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM replies").fetchone()[0])

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._db.close()


def open_cache(path: Path | str | None, enabled: bool = True) -> ResponseCache | None:
    """The cache for config (`_target_`): None when disabled or no path is given."""
    if not enabled or not path:
        return None
    return ResponseCache(path)
