"""Runs, per-question tables and traces logged to a real `mlflow server` over HTTP, read back by
the dashboard's store, and resume after kill -9 with the journal on the harness's machine
(the tracking server elsewhere) or not there at all (another machine: reported, not resumed)."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import mlflow
import pytest

from caprag.config import PROJECT_ROOT
from experiments.dashboard import store
from experiments.perf.cluster_demo import mlflow_server, running
from experiments.perf.dashboard_bench import synthetic_rows
from experiments.results import tracking
from experiments.results.aggregate import aggregate, summary_metrics
from tests.conftest import FIXTURE_BOOKS
from tests.reliability.test_faults import FIXTURE_QUESTIONS, KILL_DURING_TRACES

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An MLflow tracking server on 127.0.0.1 (SQLite store, artifacts served by the server)."""
    service = mlflow_server(tmp_path_factory.mktemp("mlflow"))
    with running([service]):
        yield service.address


def harness(args: list[str], *, kill: bool = False) -> subprocess.CompletedProcess[str]:
    code = ["-c", KILL_DURING_TRACES] if kill else ["-m", "experiments.run"]
    return subprocess.run(
        [sys.executable, *code, *args],
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )


def traced_cases(run: mlflow.entities.Run) -> list[str]:
    found = mlflow.search_traces(
        locations=[run.info.experiment_id], run_id=run.info.run_id, return_type="list"
    )
    return [t.info.tags["caprag.case"] for t in found]


def test_kill_9_resumes_over_http_and_a_journal_elsewhere_is_reported(
    server: str, tmp_path: Path
) -> None:
    here, elsewhere = tmp_path / "journals", tmp_path / "other-machine-journals"
    args = [
        f"paths.corpus={FIXTURE_BOOKS}",
        f"paths.questions={FIXTURE_QUESTIONS}",
        f"paths.store={tmp_path / 'store'}",
        f"paths.cache={tmp_path / 'cache.sqlite'}",
        f"tracking.uri={server}",
        "tracking.experiment_name=kill-9-over-http",
        "retriever=wordllama",
        "experiment.progress=false",
        "experiment.ragas=false",
        "dataset=all",
    ]
    # 1. Killed like kill -9 after 6 questions were journaled and 4 traces written.
    first = harness([*args, f"paths.journals={here}"], kill=True)
    assert first.returncode == -signal.SIGKILL, first.stdout + first.stderr
    mlflow.set_tracking_uri(server)
    experiment = mlflow.get_experiment_by_name("kill-9-over-http")
    assert experiment is not None
    (killed,) = mlflow.search_runs([experiment.experiment_id], output_format="list")
    assert killed.info.status == "RUNNING"
    journal = f"{socket.gethostname()}:{(here / killed.info.run_id).resolve()}.jsonl"
    assert killed.data.tags["caprag.journal"] == journal

    # 2. Run again where that journal is not (another machine): said so, and a new run starts.
    other = harness([*args, f"paths.journals={elsewhere}"])
    assert other.returncode == 0, other.stdout + other.stderr
    assert "resuming run" not in other.stdout
    assert (
        f"warning: run {killed.info.run_id} of this configuration is unfinished in {server}, "
        f"but its journal is not in {elsewhere} on {socket.gethostname()} (it is at {journal})"
    ) in other.stderr
    new = re.search(r"MLflow run (\w+) ", other.stdout)
    assert new is not None and new.group(1) != killed.info.run_id
    assert mlflow.get_run(killed.info.run_id).info.status == "RUNNING"

    # 3. Run again where the journal is: the killed run is resumed and finished over HTTP.
    resumed = harness([*args, f"paths.journals={here}"])
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    done = re.search(rf"resuming run {killed.info.run_id}: (\d+) of 9", resumed.stdout)
    assert done is not None, resumed.stdout
    assert int(done.group(1)) >= 6
    finished = mlflow.get_run(killed.info.run_id)
    assert finished.info.status == "FINISHED"
    cases = traced_cases(finished)
    assert len(cases) == len(set(cases)) == int(finished.data.metrics["questions"]) == 9

    # 4. The dashboard reads both runs and their per-question tables from the server.
    runs = store.runs(server)
    assert {killed.info.run_id, new.group(1)} <= set(runs["run_id"])
    for run_id in (killed.info.run_id, new.group(1)):
        table = store.questions(server, experiment.experiment_id, run_id)
        assert table is not None and len(table) == 9


def test_results_logged_twice_over_http_keep_one_table_row_per_question(server: str) -> None:
    """A resumed run whose killed process had logged its table already replaces it over HTTP
    (mlflow.log_table alone would append: 18 rows for 9 questions)."""
    experiment_id = tracking.use_experiment(server, "table-twice-over-http")
    rows = synthetic_rows(random.Random(3), "multi-hop", 9)
    with mlflow.start_run(experiment_id=experiment_id) as run:
        tracking.log_results(rows, aggregate(rows), summary_metrics(rows))
        tracking.log_results(rows, aggregate(rows), summary_metrics(rows))
    table = store.questions(server, experiment_id, run.info.run_id)
    assert table is not None
    assert list(table["question_id"]) == [row.question_id for row in rows]
