"""MLflow stores for the dashboard tests: real harness runs, odd runs, and an empty store."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from experiments.run import run
from experiments.tracking import mlflow, use_experiment
from tests.integration.test_harness import make_cfg


@dataclass(frozen=True)
class Store:
    """A tracking URI and the ids of the runs logged into it."""

    uri: str
    runs: dict[str, str]


@pytest.fixture(scope="session")
def harness_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """Two real harness runs (multi-hop, multi-question) of one sweep on the fixture corpus."""
    tmp = tmp_path_factory.mktemp("harness")
    uri = f"sqlite:///{tmp / 'mlruns.db'}"
    ids = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        for strategy in ("multi-hop", "multi-question"):
            cfg = make_cfg(tmp, "dataset=all", f"strategy={strategy}", "retriever.k=2")
            result = run(cfg, sweep_id="dashboard-test")
            assert result.run_id is not None
            ids[strategy] = result.run_id
    return Store(uri, ids)


@pytest.fixture(scope="session")
def odd_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """A run without a questions table and a run of an older schema (few tags and columns)."""
    tmp = tmp_path_factory.mktemp("odd")
    uri = f"sqlite:///{tmp / 'mlruns.db'}"
    experiment = use_experiment(uri, "caprag")
    tags = {"caprag.strategy": "single", "caprag.dataset": "cross_book", "caprag.llm": "offline"}
    with mlflow.start_run(
        experiment_id=experiment, run_name="no-table", tags={**tags, "caprag.schema": "1"}
    ) as no_table:
        mlflow.log_metrics({"questions": 3.0, "failed": 3.0})
    with mlflow.start_run(
        experiment_id=experiment, run_name="old-schema", tags={"caprag.strategy": "multi-hop"}
    ) as old:
        mlflow.log_metrics({"recall_at_k": 0.5, "questions": 2.0})
        rows = [
            {
                "question_id": "q1",
                "question": "Old question one?",
                "answer": "a",
                "recall_at_k": 1.0,
            },
            {
                "question_id": "q2",
                "question": "Old question two?",
                "answer": "b",
                "recall_at_k": 0.0,
            },
        ]
        mlflow.log_table(pd.DataFrame(rows), artifact_file="questions.json")
    return Store(uri, {"no-table": no_table.info.run_id, "old": old.info.run_id})


@pytest.fixture
def empty_store(tmp_path: Path) -> str:
    """A store that exists (its experiment created) but holds no run."""
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    use_experiment(uri, "caprag")
    return uri
