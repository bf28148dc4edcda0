"""A sweep's parent run names what the sweep varies, through the CLI as users call it."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest

from tests.integration.test_harness import fixture_overrides, run_cli


@pytest.mark.slow
def test_sweep_parent_run_names_the_swept_keys_and_dataset(tmp_path: Path) -> None:
    done = run_cli(
        "-m",
        *fixture_overrides(tmp_path),
        "strategy=single,multi-hop",
        "dataset=single_book",
        "retriever=bm25",
        "experiment.limit=1",
        "pipeline.history_pairs=10",
        "tracking.traces=false",
        "experiment.ragas=false",
        f"hydra.sweep.dir={tmp_path / 'multirun'}",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns.db'}")
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    parents = [r for r in runs if r.data.tags.get("caprag.role") == "sweep"]
    assert [p.info.run_name for p in parents] == ["sweep strategy=single,multi-hop · single_book"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(children) == 2
