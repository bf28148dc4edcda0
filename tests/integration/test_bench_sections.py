"""Bench sections that run the harness, on a handful of questions (numbers, not speed): the
overhead section and the memory section."""

from __future__ import annotations

import pytest

from experiments.perf.memory import section
from experiments.perf.overhead import bench_overhead
from tests.conftest import FIXTURE_BOOKS, FIXTURE_QUESTIONS

PHASES = (
    "evaluate",
    "MLflow metrics + table",
    "MLflow traces",
    "MLflow run bookkeeping",
    "MLflow total",
)


@pytest.mark.slow
def test_overhead_section_measures_every_phase() -> None:
    result = bench_overhead(questions=6, warmup=1, attempts=1, cli_attempts=1)
    assert result["questions"] == 6
    rows = {row["phase"]: row for row in result["rows"]}  # type: ignore[attr-defined]
    assert set(rows) == set(PHASES)
    for name in ("evaluate", "MLflow traces", "MLflow total"):
        assert rows[name]["ms_per_question"] > 0, name
    markdown = str(result["markdown"])
    assert markdown.startswith("6 questions of `dataset=curated`")
    assert "| phase | includes | total s | ms/question | CPU ms/question |" in markdown
    for name in ("evaluate", "MLflow traces", "MLflow total"):
        assert f"| {name} |" in markdown
    on, off = result["traces_on_s"], result["traces_off_s"]
    assert len(on) == len(off) == 1  # type: ignore[arg-type]
    assert result["traces_ratio"] == min(on) / min(off)  # type: ignore[type-var, operator]
    assert "| traces off | traces on | ratio | target |" in markdown
    (writer_cpu,) = result["writer_cpu_s"]  # type: ignore[misc]
    assert writer_cpu > 0  # the kept writer's CPU, read while it lives
    cli_on, cli_off = result["cli_traces_on_s"], result["cli_traces_off_s"]
    assert len(cli_on) == len(cli_off) == 1  # type: ignore[arg-type]
    assert "One run per process (`python -m experiments.run`" in markdown


@pytest.mark.slow
def test_section_reports_rss_as_the_run_goes() -> None:
    # Two copies of the fixture sets (9 questions each) on the fixture books: the section's
    # bookkeeping (a mark, then the last question), without writing hundreds of traces.
    result = section(questions=10, marks=(9,), source=FIXTURE_QUESTIONS, corpus=FIXTURE_BOOKS)
    assert result["questions"] == 18
    points = result["points"]
    assert [p["questions"] for p in points] == [9, 18]  # type: ignore[index]
    assert float(result["peak_mib"]) >= float(result["rss_at_questions_mib"]) > 0  # type: ignore[arg-type]
    assert "MiB per 1,000 questions" in str(result["markdown"])
