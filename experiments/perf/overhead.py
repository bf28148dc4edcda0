"""Harness overhead per question with an LLM that answers at once, by phase, and what MLflow
traces add to a whole run.

`python -m experiments.perf.overhead [--questions 100]` prints the Markdown and the JSON;
`make bench` runs it as section `overhead`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from caprag.config import PROJECT_ROOT
from experiments.perf.harness_bench import (
    QUIET_ENV,
    base_overrides,
    compose_cfg,
    environment,
    process_cpu_s,
    timed_run,
)
from experiments.support.fakes import instant_steps

TRACES_TARGET = 1.10
"""A run with traces may take at most this multiple of the same run without them."""


def _writer_cpu() -> float:
    """CPU seconds of the trace writers so far: the ended ones (children's resource usage) and
    the process's kept writer (from /proc)."""
    from experiments.results import traces

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    kept = traces._shared
    alive = process_cpu_s(kept.pid) if kept is not None and kept._alive() else 0.0
    return usage.ru_utime + usage.ru_stime + alive


def _cli_table(cli: dict[bool, list[float]]) -> str:
    """The Markdown of the whole-process comparison (empty when it was not measured)."""
    if not cli[True] or not cli[False]:
        return ""
    on, off = min(cli[True]), min(cli[False])
    return (
        "\n\nOne run per process (`python -m experiments.run` with the same overrides, "
        "imports, setup and MLflow logging included; the traced one forks its writer at the start "
        f"of `run()`), alternated {len(cli[True])} times, fastest of each: traces off {off:.2f} s, "
        f"on {on:.2f} s, ratio {on / off:.3f}×."
    )


def _cli_run_s(folder: Path, *overrides: str) -> float:
    """Wall seconds of one `python -m experiments.run` (a fresh process: imports, setup, the run,
    MLflow logging, and with traces the writer's fork) with every file inside `folder`."""
    command = [
        sys.executable,
        "-m",
        "experiments.run",
        *base_overrides(folder),
        f"hydra.run.dir={folder / 'hydra'}",
        *overrides,
    ]
    start = time.perf_counter()
    done = subprocess.run(
        command,
        cwd=PROJECT_ROOT,
        env={**os.environ, **QUIET_ENV},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"a benchmark CLI run failed ({done.returncode}): {done.stderr[-2000:]}")
    return time.perf_counter() - start


def _phases(watch: Any, n: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The phase rows (raw numbers and Markdown table lines) of one timed run."""

    def phase(label: str) -> tuple[float, float]:
        return watch.seconds.get(label, 0.0), watch.cpu.get(label, 0.0)

    def minus(total: tuple[float, float], *parts: str) -> tuple[float, float]:
        return (
            total[0] - sum(phase(p)[0] for p in parts),
            total[1] - sum(phase(p)[1] for p in parts),
        )

    # The phases `run` reports through its hooks (experiments.harness.hooks); finer ones
    # (retrieval, scoring) would need the project's functions patched, which benches do not do.
    mlflow_logged = ("mlflow_results", "mlflow_traces")
    bookkeeping = minus(phase("run"), "setup", "evaluate", *mlflow_logged)
    mlflow_total = minus(phase("run"), "setup", "evaluate")
    phases = [
        (
            "evaluate",
            "graph, strategy, retrieval, scoring, journal, trace queueing (`Evaluator.run`)",
            phase("evaluate"),
        ),
        ("MLflow metrics + table", "aggregates, coverage, questions.json", phase("mlflow_results")),
        (
            "MLflow traces",
            "waiting at the end for the trace writer's last batch and its list of the traces it "
            "wrote (the store is searched only for questions it did not report)",
            phase("mlflow_traces"),
        ),
        (
            "MLflow run bookkeeping",
            "experiment lookup, start/end run, params + config.json, tags, writer start",
            bookkeeping,
        ),
        ("MLflow total", "the three MLflow rows", mlflow_total),
    ]
    rows = [
        {
            "phase": name.strip(),
            "includes": what,
            "seconds": sec,
            "cpu_seconds": cpu,
            "ms_per_question": sec / n * 1e3,
            "cpu_ms_per_question": cpu / n * 1e3,
        }
        for name, what, (sec, cpu) in phases
    ]
    table = [
        "| phase | includes | total s | ms/question | CPU ms/question |",
        "|---|---|---|---|---|",
    ]
    table += [
        f"| {name.replace('  ', '↳ ')} | {what} | {sec:.2f} | {sec / n * 1e3:.1f} | "
        f"{cpu / n * 1e3:.1f} |"
        for name, what, (sec, cpu) in phases
    ]
    return rows, table


def bench_overhead(
    questions: int = 100, warmup: int = 5, attempts: int = 4, cli_attempts: int = 2
) -> dict[str, object]:
    """Harness time per question with an instant LLM by phase; the whole run with traces on and
    off (alternated `attempts` times, the fastest of each kept) and their ratio; the same for
    whole CLI processes (`cli_attempts` times each; 0: not measured), where the first run of a
    process forks the writer."""

    llm = ["llm=offline", f"++llm._target_={instant_steps.__module__}.instant_steps"]
    # No row reuse: every run answers every question (the runs share one store and cache file).
    common = [
        *llm,
        "retriever=wordllama",
        "dataset=curated",
        "experiment.concurrency=1",
        "experiment.cache=false",
    ]
    per_set = f"experiment.limit_per_set={max(1, questions // 2)}"
    walls: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    writer: list[float] = []
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp, environment(**QUIET_ENV):
        folder = Path(tmp)
        # A warm-up run pays the one-time costs: imports (ragas ~3 s), ingest, MLflow tables.
        timed_run(compose_cfg(folder, *common, f"experiment.limit={warmup}"))
        result, watch, _wall = timed_run(compose_cfg(folder, *common, per_set))
        for _attempt in range(attempts):
            for traced in (False, True):
                flag = f"tracking.traces={str(traced).lower()}"
                writer_cpu = _writer_cpu()
                _result, timed, wall_s = timed_run(compose_cfg(folder, *common, per_set, flag))
                walls[traced].append(wall_s)
                cpu[traced].append(timed.cpu["run"])
                if traced:
                    writer.append(_writer_cpu() - writer_cpu)
                loads.append(os.getloadavg()[0])
        cli: dict[bool, list[float]] = {True: [], False: []}
        for _attempt in range(cli_attempts):
            for traced in (False, True):
                flag = f"tracking.traces={str(traced).lower()}"
                cli[traced].append(_cli_run_s(folder, *common, per_set, flag))
                loads.append(os.getloadavg()[0])
    n = len(result.rows)
    rows, table = _phases(watch, n)
    fastest_on, fastest_off = min(walls[True]), min(walls[False])
    ratio = fastest_on / fastest_off
    verdict = "met" if ratio <= TRACES_TARGET else "**miss**"
    setup_s, wall = watch.seconds.get("setup", 0.0), watch.seconds.get("run", 0.0)
    load = f"{min(loads):.1f}–{max(loads):.1f}"
    markdown = (
        f"{n} questions of `dataset=curated` (first {questions // 2} of single_book and of "
        "cross_book), `strategy=multi-hop`, `retriever=wordllama`, `experiment.concurrency=1`, "
        "`experiment.cache=false` (every run answers every question), "
        "through `experiments.harness.run.run(cfg)`. The LLM is `instant_steps` "
        "(`experiments/bench_harness.py`): minimal valid replies at once, zero usage, so every "
        "millisecond here is the harness's own. "
        f"Warm process: a {warmup}-question warm-up run in the same store paid imports, ingest "
        "and MLflow table creation first. Setup of the measured run (dataset, index open, "
        f"strategy) took {setup_s:.2f} s once and is not in the table; whole run() "
        f"{wall:.2f} s; load average {load} on {os.cpu_count()} cores during the section. "
        "CPU = CPU time of the harness process (all threads) during the phase; the trace writer "
        "is a separate process, so its CPU is not in these columns.\n\n"
        + "\n".join(table)
        + "\n\nWhole run() with traces on and off (`tracking.traces`), same process and store, "
        f"alternated {attempts} times, fastest of each:\n\n"
        "| traces off | traces on | ratio | target | harness CPU off / on | writer CPU |\n"
        "|---|---|---|---|---|---|\n"
        f"| {fastest_off:.2f} s | {fastest_on:.2f} s | {ratio:.3f}× "
        f"| ≤ {TRACES_TARGET:.2f}× {verdict} | {min(cpu[False]):.2f} s / {min(cpu[True]):.2f} s "
        f"| {min(writer):.2f} s ({min(writer) / n * 1e3:.1f} ms/question) |\n\n"
        "The writer is a process forked once per harness process (here by the warm-up run) and "
        "kept for its later runs; its CPU (from /proc) lands on the other core when one is free, "
        "and competes with the harness when none is." + _cli_table(cli)
    )
    return {
        "markdown": markdown,
        "questions": n,
        "wall_s": wall,
        "setup_s": setup_s,
        "evaluate_ms_per_question": watch.seconds.get("evaluate", 0.0) / n * 1e3,
        "mlflow_ms_per_question": next(r for r in rows if r["phase"] == "MLflow total")[
            "ms_per_question"
        ],
        "traces_on_s": walls[True],
        "traces_off_s": walls[False],
        "traces_ratio": ratio,
        "harness_cpu_off_s": cpu[False],
        "harness_cpu_on_s": cpu[True],
        "writer_cpu_s": writer,
        "traces_target": TRACES_TARGET,
        "cli_traces_on_s": cli[True],
        "cli_traces_off_s": cli[False],
        "load_average": loads,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    """Measure, print the Markdown and then the JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.perf.overhead", description=__doc__
    )
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--attempts", type=int, default=4)
    parser.add_argument("--cli-attempts", type=int, default=2, help="0: no whole-process runs")
    args = parser.parse_args(argv)
    result = bench_overhead(args.questions, args.warmup, args.attempts, args.cli_attempts)
    print(result["markdown"])
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
