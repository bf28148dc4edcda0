"""The per-question table is replaced, not appended to, when a run logs its results again (a
resumed run whose killed process had already logged them)."""

from __future__ import annotations

import random
from pathlib import Path
from unittest import mock

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


def test_a_dataset_insert_lost_to_a_concurrent_run_is_tried_again(tmp_path: Path) -> None:
    """Two runs of a sweep that log the same question set at once race in the tracking server;
    the loser's insert fails on the unique key. The run tries once more and finds the stored set."""
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    experiment_id = tracking.use_experiment(uri, "dataset-race")
    rows = synthetic_rows(random.Random(2), "single", 4)
    real_log_input = mlflow.log_input
    calls: list[str] = []

    def lose_the_first_race(dataset: object, **kwargs: object) -> None:
        calls.append(str(getattr(dataset, "name", "")))
        if len(calls) == 1:
            raise mlflow.exceptions.MlflowException("UNIQUE constraint failed: datasets.name")
        real_log_input(dataset, **kwargs)  # type: ignore[arg-type]

    with (
        mock.patch.object(tracking.mlflow, "log_input", lose_the_first_race),
        mlflow.start_run(experiment_id=experiment_id) as run,
    ):
        tracking.log_results(rows, aggregate(rows), summary_metrics(rows))
    inputs = mlflow.get_run(run.info.run_id).inputs.dataset_inputs
    sets = sorted({row.set for row in rows})
    assert sorted(i.dataset.name for i in inputs) == sets
    assert calls[0] == calls[1]  # the lost insert was tried again
