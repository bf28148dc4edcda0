"""Checkpointers by name: conversation memory in memory (default) or in a SQLite file."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import MemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from caprag.errors import ConfigError

CHECKPOINT_TYPES = [
    *(
        ("caprag.schemas", name)
        for name in ("Question", "Document", "AnswerWithSources", "CallUsage", "RetrievedRef")
    ),
    ("caprag.trace", "HopTrace"),
    ("caprag.steps.analyze", "SufficiencyDecision"),
]


def serializer() -> JsonPlusSerializer:
    """Serializer that may restore caprag's own state types (and no others)."""
    return JsonPlusSerializer(allowed_msgpack_modules=CHECKPOINT_TYPES)


def _memory(_target: str) -> BaseCheckpointSaver[Any]:
    return MemorySaver(serde=serializer())


def _sqlite(target: str) -> BaseCheckpointSaver[Any]:
    import aiosqlite
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    if not target:
        raise ConfigError("CAPRAG_CHECKPOINTER=sqlite:PATH needs a file path, e.g. sqlite:chat.db")
    return AsyncSqliteSaver(aiosqlite.connect(target), serde=serializer())


CHECKPOINTERS: dict[str, Callable[[str], BaseCheckpointSaver[Any]]] = {
    "memory": _memory,
    "sqlite": _sqlite,
}


def make_checkpointer(spec: str = "memory") -> BaseCheckpointSaver[Any]:
    """'memory' or 'sqlite:PATH' (the conversations survive restarts)."""
    kind, _, target = spec.partition(":")
    try:
        builder = CHECKPOINTERS[kind]
    except KeyError:
        allowed = ", ".join(f"{k}{':PATH' if k == 'sqlite' else ''}" for k in CHECKPOINTERS)
        raise ConfigError(f"unknown checkpointer {spec!r}; allowed: {allowed}") from None
    return builder(target)


async def close_checkpointer(saver: BaseCheckpointSaver[Any]) -> None:
    """Close the connection of a checkpointer that holds one."""
    conn = getattr(saver, "conn", None)
    if conn is not None and hasattr(conn, "close"):
        await conn.close()
