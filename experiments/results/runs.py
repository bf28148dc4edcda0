"""Reading runs back from MLflow: metrics, coverage and per-question tables, for reports."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from experiments.results import tracking
from experiments.results.row import normalised
from experiments.results.tracking import mlflow


@dataclass
class LoadedRun:
    """A finished run as the report and summary need it."""

    run_id: str
    name: str
    strategy: str
    dataset: str
    llm: str
    metrics: dict[str, float]
    questions: pd.DataFrame
    """The per-question table: scalar columns, each row whole in `row` (`row.rows_of`)."""

    display: str = ""
    generator: str = ""
    """Who wrote the answers: `rule` (the offline extractive reader) or `llm` ('' if untagged)."""

    @property
    def label(self) -> str:
        """Short label for tables and plots."""
        return self.display or f"{self.strategy} ({self.llm})"

    def coverage(self) -> dict[str, str]:
        """metric → 'n/total' from the logged coverage shares."""
        total = int(self.metrics.get("questions", 0))
        return {
            name.removesuffix(".coverage"): f"{round(value * total)}/{total}"
            for name, value in self.metrics.items()
            if name.endswith(".coverage") and value < 1.0
        }


def distinct_labels(runs: list[LoadedRun]) -> None:
    """Use run names as labels where 'strategy (llm)' would not tell runs apart."""
    seen = [r.label for r in runs]
    for run in runs:
        if seen.count(run.label) > 1:
            run.display = run.name


def connect(uri: str | None = None, experiment: str = "caprag") -> str:
    """Point MLflow at the store; return the experiment id."""
    return tracking.use_experiment(tracking.tracking_uri(uri), experiment)


def load_run(run_id: str) -> LoadedRun:
    """One run with its per-question table (a schema-1 table in the current form)."""
    run = mlflow.get_run(run_id)
    tags = run.data.tags
    try:
        questions = mlflow.MlflowClient().load_table(
            run.info.experiment_id, tracking.TABLE, run_ids=[run_id]
        )
    except Exception:  # a run without the table (failed early, older schema)
        questions = pd.DataFrame()
    return LoadedRun(
        run_id=run_id,
        name=run.info.run_name or run_id,
        strategy=tags.get("caprag.strategy", "?"),
        dataset=tags.get("caprag.dataset", "?"),
        llm=tags.get("caprag.llm", "?"),
        metrics=dict(run.data.metrics),
        questions=normalised(questions),
        generator=tags.get("caprag.step.generator", ""),
    )


def latest_sweep(experiment_id: str, sweep_id: str | None = None) -> list[str]:
    """Run ids of the children of the most recent sweep (or of the sweep `sweep_id`)."""
    only = f" and tags.`caprag.sweep_id` = '{sweep_id}'" if sweep_id else ""
    parents = mlflow.search_runs(
        experiment_ids=[experiment_id],
        filter_string="tags.`caprag.role` = 'sweep'" + only,
        order_by=["start_time DESC"],
        max_results=1,
        output_format="list",
    )
    if not parents:
        return []
    parent_id = parents[0].info.run_id
    children = mlflow.search_runs(
        experiment_ids=[experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'",
        order_by=["start_time ASC"],
        output_format="list",
    )
    return [c.info.run_id for c in children]
