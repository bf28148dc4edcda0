"""A sweep's parent run stays single when jobs on two machines (no shared file lock) create it at
the same moment: the later creator keeps the earliest parent and deletes its own."""

from __future__ import annotations

import time
from pathlib import Path

import mlflow
import pytest

from experiments.results import tracking


def test_the_later_of_two_machines_keeps_the_earliest_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    experiment = tracking.use_experiment(f"sqlite:///{tmp_path / 'mlruns.db'}", "sweeps")
    client = mlflow.MlflowClient()
    theirs = client.create_run(  # the other machine's, created a second earlier
        experiment,
        start_time=int(time.time() * 1000) - 1000,
        tags={"caprag.sweep_id": "s1", "caprag.role": "sweep"},
    ).info.run_id
    seen = tracking.sweep_parents
    looks = []

    def not_yet_visible(experiment_id: str, sweep_id: str) -> list[str]:
        looks.append(sweep_id)  # the first look ran before the other machine's create landed
        return [] if len(looks) == 1 else seen(experiment_id, sweep_id)

    monkeypatch.setattr(tracking, "sweep_parents", not_yet_visible)
    assert tracking.parent_run(experiment, "s1", "sweep") == theirs
    assert seen(experiment, "s1") == [theirs]  # the one this machine created is deleted
    assert tracking.parent_run(experiment, "s1", "sweep") == theirs
    assert len(looks) == 3
