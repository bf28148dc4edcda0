"""Checkpointers by name: conversation memory in memory (default) or in a SQLite file.

Both keep only what the next turn needs, so a conversation's footprint stays bounded however long
it runs: each thread's latest checkpoint (older ones are dropped as a new one is written; the
graph itself trims the messages to the history window). Idle threads are dropped too: from memory
after `Retention.memory_ttl_s` or when more than `memory_max_threads` are held (least recently
used first); from SQLite when idle longer than `sqlite_ttl_days`, checked when the store is opened
and then every `prune_interval_s` while turns are written.

Keeping only the latest checkpoint is safe because the graph state has no `DeltaChannel` (whose
values live in the chain of ancestors): every channel's value is whole in the latest checkpoint.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from caprag.errors import ConfigError

CHECKPOINT_TYPES = [
    *(
        ("caprag.schemas", name)
        for name in ("Question", "Document", "AnswerWithSources", "CallUsage", "RetrievedRef")
    ),
    ("caprag.trace", "HopTrace"),
    ("caprag.steps.analyze", "SufficiencyDecision"),
]

DAY_S = 86_400.0


@dataclass(frozen=True)
class Retention:
    """How long conversations are kept (defaults documented in the README)."""

    memory_ttl_s: float = 6 * 3600.0
    """A thread in memory unused this long is dropped."""
    memory_max_threads: int = 1000
    """At most this many threads in memory; the least recently used goes first."""
    sqlite_ttl_days: float = 30.0
    """A thread in a SQLite store unused this long is deleted."""
    prune_interval_s: float = 3600.0
    """How often (while turns are written) the SQLite store looks for idle threads."""
    clock: Callable[[], float] = field(default=time.time, compare=False)
    """Seconds since the epoch; tests pass their own."""


def serializer() -> JsonPlusSerializer:
    """Serializer that may restore caprag's own state types (and no others)."""
    return JsonPlusSerializer(allowed_msgpack_modules=CHECKPOINT_TYPES)


def _where(config: RunnableConfig) -> tuple[str, str]:
    configurable = config["configurable"]
    return str(configurable["thread_id"]), str(configurable.get("checkpoint_ns", ""))


class BoundedMemorySaver(InMemorySaver):
    """The in-memory checkpointer, holding only each thread's latest checkpoint and dropping
    threads that sat idle past the TTL or beyond the thread cap (least recently used first)."""

    def __init__(self, retention: Retention | None = None) -> None:
        super().__init__(serde=serializer())
        self.retention = retention or Retention()
        self.last_used: OrderedDict[str, float] = OrderedDict()
        self._versions: dict[tuple[str, str], dict[str, Any]] = {}
        self._write_ids: dict[tuple[str, str], set[str]] = {}

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store the checkpoint, then forget the thread's older ones and the values they held."""
        saved = super().put(config, checkpoint, metadata, new_versions)
        thread, ns = _where(config)
        current = self._versions.setdefault((thread, ns), {})
        for channel, version in new_versions.items():
            old = current.get(channel)
            if old is not None and old != version:
                self.blobs.pop((thread, ns, channel, old), None)
            current[channel] = version
        stored = self.storage[thread][ns]
        for old_id in [i for i in stored if i != checkpoint["id"]]:
            del stored[old_id]
        written = self._write_ids.get((thread, ns), set())
        for old_id in [i for i in written if i != checkpoint["id"]]:
            self.writes.pop((thread, ns, old_id), None)
            written.discard(old_id)
        self._touch(thread)
        return saved

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store the writes, remembering which checkpoint they belong to (to drop them later)."""
        super().put_writes(config, writes, task_id, task_path)
        thread, ns = _where(config)
        self._write_ids.setdefault((thread, ns), set()).add(config["configurable"]["checkpoint_id"])

    def delete_thread(self, thread_id: str) -> None:
        """Forget a thread (by its own indexes: no scan of every thread's values)."""
        thread = str(thread_id)
        for ns in self.storage.pop(thread, {}):
            for channel, version in self._versions.pop((thread, ns), {}).items():
                self.blobs.pop((thread, ns, channel, version), None)
            for checkpoint_id in self._write_ids.pop((thread, ns), set()):
                self.writes.pop((thread, ns, checkpoint_id), None)
        self.last_used.pop(thread, None)

    def _touch(self, thread: str) -> None:
        now = self.retention.clock()
        self.last_used[thread] = now
        self.last_used.move_to_end(thread)
        cutoff = now - self.retention.memory_ttl_s
        while self.last_used:
            oldest, used = next(iter(self.last_used.items()))
            if oldest == thread or (
                used >= cutoff and len(self.last_used) <= self.retention.memory_max_threads
            ):
                break
            self.delete_thread(oldest)


THREADS_TABLE = (
    "CREATE TABLE IF NOT EXISTS caprag_threads "
    "(thread_id TEXT PRIMARY KEY, last_used REAL NOT NULL)"
)


class PrunedSqliteSaver(AsyncSqliteSaver):
    """The SQLite checkpointer, holding only each thread's latest checkpoint and deleting
    threads idle longer than the retention (checked on opening and every prune interval)."""

    def __init__(self, path: str, retention: Retention | None = None) -> None:
        import aiosqlite

        super().__init__(aiosqlite.connect(path), serde=serializer())
        self.path = path
        self.retention = retention or Retention()
        self.last_pruned = float("-inf")
        self._ready = False

    async def setup(self) -> None:
        """Create the tables, then prune once (start-up)."""
        if self._ready:
            return
        await super().setup()
        async with self.lock:
            await self.conn.execute(THREADS_TABLE)
            await self.conn.commit()
        self._ready = True
        await self.prune_idle()

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store the checkpoint, delete the thread's older ones, note when it was last used."""
        saved = await super().aput(config, checkpoint, metadata, new_versions)
        thread, ns = _where(config)
        now = self.retention.clock()
        await self._run(
            [
                (
                    "DELETE FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? "
                    "AND checkpoint_id < ?",
                    (thread, ns, checkpoint["id"]),
                ),
                (
                    "DELETE FROM writes WHERE thread_id = ? AND checkpoint_ns = ? "
                    "AND checkpoint_id < ?",
                    (thread, ns, checkpoint["id"]),
                ),
                (
                    "INSERT INTO caprag_threads VALUES (?, ?) "
                    "ON CONFLICT(thread_id) DO UPDATE SET last_used = excluded.last_used",
                    (thread, now),
                ),
            ]
        )
        if now - self.last_pruned >= self.retention.prune_interval_s:
            await self.prune_idle()
        return saved

    async def prune_idle(self) -> list[str]:
        """Delete threads idle longer than the retention and all but each thread's latest
        checkpoint; return the deleted threads. Threads written before this policy existed
        start their idle time now."""
        await self.setup()
        now = self.retention.clock()
        cutoff = now - self.retention.sqlite_ttl_days * DAY_S
        async with self.lock:
            await self.conn.execute(
                "INSERT OR IGNORE INTO caprag_threads "
                "SELECT DISTINCT thread_id, ? FROM checkpoints",
                (now,),
            )
            async with self.conn.execute(
                "SELECT thread_id FROM caprag_threads WHERE last_used < ?", (cutoff,)
            ) as cursor:
                idle = [str(row[0]) for row in await cursor.fetchall()]
        idle_threads = "SELECT thread_id FROM caprag_threads WHERE last_used < ?"
        await self._run(
            [
                (f"DELETE FROM checkpoints WHERE thread_id IN ({idle_threads})", (cutoff,)),
                (f"DELETE FROM writes WHERE thread_id IN ({idle_threads})", (cutoff,)),
                ("DELETE FROM caprag_threads WHERE last_used < ?", (cutoff,)),
                (
                    "DELETE FROM checkpoints WHERE checkpoint_id < (SELECT MAX(c.checkpoint_id) "
                    "FROM checkpoints c WHERE c.thread_id = checkpoints.thread_id "
                    "AND c.checkpoint_ns = checkpoints.checkpoint_ns)",
                    (),
                ),
                (
                    "DELETE FROM writes WHERE NOT EXISTS (SELECT 1 FROM checkpoints c "
                    "WHERE c.thread_id = writes.thread_id AND c.checkpoint_ns = "
                    "writes.checkpoint_ns AND c.checkpoint_id = writes.checkpoint_id)",
                    (),
                ),
            ]
        )
        self.last_pruned = now
        return idle

    async def _run(self, statements: Sequence[tuple[str, tuple[Any, ...]]]) -> None:
        async with self.lock, self.conn.cursor() as cursor:
            for sql, parameters in statements:
                await cursor.execute(sql, parameters)
            await self.conn.commit()


def _memory(_target: str, retention: Retention) -> BaseCheckpointSaver[Any]:
    return BoundedMemorySaver(retention)


def _sqlite(target: str, retention: Retention) -> BaseCheckpointSaver[Any]:
    return PrunedSqliteSaver(target, retention)


CHECKPOINTERS: dict[str, Callable[[str, Retention], BaseCheckpointSaver[Any]]] = {
    "memory": _memory,
    "sqlite": _sqlite,
}


def check_spec(spec: str) -> tuple[str, str]:
    """The kind and target of a checkpointer spec; ConfigError naming the choices if unknown."""
    kind, _, target = spec.partition(":")
    if kind not in CHECKPOINTERS:
        allowed = ", ".join(f"{k}{':PATH' if k == 'sqlite' else ''}" for k in CHECKPOINTERS)
        raise ConfigError(f"unknown checkpointer {spec!r}; allowed: {allowed}")
    if kind == "sqlite" and not target:
        raise ConfigError("CAPRAG_CHECKPOINTER=sqlite:PATH needs a file path, e.g. sqlite:chat.db")
    return kind, target


def make_checkpointer(
    spec: str = "memory", retention: Retention | None = None
) -> BaseCheckpointSaver[Any]:
    """'memory' or 'sqlite:PATH' (the conversations survive restarts). A SQLite one must be
    made inside the event loop that will use it, and connects on first use."""
    kind, target = check_spec(spec)
    return CHECKPOINTERS[kind](target, retention or Retention())


async def open_checkpointer(
    spec: str = "memory", retention: Retention | None = None
) -> BaseCheckpointSaver[Any]:
    """Make the checkpointer and open its store now (tables created, idle threads pruned), so a
    store that cannot be opened fails at start-up with a ConfigError, not on the first question."""
    saver = make_checkpointer(spec, retention)
    if isinstance(saver, PrunedSqliteSaver):
        try:
            await saver.setup()
        except (sqlite3.Error, OSError) as exc:
            await close_checkpointer(saver)
            await _worker_stopped(saver.conn)
            where = Path(saver.path).resolve()
            shown = "" if str(where) == saver.path else f" ({where})"
            raise ConfigError(
                f"cannot open the conversation store CAPRAG_CHECKPOINTER={spec}{shown}: {exc}"
            ) from None
    return saver


async def _worker_stopped(conn: Any) -> None:
    """Wait (off the loop) for a connection's worker thread that is stopping: aiosqlite stops it
    on a failed connect, and it must report back while this loop is still running."""
    thread = getattr(conn, "_thread", None)
    if thread is not None and thread.is_alive():
        await asyncio.to_thread(thread.join, 30)


async def close_checkpointer(saver: BaseCheckpointSaver[Any]) -> None:
    """Close the connection of a checkpointer that holds one."""
    conn = getattr(saver, "conn", None)
    if conn is not None and hasattr(conn, "close"):
        await conn.close()
