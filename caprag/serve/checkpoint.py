"""Checkpointers by name: conversation memory in memory (default) or in a SQLite file.

Both are LangGraph's own savers (InMemorySaver, AsyncSqliteSaver) behind `BoundedSaver`, a saver
that reaches them only through the public checkpointer API (`aput`, `aget_tuple`, `alist`,
`adelete_thread`). It keeps only what the next turn needs, so a conversation's footprint stays
bounded however long it runs: each thread's latest checkpoint (a new one replaces the thread:
`adelete_thread`, then the checkpoint is written whole; the graph trims the messages to the
history window). Idle threads are dropped: a thread unused past the TTL is forgotten when it is
next read (a continued thread starts fresh, and `expired` says so) and when other threads are
written; in memory also beyond `memory_max_threads` (least recently used first); in SQLite when
the store is opened and every `prune_interval_s` while turns are written. When a thread was last
used is written into its checkpoint's metadata (`caprag_last_used`, by the retention's clock).

Keeping only the latest checkpoint is safe because the graph state has no `DeltaChannel` (whose
values live in the chain of ancestors): every channel's value is whole in the latest checkpoint.
What it costs: a SQLite write is a delete and an insert (two commits; a crash between them loses
that one conversation), and a checkpoint's parent link is not kept (no state history).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from caprag.config import check_spec
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


LAST_USED = "caprag_last_used"
"""Checkpoint metadata key: when the thread was last written (the retention's clock)."""


def _thread(config: RunnableConfig) -> str:
    return str(config["configurable"]["thread_id"])


def _root(config: RunnableConfig) -> bool:
    return not config["configurable"].get("checkpoint_ns")


class BoundedSaver(BaseCheckpointSaver[str]):
    """A LangGraph saver that keeps each thread's latest checkpoint only and forgets idle threads,
    over another saver's public API (see the module docstring).

    `ttl_s`: a thread unused this long is forgotten; `max_threads`: at most this many threads
    (least recently used go first; None: no cap); `prune_interval_s`: how often writes look for
    idle threads in the whole store (None: never; in memory idle threads go as others are
    written)."""

    def __init__(
        self,
        inner: BaseCheckpointSaver[Any] | None,
        *,
        ttl_s: float,
        max_threads: int | None = None,
        prune_interval_s: float | None = None,
        clock: Callable[[], float] = time.time,
        opener: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(serde=serializer())
        self.inner = inner
        self.opener = opener
        self.ttl_s = ttl_s
        self.max_threads = max_threads
        self.prune_interval_s = prune_interval_s
        self.clock = clock
        self.last_used: OrderedDict[str, float] = OrderedDict()
        """Threads written in this process, least recently used first."""
        self.expired: set[str] = set()
        """Threads forgotten on read because they sat idle past the TTL (until `expired` asks)."""
        self.last_pruned = float("-inf")
        self.path: str | None = None
        """The store's file, when it has one."""
        self.closer: Callable[[], Any] | None = None
        """Closes what `opener` opened."""
        self.opening = asyncio.Lock()

    async def setup(self) -> None:
        """Open the store (when it has an opener), then forget idle threads (start-up)."""
        if self.inner is not None:
            return
        async with self.opening:
            if self.inner is None:
                assert self.opener is not None
                self.inner = await self.opener()
                await self.prune_idle()

    def _saver(self) -> BaseCheckpointSaver[Any]:
        assert self.inner is not None, "open the checkpointer first (await setup())"
        return self.inner

    def get_next_version(self, current: str | None, channel: None) -> str:
        """The wrapped saver's next channel version."""
        return str(self._saver().get_next_version(current, channel))

    def _stale(self, saved: CheckpointTuple | None) -> bool:
        if saved is None:
            return False
        thread = _thread(saved.config)
        used = self.last_used.get(thread, saved.metadata.get(LAST_USED))
        return isinstance(used, int | float) and used < self.clock() - self.ttl_s

    def _forgotten(self, thread: str) -> None:
        self.last_used.pop(thread, None)
        self.expired.add(thread)

    def _written(self, thread: str) -> list[str]:
        """Note the thread's use; the threads to forget now (idle past the TTL, over the cap)."""
        now = self.clock()
        self.last_used[thread] = now
        self.last_used.move_to_end(thread)
        evicted = []
        for other, used in list(self.last_used.items()):
            over_cap = self.max_threads is not None and len(self.last_used) > self.max_threads
            if other == thread or (used >= now - self.ttl_s and not over_cap):
                break
            del self.last_used[other]
            evicted.append(other)
        return evicted

    @staticmethod
    def _fresh(
        config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata, now: float
    ) -> tuple[RunnableConfig, Checkpoint, CheckpointMetadata, ChannelVersions]:
        """The arguments that write a checkpoint whole, as a thread's only one."""
        configurable = config["configurable"]
        root: RunnableConfig = {
            "configurable": {
                "thread_id": configurable["thread_id"],
                "checkpoint_ns": configurable.get("checkpoint_ns", ""),
            }
        }
        stamped = cast(CheckpointMetadata, {**metadata, LAST_USED: now})
        return root, checkpoint, stamped, dict(checkpoint["channel_versions"])

    # -- async (the pipeline's path)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The thread's checkpoint; None (the thread forgotten) when it sat idle past the TTL."""
        await self.setup()
        saved = await self._saver().aget_tuple(config)
        if self._stale(saved):
            await self._saver().adelete_thread(_thread(config))
            self._forgotten(_thread(config))
            return None
        return saved

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """The wrapped saver's checkpoints."""
        await self.setup()
        async for saved in self._saver().alist(config, filter=filter, before=before, limit=limit):
            yield saved

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Write the checkpoint as the thread's only one; forget threads idle or over the cap."""
        await self.setup()
        saver = self._saver()
        if not _root(config):  # a subgraph's checkpoint: kept as written
            return await saver.aput(config, checkpoint, metadata, new_versions)
        thread = _thread(config)
        now = self.clock()
        await saver.adelete_thread(thread)
        saved = await saver.aput(*self._fresh(config, checkpoint, metadata, now))
        for other in self._written(thread):
            await saver.adelete_thread(other)
        if self.prune_interval_s is not None and now - self.last_pruned >= self.prune_interval_s:
            await self.prune_idle()
        return saved

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """The wrapped saver's writes."""
        await self.setup()
        await self._saver().aput_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """Forget a thread."""
        await self.setup()
        await self._saver().adelete_thread(thread_id)
        self.last_used.pop(str(thread_id), None)

    async def prune_idle(self) -> list[str]:
        """Forget threads idle past the TTL and compact threads holding older checkpoints (a
        store written before this policy; its threads start their idle time now); return the
        forgotten threads."""
        saver = self._saver()
        now = self.clock()
        self.last_pruned = now
        latest: dict[str, CheckpointTuple] = {}
        older: set[str] = set()
        async for saved in saver.alist(None):  # newest first
            if not _root(saved.config):
                continue
            thread = _thread(saved.config)
            if thread in latest:
                older.add(thread)
            else:
                latest[thread] = saved
        idle = [t for t, saved in latest.items() if self._stale(saved)]
        for thread in idle:
            await saver.adelete_thread(thread)
            self.last_used.pop(thread, None)
        for thread, saved in latest.items():
            if thread in idle or (thread not in older and LAST_USED in saved.metadata):
                continue
            used = saved.metadata.get(LAST_USED)
            await saver.adelete_thread(thread)
            config = await saver.aput(
                *self._fresh(
                    saved.config,
                    saved.checkpoint,
                    saved.metadata,
                    used if isinstance(used, int | float) else now,
                )
            )
            for task_id, channel, value in saved.pending_writes or []:
                await saver.aput_writes(config, [(channel, value)], task_id)
        return idle

    # -- sync (the same, for callers outside an event loop)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The thread's checkpoint; None (the thread forgotten) when it sat idle past the TTL."""
        saved = self._saver().get_tuple(config)
        if self._stale(saved):
            self._saver().delete_thread(_thread(config))
            self._forgotten(_thread(config))
            return None
        return saved

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """The wrapped saver's checkpoints."""
        return self._saver().list(config, filter=filter, before=before, limit=limit)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Write the checkpoint as the thread's only one; forget threads idle or over the cap."""
        saver = self._saver()
        if not _root(config):
            return saver.put(config, checkpoint, metadata, new_versions)
        thread = _thread(config)
        saver.delete_thread(thread)
        saved = saver.put(*self._fresh(config, checkpoint, metadata, self.clock()))
        for other in self._written(thread):
            saver.delete_thread(other)
        return saved

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """The wrapped saver's writes."""
        self._saver().put_writes(config, writes, task_id, task_path)

    def delete_thread(self, thread_id: str) -> None:
        """Forget a thread."""
        self._saver().delete_thread(thread_id)
        self.last_used.pop(str(thread_id), None)

    async def aclose(self) -> None:
        """Close the store's connection, if it holds one."""
        if self.closer is not None:
            await self.closer()
            self.closer = None
            self.inner = None


def bounded_memory(retention: Retention | None = None) -> BoundedSaver:
    """Conversation memory in this process (InMemorySaver), bounded by the retention."""
    policy = retention or Retention()
    return BoundedSaver(
        InMemorySaver(serde=serializer()),
        ttl_s=policy.memory_ttl_s,
        max_threads=policy.memory_max_threads,
        clock=policy.clock,
    )


def pruned_sqlite(path: str, retention: Retention | None = None) -> BoundedSaver:
    """Conversations in a SQLite file (AsyncSqliteSaver), opened on first use in the event loop
    that uses it, pruned when opened and every prune interval."""
    policy = retention or Retention()
    saver = BoundedSaver(
        None,
        ttl_s=policy.sqlite_ttl_days * DAY_S,
        prune_interval_s=policy.prune_interval_s,
        clock=policy.clock,
    )

    async def opener() -> BaseCheckpointSaver[Any]:
        import aiosqlite
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        # Opened once in a plain thread first: aiosqlite's worker thread reports a failed open
        # after its loop may be gone, so an unopenable file fails here, before it starts.
        await asyncio.to_thread(_check_openable, path)
        conn = await aiosqlite.connect(path)
        saver.closer = conn.close
        try:
            inner = AsyncSqliteSaver(conn, serde=serializer())
            await inner.setup()
        except BaseException:
            saver.closer = None
            await conn.close()
            raise
        return inner

    saver.opener = opener
    saver.path = path
    return saver


def _check_openable(path: str) -> None:
    import sqlite3

    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA schema_version")


def _memory(_target: str, retention: Retention) -> BaseCheckpointSaver[Any]:
    return bounded_memory(retention)


def _sqlite(target: str, retention: Retention) -> BaseCheckpointSaver[Any]:
    return pruned_sqlite(target, retention)


CHECKPOINTERS: dict[str, Callable[[str, Retention], BaseCheckpointSaver[Any]]] = {
    "memory": _memory,
    "sqlite": _sqlite,
}


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
    kind, target = check_spec(spec)
    saver = make_checkpointer(spec, retention)
    if kind == "sqlite" and isinstance(saver, BoundedSaver):
        import sqlite3

        try:
            await saver.setup()
        except (sqlite3.Error, OSError) as exc:
            await close_checkpointer(saver)
            where = Path(target).resolve()
            shown = "" if str(where) == target else f" ({where})"
            raise ConfigError(
                f"cannot open the conversation store CAPRAG_CHECKPOINTER={spec}{shown}: {exc}"
            ) from None
    return saver


def expired(saver: BaseCheckpointSaver[Any] | None, thread_id: str) -> bool:
    """Whether the thread was forgotten on read because it sat idle past the TTL, since this
    was last asked (so a page says it once, on the turn that started fresh)."""
    if not isinstance(saver, BoundedSaver) or str(thread_id) not in saver.expired:
        return False
    saver.expired.discard(str(thread_id))
    return True


async def close_checkpointer(saver: BaseCheckpointSaver[Any]) -> None:
    """Close the store of a checkpointer that holds one open."""
    if isinstance(saver, BoundedSaver):
        await saver.aclose()
