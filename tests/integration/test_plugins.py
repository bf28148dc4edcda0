"""A retriever and a strategy added by one module (tests/toy_plugin.py) with one registration
each are choosable everywhere a built-in one is: the API's settings, the CLI through
CAPRAG_PLUGINS, Hydra's groups and a real harness run."""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from caprag.config import PROJECT_ROOT, load_settings
from caprag.errors import ConfigError
from caprag.retrieval.retrievers import RETRIEVERS
from caprag.serve.services import build_pipeline
from caprag.strategies import STRATEGIES
from experiments.harness.identity import retriever_label
from experiments.harness.run import run
from tests.conftest import FIXTURE_BOOKS
from tests.integration.test_harness import make_cfg

HANG_S = 120  # only catches a hang; the call takes seconds
PLUGIN = "tests.toy_plugin"


@contextlib.contextmanager
def plugin_unloaded_after() -> Iterator[None]:
    """Whatever imports the toy plugin in the block (the test, or CAPRAG_PLUGINS), it is
    unregistered and forgotten after it: no other test sees its retriever or strategy."""
    try:
        yield
    finally:
        sys.modules.pop(PLUGIN, None)
        for registry, name in ((RETRIEVERS, "toy"), (STRATEGIES, "toy-keywords")):
            if name in registry:
                registry.unregister(name)


@pytest.fixture
def toy() -> Iterator[ModuleType]:
    """The toy plugin, imported (so registered) for one test."""
    with plugin_unloaded_after():
        yield importlib.import_module(PLUGIN)


def test_the_settings_accept_the_registered_names(fixture_env: Path, toy: ModuleType) -> None:
    settings = load_settings(retriever="toy", retrieval_strategy="toy-keywords")
    pipeline = build_pipeline(settings)
    assert isinstance(pipeline.strategy, toy.KeywordQueryStrategy)
    assert "basics/torches" in pipeline.strategy.retriever.parents()  # type: ignore[attr-defined]
    with pytest.raises(ConfigError) as info:
        load_settings(retriever="tfidf")
    message = str(info.value)
    assert "CAPRAG_RETRIEVER='tfidf': Input should be " in message
    assert all(f"'{name}'" in message for name in ("bm25", "dense", "hybrid", "toy"))


def test_plugins_are_imported_by_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "toy" not in RETRIEVERS
    with plugin_unloaded_after():
        monkeypatch.setenv("CAPRAG_PLUGINS", f" {PLUGIN} ,")
        assert load_settings(retriever="toy").retriever == "toy"
        monkeypatch.setenv("CAPRAG_PLUGINS", f"{PLUGIN},no_such_plugin_module")
        with pytest.raises(ConfigError, match="CAPRAG_PLUGINS='no_such_plugin_module': cannot"):
            load_settings()


def test_without_the_plugin_its_names_are_refused() -> None:
    with pytest.raises(ConfigError, match="RETRIEVAL_STRATEGY='toy-keywords': Input should be"):
        load_settings(retrieval_strategy="toy-keywords")


def test_every_registered_retriever_and_strategy_is_a_hydra_group_member(tmp_path: Path) -> None:
    for name in RETRIEVERS:  # dense has no yaml of its own (minilm.yaml is dense with MiniLM)
        assert make_cfg(tmp_path, f"retriever={name}").retriever.index.kind == name
    for name, cls in STRATEGIES.items():
        target = make_cfg(tmp_path, f"strategy={name}").strategy._target_
        assert target in (f"caprag.strategies.{cls.__name__}", f"{cls.__module__}.{cls.__name__}")


@pytest.mark.usefixtures("toy")
def test_hydra_composes_and_runs_the_registered_retriever_and_strategy(tmp_path: Path) -> None:
    cfg = make_cfg(
        tmp_path,
        "retriever=toy",
        "strategy=toy-keywords",
        "dataset=single_book",
        "tracking.enabled=false",
        "experiment.ragas=false",
        "experiment.resume=never",
    )
    assert cfg.retriever.index.kind == "toy" and cfg.retriever.k == 8
    assert cfg.strategy._target_ == "tests.toy_plugin.KeywordQueryStrategy"
    assert retriever_label(cfg) == "toy"
    result = run(cfg)
    assert result.strategy == "toy-keywords" and result.name.endswith(":toy")
    assert result.rows and all(row.status == "ok" for row in result.rows)
    torch = next(row for row in result.rows if row.question_id == "t-sb-1")
    assert torch.context_ids[0] == "basics/torches"
    assert torch.values["recall_at_k"] == 1.0


def test_the_cli_loads_the_plugin_named_in_the_environment(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(PROJECT_ROOT),
        "CAPRAG_PLUGINS": "tests.toy_plugin",
        "CAPRAG_RETRIEVER": "toy",
        "RETRIEVAL_STRATEGY": "toy-keywords",
        "CAPRAG_CORPUS": str(FIXTURE_BOOKS),
        "CAPRAG_CHROMA_DIR": str(tmp_path / "store"),
        "CAPRAG_CHECKPOINTER": "memory",
        "CAPRAG_DECISION_LOG": "off",
    }
    done = subprocess.run(
        [sys.executable, "-m", "caprag", "ask", "How long does a torch burn?"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 0, done.stderr
    assert "[basics/torches]" in done.stdout
    assert "Strategy toy-keywords: 1 hop(s)" in done.stdout
    assert not (tmp_path / "store").exists()  # the toy keeps its index in memory
