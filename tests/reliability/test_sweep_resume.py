"""A sweep killed at any point and started again with the same command is the same sweep: one
parent, one run per strategy, every question answered once, one trace per case (the traces of
rows kept from the killed attempt keep their ids), the parent's description and the verdict.

Each attempt is `python -m experiments.run -m ...` in a process of its own; the killed one runs
through a small script that kills its own process (like kill -9) at a chosen point of the sweep:
during the first job's questions, between the jobs, during the second job's questions or while
the second job waits for its trace export."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import mlflow
import pytest

from caprag.config import PROJECT_ROOT
from tests.conftest import FIXTURE_BOOKS, FIXTURE_QUESTIONS

KILLED = textwrap.dedent(
    """
    import os, signal, sys
    import caprag  # telemetry opt-outs first
    from experiments.harness import identity, journal
    from experiments.results import traces

    point = os.environ["CAPRAG_KILL_AT"]
    seen = {"jobs": 0, "appends": 0}

    def kill() -> None:
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    opened = identity.RunIdentity.open

    def open_run(self, *args, **kwargs):
        seen["jobs"] += 1
        seen["appends"] = 0
        if point == "between" and seen["jobs"] == 2:
            kill()  # the first job finished, the second has asked nothing
        return opened(self, *args, **kwargs)

    appended = journal.Journal.append

    def append(self, *args, **kwargs):
        appended(self, *args, **kwargs)
        seen["appends"] += 1
        job = {"first-questions": 1, "second-questions": 2}.get(point)
        if seen["jobs"] == job and seen["appends"] == 4:
            kill()  # four cases of the job are journaled, the others not yet asked

    closed = traces.TraceWriter.close

    def close(self, rows=()):
        if point == "second-traces" and seen["jobs"] == 2 and rows:
            kill()  # every question answered, the trace export not waited for
        return closed(self, rows)

    identity.RunIdentity.open = open_run
    journal.Journal.append = append
    traces.TraceWriter.close = close
    from experiments.harness.run import main
    sys.argv = ["experiments.run", *sys.argv[1:]]
    main()
    """
)
POINTS = ("first-questions", "between", "second-questions", "second-traces")


def sweep_args(tmp: Path, folder: str) -> list[str]:
    """The sweep's command; each attempt gets a sweep folder of its own, as Hydra's default
    (`multirun/<date>/<time>`) gives every invocation."""
    return [
        "-m",
        f"paths.corpus={FIXTURE_BOOKS}",
        f"paths.questions={FIXTURE_QUESTIONS}",
        f"paths.store={tmp / 'store'}",
        f"paths.cache={tmp / 'llm-cache.sqlite'}",
        f"paths.journals={tmp / 'journals'}",
        f"tracking.uri=sqlite:///{tmp / 'mlruns.db'}",
        f"hydra.sweep.dir={tmp / 'multirun' / folder}",
        "experiment.progress=false",
        "experiment.ragas=false",
        "retriever=wordllama",
        "dataset=all",
        "strategy=multi-hop,multi-question",
    ]


def attempt(tmp: Path, kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    folder = "killed" if kill_at else "again"
    if kill_at is None:
        command = [sys.executable, "-m", "experiments.run", *sweep_args(tmp, folder)]
    else:
        env["CAPRAG_KILL_AT"] = kill_at
        command = [sys.executable, "-c", KILLED, *sweep_args(tmp, folder)]
    return subprocess.run(
        command,
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,  # a hang guard only
    )


def store(tmp: Path) -> dict[str, Any]:
    """What the sweep left in MLflow: parents, runs by strategy, each run's traces by case."""
    mlflow.set_tracking_uri(f"sqlite:///{tmp / 'mlruns.db'}")
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    parents = [r for r in runs if r.data.tags.get("caprag.role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    traced: dict[str, dict[str, list[str]]] = {}
    for run in children:
        cases: dict[str, list[str]] = {}
        for t in mlflow.search_traces(
            locations=[run.info.experiment_id], run_id=run.info.run_id, return_type="list"
        ):
            cases.setdefault(t.info.tags["caprag.case"], []).append(t.info.trace_id)
        traced[run.data.tags["caprag.strategy"]] = cases
    return {
        "parents": parents,
        "children": children,
        "strategies": sorted(r.data.tags["caprag.strategy"] for r in children),
        "status": sorted(r.info.status for r in children),
        "traces": traced,
    }


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("whole")
    done = attempt(tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    found = store(tmp)
    found["stdout"] = done.stdout
    return found


@pytest.mark.slow
@pytest.mark.parametrize("point", POINTS)
def test_a_sweep_killed_and_run_again_ends_as_one_never_interrupted(
    point: str, uninterrupted: dict[str, Any], tmp_path: Path
) -> None:
    killed = attempt(tmp_path, point)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-2000:]
    before = store(tmp_path)
    assert len(before["parents"]) == 1
    kept = {
        (strategy, case): ids[0]
        for strategy, cases in before["traces"].items()
        for case, ids in cases.items()
    }

    again = attempt(tmp_path)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    after = store(tmp_path)
    # One parent, one finished run per strategy, as without the kill.
    assert len(after["parents"]) == len(uninterrupted["parents"]) == 1
    assert after["parents"][0].info.run_id == before["parents"][0].info.run_id
    assert after["strategies"] == uninterrupted["strategies"] == ["multi-hop", "multi-question"]
    assert after["status"] == uninterrupted["status"] == ["FINISHED", "FINISHED"]
    # One trace per case, the same cases as the uninterrupted sweep's.
    for strategy, cases in after["traces"].items():
        assert {case: len(ids) for case, ids in cases.items()} == {
            case: 1 for case in uninterrupted["traces"][strategy]
        }
    # The traces of rows the killed attempt finished are kept, not deleted and written again.
    for (strategy, case), trace_id in kept.items():
        assert after["traces"][strategy][case] == [trace_id]
    # Every question answered once: the second attempt asks only what the first did not finish.
    if point in ("between", "second-questions", "second-traces"):
        assert "finished in an earlier attempt" in again.stdout
    assert "resuming sweep" in again.stdout
    # The parent's description and the verdict, as the uninterrupted sweep's.
    note = after["parents"][0].data.tags.get("mlflow.note.content", "")
    assert note.startswith("**Verdict (2 runs; per set")
    assert "Verdict (2 runs" in again.stdout and "Verdict (2 runs" in uninterrupted["stdout"]
    assert after["parents"][0].data.tags.get("caprag.sweep_state") == "complete"
