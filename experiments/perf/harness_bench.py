"""Helpers for the benchmarks of the experiment harness itself (the overhead, concurrency, cache
and memory sections are in `experiments/perf/`).

Each `bench_*` function is a section of `python -m experiments.bench` and returns its Markdown
with the raw numbers. Runs go through the real `experiments.harness.run.run(cfg)` (composed like the
tests compose it) into a temporary store, MLflow database, journal folder and cache file.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from caprag.config import PROJECT_ROOT
from experiments.harness.hooks import RunHooks

CONF = PROJECT_ROOT / "conf"
STUB_LATENCY_S = 0.2
CACHE_TARGET = 0.05
"""An identical rerun with the response cache may take at most this share of the first run."""
QUIET_ENV = {
    "RAGAS_DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "ANONYMIZED_TELEMETRY": "False",
    "HF_HUB_OFFLINE": "1",
}


# --- running the harness ------------------------------------------------------------------------


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def base_overrides(folder: Path) -> list[str]:
    """Overrides that put every file a run writes inside `folder` (no progress bar, no resume)."""
    return [
        f"paths.store={folder / 'store'}",
        f"paths.journals={folder / 'journals'}",
        f"paths.cache={folder / 'llm-cache.sqlite'}",
        f"tracking.uri=sqlite:///{folder / 'mlruns.db'}",
        "experiment.progress=false",
        "experiment.resume=never",
    ]


def compose_cfg(folder: Path, *overrides: str) -> DictConfig:
    """The project config with every file the run writes inside `folder`."""
    import experiments  # noqa: F401  (registers the ${project:...} resolver)

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[*base_overrides(folder), *overrides])


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """Set environment variables for the block; restore them (and MLflow's URI variable) after."""
    keys = [*values, "MLFLOW_TRACKING_URI"]
    saved = {key: os.environ.get(key) for key in keys}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class Stopwatch(RunHooks):
    """Seconds (and CPU seconds of the whole process) spent in each phase of a run, handed to
    `run(cfg, hooks=...)`: the phases the harness reports (experiments.harness.hooks)."""

    def __init__(self, *, reuse_rows: bool = True) -> None:
        self.seconds: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        """CPU seconds of the whole process (all threads) during the phase."""
        self.calls: dict[str, int] = {}
        self.reuse_rows = reuse_rows

    def _add(self, label: str, seconds: float, cpu: float) -> None:
        self.seconds[label] = self.seconds.get(label, 0.0) + seconds
        self.cpu[label] = self.cpu.get(label, 0.0) + cpu
        self.calls[label] = self.calls.get(label, 0) + 1

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time one phase of the run."""
        start, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self._add(name, time.perf_counter() - start, time.process_time() - cpu)


def timed_run(
    cfg: DictConfig, *, reuse_rows: bool = True, hooks: Stopwatch | None = None
) -> tuple[Any, Stopwatch, float]:
    """run(cfg) with its phases timed (by `hooks` when given), its printout swallowed:
    (result, phases, wall seconds)."""
    from experiments.harness import run as run_module

    watch = hooks or Stopwatch()
    watch.reuse_rows = reuse_rows
    quiet = contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO())
    with quiet[0], quiet[1]:
        start, cpu = time.perf_counter(), time.process_time()
        result = run_module.run(cfg, hooks=watch)
        wall = time.perf_counter() - start
        watch._add("run", wall, time.process_time() - cpu)
    failed = [row.error for row in result.rows if row.status != "ok"]
    if failed:
        raise RuntimeError(f"{len(failed)} questions failed in a benchmark run: {failed[:3]}")
    return result, watch, wall


# --- the stub server in its own process ------------------------------------------------------


def stub_requests(base_url: str) -> int:
    """Chat completions the stub has answered so far."""
    return int(httpx.get(f"{base_url}/stats", timeout=10).json()["requests"])


# --- runs against the stub (experiments/perf/concurrency.py and cache.py) -----------------------


def openai_overrides(questions: int) -> list[str]:
    return [
        "llm=openai",
        "strategy=multi-hop",
        "retriever=wordllama",
        "dataset=curated",
        f"experiment.limit_per_set={max(1, questions // 2)}",
    ]


def stub_run(
    folder: Path,
    base_url: str,
    *overrides: str,
    reuse_rows: bool = True,
    hooks: Stopwatch | None = None,
) -> dict[str, float]:
    """One run against the stub: its LLM calls as the stub counted them, and its times."""
    before = stub_requests(base_url)
    cfg = compose_cfg(folder, *overrides)
    result, watch, wall = timed_run(cfg, reuse_rows=reuse_rows, hooks=hooks)
    calls = stub_requests(base_url) - before
    recorded = sum(row.values.get("llm_calls", 0.0) for row in result.rows)
    cached = sum(row.values.get("llm_calls_cached", 0.0) for row in result.rows)
    return {
        "questions": float(len(result.rows)),
        "calls": float(calls),
        "recorded_calls": recorded,
        "cached_calls": cached,
        "evaluate_s": watch.seconds["evaluate"],
        "evaluate_cpu_s": watch.cpu["evaluate"],
        "load_1min": os.getloadavg()[0],
        "setup_s": watch.seconds["setup"],
        "wall_s": wall,
        "reused_cases": result.summary.get("reused_cases", 0.0),
        "mlflow_results_s": watch.seconds.get("mlflow_results", 0.0),
        "mlflow_traces_s": watch.seconds.get("mlflow_traces", 0.0),
    }
