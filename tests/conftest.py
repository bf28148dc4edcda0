"""Shared fixtures: the tiny fixture corpus indexed once per session, settings isolated per test."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

import caprag  # noqa: F401  (sets the telemetry opt-outs)
from caprag.options import BUILT_IN
from caprag.retrieval.books import load_books
from caprag.retrieval.embeddings import get_embedder
from caprag.retrieval.store import PassageIndex

pytest_plugins = ("pytester",)  # tests/integration/test_unit_guard.py runs a pytest of its own

FIXTURE_BOOKS = Path(__file__).parent / "fixtures" / "books"
FIXTURE_QUESTIONS = Path(__file__).parent / "fixtures" / "questions"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with a slow test first (the order kept otherwise): `--dist loadfile` hands whole
    modules to the workers in this order, so the long ones start early and the run does not end
    with one worker finishing a long module while the other waits."""
    slow = {item.module for item in items if item.get_closest_marker("slow")}  # type: ignore[attr-defined]
    items.sort(key=lambda item: getattr(item, "module", None) not in slow)


def sigint_as_in_a_terminal() -> None:
    """A child's `preexec_fn`: Ctrl-C as a terminal delivers it. A suite started in the
    background by a shell without job control inherits SIGINT ignored, and Python then never
    turns it into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


ENV_KEYS = [
    "RETRIEVAL_STRATEGY",
    "CAPRAG_LLM",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "CAPRAG_MODEL",
    "CAPRAG_CORPUS",
    "CAPRAG_CHROMA_DIR",
    "CAPRAG_CHROMA_URL",
    "CAPRAG_EMBEDDING",
    "CAPRAG_K",
    "CAPRAG_MAX_HOPS",
    "CAPRAG_RETRIEVER",
    "CAPRAG_CHECKPOINTER",
    "CAPRAG_LLM_TIMEOUT_S",
    "CAPRAG_MAX_BODY_BYTES",
    "CAPRAG_ALLOWED_ORIGINS",
    "CAPRAG_POWER",
    "CAPRAG_DEPTH_CHUNKS",
    "CAPRAG_PLUGINS",
    "CAPRAG_EXPAND_FIRST_HOP",
    "CAPRAG_CALIBRATION",
    "CAPRAG_ADAPTIVE_CLOCK",
    *(options.env_name(option) for options in BUILT_IN.values() for option in options.model_fields),
]
TEST_REQUEST_TIMEOUT_S = "600"
"""The serving time limit in tests (5 s by default): only a hang guard, so a busy machine never
cuts a turn; the tests of the limit set their own, with a clock they move."""


@pytest.fixture(autouse=True)
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees the developer's own settings; the decision log goes to the test's folder
    (not the project's .caprag), and the serving time limit is a hang guard."""
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("CAPRAG_DECISION_LOG", str(tmp_path / "test-decisions.db"))
    monkeypatch.setenv("CAPRAG_REQUEST_TIMEOUT_S", TEST_REQUEST_TIMEOUT_S)


@pytest.fixture(scope="session")
def fixture_index(tmp_path_factory: pytest.TempPathFactory) -> PassageIndex:
    """The three tiny fixture books, indexed with the bundled MiniLM model."""
    index = PassageIndex(tmp_path_factory.mktemp("chroma"), get_embedder("minilm"))
    index.ingest(load_books(FIXTURE_BOOKS), progress=False)
    return index


@pytest.fixture
def fixture_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the settings at the fixture corpus and a fresh store."""
    monkeypatch.setenv("CAPRAG_CORPUS", str(FIXTURE_BOOKS))
    monkeypatch.setenv("CAPRAG_CHROMA_DIR", str(tmp_path / "chroma"))
    return tmp_path


assert "ANONYMIZED_TELEMETRY" in os.environ


@pytest.fixture(scope="session")
def corpus_index(tmp_path_factory: pytest.TempPathFactory) -> PassageIndex:
    """The bundled Cinderwake corpus, indexed once per session (about a minute on 2 cores)."""
    from caprag.config import BUNDLED_CORPUS

    index = PassageIndex(tmp_path_factory.mktemp("corpus"), get_embedder("minilm"))
    index.ingest(load_books(BUNDLED_CORPUS), progress=False)
    return index
