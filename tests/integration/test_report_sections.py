"""The report's oracle-routing and baseline-significance sections, from hand-made run tables."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments.cli import runs_report
from experiments.results.runs import LoadedRun


def run(run_id: str, strategy: str, recalls: list[float], tokens: list[float]) -> LoadedRun:
    rows = pd.DataFrame(
        {
            "question_id": [f"q{i}" for i in range(len(recalls))],
            "set": ["easy" if i % 2 == 0 else "hard" for i in range(len(recalls))],
            "status": "ok",
            "recall_at_k": recalls,
            "all_gold_at_k": recalls,
            "hops": [1.0 if t < 2000 else 2.0 for t in tokens],
            "tokens": tokens,
        }
    )
    metrics = {"questions": float(len(rows)), "recall_at_k": float(rows["recall_at_k"].mean())}
    return LoadedRun(run_id, f"{run_id}:{strategy}", strategy, "all", "offline", metrics, rows)


def test_report_has_the_oracle_and_baseline_sections(tmp_path: Path) -> None:
    single = run("s1", "single", [1.0, 0.0, 1.0, 0.0], [1000, 1000, 1000, 1000])
    hop = run("h1", "multi-hop", [1.0, 1.0, 1.0, 1.0], [3000, 3000, 3000, 3000])
    before = run("h0", "multi-hop", [1.0, 1.0, 1.0, 0.5], [4000, 4000, 4000, 4000])
    text = runs_report.write_report(
        [single, hop], "sections", baseline=before, out=tmp_path
    ).read_text()
    assert "--baseline h0`" in text
    oracle = text.split("## Oracle routing (ceiling)")[1].split("## Paired")[0]
    # easy questions go to single (1,000 tokens), hard ones to multi-hop (3,000)
    assert "| oracle " in oracle and "| 8,000 " in oracle
    assert "spend 33.3% less than always running multi-hop" in oracle
    paired = text.split("## Paired significance against the baseline run")[1]
    assert "### easy: multi-hop (offline)" in paired and "### hard: multi-hop (offline)" in paired
    assert "single (offline)" not in paired, "only runs of the baseline's strategy are tested"


def test_one_run_gets_no_oracle_section(tmp_path: Path) -> None:
    only = run("s1", "single", [1.0, 0.0], [1000, 1000])
    assert "Oracle routing" not in runs_report.write_report([only], "one", out=tmp_path).read_text()
