"""The MLflow table of a run: each row whole beside flat scalar columns, read back as rows by the
reports' loader, for runs logged now and runs logged before rows were kept whole (schema 1)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments.results import runs, tracking
from experiments.results.aggregate import aggregate, summary_metrics
from experiments.results.row import ROW, rows_of
from experiments.results.tracking import TABLE, mlflow
from tests.unit.test_row import LEGACY_TABLE, full_row


def test_a_logged_table_reads_back_as_the_rows_with_scalars_for_pandas(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    experiment = tracking.use_experiment(uri, "caprag")
    rows = [full_row("t-1"), full_row("t-2").model_copy(update={"gold_ids": ["a/x", "b/y"]})]
    rows[1].values["recall_at_k"] = 0.5
    with mlflow.start_run(experiment_id=experiment) as run:
        tracking.log_results(rows, aggregate(rows), summary_metrics(rows))
    table = mlflow.MlflowClient().load_table(experiment, TABLE, run_ids=[run.info.run_id])
    assert rows_of(table) == rows
    assert list(table[table["recall_at_k"] < 1]["question_id"]) == ["t-2"]  # plain pandas
    logged = mlflow.get_run(run.info.run_id).data.metrics
    assert logged["recall_at_k/gold_hops/1"] == 1.0 and logged["recall_at_k/gold_hops/2"] == 0.5
    assert rows_of(runs.load_run(run.info.run_id).questions) == rows


def test_a_run_logged_before_whole_rows_loads_as_rows(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    experiment = tracking.use_experiment(uri, "caprag")
    legacy = pd.read_json(LEGACY_TABLE, orient="split")
    with mlflow.start_run(experiment_id=experiment, tags={"caprag.schema": "1"}) as run:
        mlflow.log_table(legacy, artifact_file=TABLE)
    loaded = runs.load_run(run.info.run_id).questions
    assert ROW in loaded.columns and list(loaded["question_id"]) == list(legacy["question_id"])
    assert rows_of(loaded) == rows_of(legacy)
    assert loaded["hops"].tolist()[:4] == legacy["hops"].tolist()[:4]
