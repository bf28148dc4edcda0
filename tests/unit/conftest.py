"""Unit tests are pure and fast: no encoder, no Chroma, no MLflow, no RAGAS, no network.

Two guards hold it. A unit test that opens a network socket (connect, bind, a name lookup) fails:
an audit hook (`sys.addaudithook`, Python's public way to watch the interpreter) refuses the
call and the test's teardown reports it, even if the code under test swallowed the error. When
only unit tests run (`pytest tests/unit`, which `make test` does first in its own process), a
unit test after which one of HEAVY_MODULES is imported fails, naming the test or the test module
whose import loaded it. (In a process that also runs other tests, those have loaded them already:
only the network guard applies there.)

What is heavy is what costs seconds to load or reaches outside the process: the stores, the
encoders, MLflow, RAGAS and the dashboard. Hydra, pandas, LangGraph and the scripted chat models
are the logic under test and stay allowed.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes import MemoryRetriever

HEAVY_MODULES = (
    "chromadb",  # the vector store
    "caprag.retrieval.onnx_minilm",  # the MiniLM encoder's graph
    "onnxruntime",  # ... and its runtime
    "wordllama",  # the WordLlama encoder
    "mlflow",  # tracking (a SQLite store, a server)
    "ragas",  # the scoring library (~3 s to import)
    "streamlit",  # the dashboard
    "playwright",  # the browser driver
)
NETWORK_EVENTS = ("socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo")


class Watch:
    """What the audit hook saw: network calls in the running unit test, and where each heavy
    module was first imported."""

    def __init__(self) -> None:
        self.test: str | None = None
        """The unit test running now (None: the network guard is off)."""
        self.where = "startup"
        """The test or test module being run or collected: who an import is blamed on."""
        self.network: list[str] = []
        self.first_import: dict[str, str] = {}
        self.reported: set[str] = set()
        self.unit_only = False


WATCH = Watch()


def _heavy(name: str) -> str | None:
    return next((m for m in HEAVY_MODULES if name == m or name.startswith(m + ".")), None)


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "import":
        heavy = _heavy(str(args[0]))
        if heavy is not None and heavy not in WATCH.first_import:
            WATCH.first_import[heavy] = WATCH.where
        return
    if WATCH.test is None or event not in NETWORK_EVENTS:
        return
    if event != "socket.getaddrinfo" and getattr(args[0], "family", None) == socket.AF_UNIX:
        return  # a socketpair inside the process (asyncio's wake-up pipe), not the network
    said = f"{event} {args[1] if event != 'socket.getaddrinfo' else args[0]!r}"
    WATCH.network.append(said)
    raise ConnectionRefusedError(f"unit tests use no network ({said})")


sys.addaudithook(_audit)


def pytest_collectstart(collector: pytest.Collector) -> None:
    WATCH.where = f"collecting {collector.nodeid or 'the session'}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    WATCH.unit_only = bool(items) and all("pure" in getattr(i, "fixturenames", ()) for i in items)


@pytest.fixture(autouse=True)
def pure(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a unit test that reached the network or (in a unit-only run) loaded a heavy module."""
    WATCH.where = WATCH.test = request.node.nodeid
    WATCH.network = []
    try:
        yield
    finally:
        WATCH.test = None
    problems = [f"it used the network: {call}" for call in WATCH.network]
    if WATCH.unit_only:
        for name in HEAVY_MODULES:
            if name in sys.modules and name not in WATCH.reported:
                WATCH.reported.add(name)
                where = WATCH.first_import.get(name, "before the unit tests started")
                problems.append(f"{name} was imported ({where}); move the test to integration/")
    if problems:
        pytest.fail("a unit test must be pure: " + "; ".join(problems), pytrace=False)


@pytest.fixture
def books() -> MemoryRetriever:
    """The three fixture books in memory, searched by term overlap (no encoder, no Chroma)."""
    return MemoryRetriever.from_books()
