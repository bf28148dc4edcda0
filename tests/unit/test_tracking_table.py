"""The per-question table is replaced, not appended to, when a run logs its results again (a
resumed run whose killed process had already logged them)."""

from __future__ import annotations

import random
from pathlib import Path

from experiments.perf.dashboard_bench import synthetic_rows
from experiments.results import tracking
from experiments.results.aggregate import aggregate, summary_metrics
from experiments.results.row import rows_of
from experiments.results.tracking import mlflow


def test_logging_results_twice_keeps_one_row_per_question(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    experiment_id = tracking.use_experiment(uri, "table-twice")
    rows = synthetic_rows(random.Random(1), "multi-hop", 5)
    with mlflow.start_run(experiment_id=experiment_id) as run:
        tracking.log_results(rows, aggregate(rows), summary_metrics(rows))
        tracking.log_results(rows, aggregate(rows), summary_metrics(rows))
    table = mlflow.MlflowClient().load_table(
        experiment_id, tracking.TABLE, run_ids=[run.info.run_id]
    )
    assert len(table) == 5
    assert list(table["question_id"]) == [row.question_id for row in rows]
    assert rows_of(table) == rows  # each row whole, through the replacing write too
