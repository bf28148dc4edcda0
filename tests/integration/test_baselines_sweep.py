"""The published baselines in a Hydra sweep (`-m strategy=ircot,self-ask,iter-retgen`), as a
user runs it: one job per strategy, each answering over the fixture books with the offline steps
and recording its intermediate reasoning."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from caprag.config import PROJECT_ROOT
from tests.conftest import FIXTURE_BOOKS
from tests.integration.test_harness import FIXTURE_QUESTIONS

HANG_S = 900


def test_a_sweep_runs_every_baseline(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.run",
            "-m",
            "strategy=ircot,self-ask,iter-retgen",
            "retriever=bm25",
            "dataset=cross_book",
            "experiment.limit=2",
            f"paths.corpus={FIXTURE_BOOKS}",
            f"paths.questions={FIXTURE_QUESTIONS}",
            f"paths.store={tmp_path / 'store'}",
            f"paths.cache={tmp_path / 'cache.sqlite'}",
            f"paths.journals={tmp_path / 'journals'}",
            f"tracking.uri=sqlite:///{tmp_path / 'mlruns.db'}",
            "experiment.progress=false",
            "experiment.ragas=false",
            "experiment.workers=1",
            f"hydra.sweep.dir={sweep}",
        ],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=HANG_S,
        env={**os.environ, "OPENAI_API_KEY": ""},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(jobs) == 3
    overrides = [(job / ".hydra" / "overrides.yaml").read_text() for job in jobs]
    for name in ("ircot", "self-ask", "iter-retgen"):
        assert sum(f"strategy={name}" in text for text in overrides) == 1
