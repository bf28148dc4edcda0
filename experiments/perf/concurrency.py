"""Concurrency at the latency limit: evaluation wall time against an LLM stub with fixed latency.

`llm=openai` against `experiments.support.openai_stub` (its own process, fixed latency per call),
`strategy=multi-hop`, `retriever=wordllama`, `dataset=curated`, response cache off, at several
numbers of questions in flight. Wall = `Evaluator.run` (every question answered and scored);
ideal = calls x latency / concurrency, the time spent waiting for the model if nothing else took
any; ratio = wall / ideal. Each level asks enough questions (3 x its concurrency, at least
`questions`) that that many are really in flight. Every level runs with the harness's default
`experiment.workers=auto`; at the levels in `--single-at` (16 and 64) also with one process, so
the gain of the worker processes shows. CPU is counted per process: the harness (parent), its
workers (each reports its own) and the stub server. A CPU profile of a one-process evaluation
(cProfile, at one chosen level) says where the harness's own time per question goes, by library.

`python -m experiments.perf.concurrency [--levels 1 4 16 64] [--single-at 16 64] [--profile-at 16]`
prints the Markdown, then the JSON; `make bench` runs it as section `concurrency`.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from caprag.config import PROJECT_ROOT
from experiments.perf.harness_bench import (
    QUIET_ENV,
    STUB_LATENCY_S,
    Stopwatch,
    compose_cfg,
    environment,
    openai_overrides,
    process_cpu_s,
    stub_requests,
    stub_run,
    timed_run,
)
from experiments.support.servers import openai_stub

TARGETS = {16: 1.3, 64: 1.5}
"""Wall time at this many questions in flight may be at most this multiple of the ideal."""
LEVELS = (1, 4, 16, 64)
SINGLE_AT = (16, 64)
"""Levels also measured with one process (experiment.workers=1) beside the default (auto)."""
MIN_QUESTIONS = 48
PER_SLOT = 3
"""Questions per slot in flight: each slot answers at least this many in turn."""

COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("LangChain (runnables, callbacks, parsers)", ("langchain_core", "langchain_openai")),
    ("openai SDK", ("openai",)),
    (
        "HTTP (httpx, httpcore, anyio, h11)",
        ("httpx", "httpcore", "anyio", "h11", "sniffio", "aiohttp", "yarl", "multidict"),
    ),
    ("LangGraph (graph, checkpointer)", ("langgraph", "ormsgpack")),
    (
        "retrieval (wordllama, numpy)",
        ("wordllama", "numpy", "chromadb", "caprag/retrieval"),
    ),
    ("scoring (RAGAS offline, nltk, rouge)", ("ragas", "nltk", "rouge_score", "rapidfuzz")),
    ("pydantic", ("pydantic", "pydantic_core")),
    ("caprag (steps, strategies, client)", ("caprag",)),
    ("harness (evaluate, journal, rows)", ("experiments", "json", "dataclasses")),
    ("asyncio, threads, selectors", ("asyncio", "concurrent", "threading", "selectors")),
)
"""Where a function's own CPU time is counted, by the path of its file (first match wins)."""


def questions_for(level: int, least: int = MIN_QUESTIONS) -> int:
    """Enough questions that `level` of them are in flight for most of the run."""
    return max(least, PER_SLOT * level)


def _overrides(questions: int, level: int, workers: str = "auto") -> list[str]:
    return [
        *openai_overrides(questions),
        "experiment.cache=false",
        f"experiment.concurrency={level}",
        f"experiment.workers={workers}",
    ]


def _stub_pid() -> int | None:
    """The stub server among this process's children."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == os.getpid() and b"experiments.openai_stub" in command:
            return int(entry.name)
    return None


def _pooled_run(folder: Path, base_url: str, *overrides: str) -> dict[str, Any]:
    """One run against the stub with the evaluation timed (in this process or over workers),
    and the CPU of each process: this one during the evaluation, the workers' (reaped children,
    their start-up included), the trace writer's and the stub's (from /proc)."""
    from experiments.harness import workers
    from experiments.results import traces

    cfg = compose_cfg(folder, *overrides)
    writer = traces.shared() if cfg.tracking.enabled and cfg.tracking.traces else None
    writer_before = process_cpu_s(writer.pid) if writer is not None else 0.0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    stub = _stub_pid()
    stub_cpu = process_cpu_s(stub) if stub else 0.0
    before = stub_requests(base_url)
    result, watch, wall = timed_run(cfg)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    questions = float(len(result.rows))
    return {
        "questions": questions,
        "workers": workers.worker_count(cfg),
        "calls": float(stub_requests(base_url) - before),
        "recorded_calls": sum(row.values.get("llm_calls", 0.0) for row in result.rows),
        "evaluate_s": watch.seconds["evaluate"],
        "evaluate_cpu_s": watch.cpu["evaluate"],
        "workers_cpu_s": (reaped.ru_utime - children.ru_utime)
        + (reaped.ru_stime - children.ru_stime),
        "workers_build_cpu_s": 0.0,  # not told apart from answering without patching the pool
        "workers_build_wall_s": 0.0,
        "stub_cpu_s": (process_cpu_s(stub) - stub_cpu) if stub else float("nan"),
        "trace_writer_cpu_s": (process_cpu_s(writer.pid) - writer_before) if writer else 0.0,
        "load_1min": os.getloadavg()[0],
        "setup_s": watch.seconds["setup"],
        "wall_s": wall,
    }


OTHER = "other"


def _component(filename: str) -> str | None:
    """The component a file belongs to; None for builtins and the rest of the standard library
    (their time is counted where they were called from). The project's own files are matched
    by their path inside the checkout: a checkout folder named `caprag` is no component."""
    root = f"{PROJECT_ROOT}/"
    if filename.startswith(root):
        filename = "/" + filename[len(root) :]
    for name, markers in COMPONENTS:
        if any(f"/{marker}/" in filename or f"/{marker}." in filename for marker in markers):
            return name
    return None


Func = tuple[str, int, str]


def cpu_by_component(stats: pstats.Stats) -> dict[str, float]:
    """Own (not cumulative) profiled seconds per component, so nothing is counted twice; a
    builtin or standard-library function's time is split over its callers' components by how
    much of it each caller caused."""
    table: dict[Func, Any] = stats.stats  # type: ignore[attr-defined]
    memo: dict[Func, dict[str, float]] = {}

    def shares(func: Func, depth: int = 0) -> dict[str, float]:
        if func in memo:
            return memo[func]
        own = _component(func[0])
        if own is not None:
            return {own: 1.0}
        callers = table.get(func, (0, 0, 0.0, 0.0, {}))[4]
        weights = {caller: edge[3] for caller, edge in callers.items()}
        total = sum(weights.values())
        if depth >= 12 or total <= 0:
            return {OTHER: 1.0}
        memo[func] = {OTHER: 1.0}  # a cycle through this function counts as other
        found: dict[str, float] = {}
        for caller, weight in weights.items():
            for name, part in shares(caller, depth + 1).items():
                found[name] = found.get(name, 0.0) + part * weight / total
        memo[func] = found
        return found

    seconds: dict[str, float] = {}
    for func, (_cc, _nc, tottime, _ct, _callers) in table.items():
        for name, part in shares(func).items():
            seconds[name] = seconds.get(name, 0.0) + tottime * part
    return seconds


class Profiled(Stopwatch):
    """Phases timed, and the evaluation profiled (CPU, not waiting)."""

    def __init__(self, profile: cProfile.Profile) -> None:
        super().__init__()
        self.profile = profile

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the phase; profile it when it is the evaluation."""
        with super().phase(name):
            if name != "evaluate":
                yield
                return
            self.profile.enable()
            try:
                yield
            finally:
                self.profile.disable()


def measure(
    levels: Sequence[int] = LEVELS,
    latency_s: float = STUB_LATENCY_S,
    attempts: int = 2,
    least: int = MIN_QUESTIONS,
    profile_at: int | None = 16,
    single_at: Sequence[int] = SINGLE_AT,
) -> dict[str, Any]:
    """Every level's rows (the least disturbed of `attempts`) with the default worker count and,
    at `single_at`, with one process; and the CPU profile of one process at one level."""
    measured: list[dict[str, Any]] = []
    profile_rows: list[dict[str, Any]] = []
    profiled: dict[str, float] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        openai_stub("--latency", str(latency_s)) as (base_url, _),
        environment(OPENAI_API_KEY="bench", OPENAI_BASE_URL=base_url, **QUIET_ENV),
    ):
        folder = Path(tmp)
        # Warm-up: imports, the index, and the workers' fork server (started once per harness
        # process; its start-up is reported apart as the first pooled run's whole wall).
        _pooled_run(folder, base_url, *_overrides(least, 1), "experiment.limit=2")
        first = _pooled_run(folder, base_url, *_overrides(least, 2, "2"), "experiment.limit=4")
        plan = [(level, "auto") for level in levels]
        plan += [(level, "1") for level in levels if level in single_at]
        for level, workers in plan:
            count = questions_for(level, least)
            tries = [
                _pooled_run(folder, base_url, *_overrides(count, level, workers))
                for _ in range(attempts)
            ]
            row: dict[str, Any] = min(tries, key=lambda r: r["evaluate_s"])
            row["concurrency"] = level
            row["setting"] = workers
            row["attempts_evaluate_s"] = [r["evaluate_s"] for r in tries]
            row["ideal_s"] = row["calls"] * latency_s / level
            row["ratio"] = row["evaluate_s"] / row["ideal_s"] if row["ideal_s"] else float("nan")
            row["target"] = TARGETS.get(level)
            row["met"] = row["target"] is None or row["ratio"] <= row["target"]
            row["cpu_ms_per_question"] = row["evaluate_cpu_s"] / row["questions"] * 1e3
            row["workers_cpu_ms_per_question"] = row["workers_cpu_s"] / row["questions"] * 1e3
            row["stub_cpu_ms_per_question"] = row["stub_cpu_s"] / row["questions"] * 1e3
            row["trace_writer_cpu_ms_per_question"] = (
                row["trace_writer_cpu_s"] / row["questions"] * 1e3
            )
            measured.append(row)
        if profile_at is not None:
            count = questions_for(profile_at, least)
            profile = cProfile.Profile(time.process_time)  # CPU, not waiting
            plain = stub_run(
                folder, base_url, *_overrides(count, profile_at, "1"), hooks=Profiled(profile)
            )
            stats = pstats.Stats(profile)
            profiled = cpu_by_component(stats)
            total = sum(profiled.values()) or 1.0
            # cProfile slows every call down; its shares are applied to the CPU time of the
            # unprofiled run at the same level.
            reference = next(
                (r for r in measured if r["concurrency"] == profile_at and r["workers"] == 1),
                plain,
            )
            per_question = reference["evaluate_cpu_s"] / reference["questions"] * 1e3
            profile_rows = [
                {
                    "component": name,
                    "share": seconds / total,
                    "cpu_ms_per_question": per_question * seconds / total,
                }
                for name, seconds in sorted(profiled.items(), key=lambda item: -item[1])
            ]
    return {
        "rows": measured,
        "latency_s": latency_s,
        "attempts": attempts,
        "profile_at": profile_at,
        "profile": profile_rows,
        "first_pooled_run_s": first["wall_s"],
        "met": all(r["met"] for r in measured if r["setting"] == "auto"),
    }


def markdown(result: dict[str, Any]) -> str:
    """The section's text: the setup, the table, the profile."""
    rows = result["rows"]
    latency_ms = result["latency_s"] * 1e3
    table = [
        "| in flight | workers | questions | stub calls | wall | ideal | ratio | target "
        "| ratio without start-up "
        "| CPU ms/question: harness | workers | trace writer | stub | worker start-up "
        "| load (1 min) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        target = "–"
        if row["target"] is not None:
            target = f"≤ {row['target']}× " + ("pass" if row["met"] else "**miss**")
        setting = "auto" if row["setting"] == "auto" else "set"
        start = f"{row['workers_build_wall_s']:.2f} s" if row["workers"] > 1 else "–"
        steady = (row["evaluate_s"] - row["workers_build_wall_s"]) / row["ideal_s"]
        table.append(
            f"| {row['concurrency']} | {row['workers']} ({setting}) | {row['questions']:.0f} | "
            f"{row['calls']:.0f} | {row['evaluate_s']:.2f} s | {row['ideal_s']:.2f} s | "
            f"{row['ratio']:.2f}× | {target} | {steady:.2f}× | {row['cpu_ms_per_question']:.1f} | "
            f"{row['workers_cpu_ms_per_question']:.1f} | "
            f"{row['trace_writer_cpu_ms_per_question']:.1f} | "
            f"{row['stub_cpu_ms_per_question']:.1f} | "
            f"{start} | {row['load_1min']:.1f} |"
        )
    text = (
        f"`llm=openai` against `experiments.support.openai_stub` in its own process with "
        f"{latency_ms:.0f} ms per call, `strategy=multi-hop`, `retriever=wordllama`, "
        "`experiment.cache=false`, `dataset=curated` (each level asks "
        f"{PER_SLOT} questions per slot in flight, at least {MIN_QUESTIONS}). Every level with "
        "the default `experiment.workers=auto`, some also with one process (`set`). Wall = the "
        "evaluation (`_evaluate_repeats`: every question answered, scored, journaled; with "
        "workers, their start-up included), the fastest of "
        f"{result['attempts']} attempts; ideal = stub calls × latency / in flight; ratio = "
        "wall / ideal. CPU per question: harness = the harness process during the evaluation "
        "(all its threads), workers = the worker processes answering (each reports its own), "
        "trace writer = the process writing MLflow traces (until the last row was sent to it), "
        "stub = the stub server process; worker start-up = wall from a worker's start to its "
        "components built (inside the evaluation's wall; the ratio without it is what a long run "
        "approaches, since a run starts its workers once). Each run starts with fresh HTTP "
        "clients. Whole run() (setup and MLflow logging included): "
        + ", ".join(f"{r['concurrency']}/{r['workers']}w: {r['wall_s']:.2f} s" for r in rows)
        + "; the first run with workers in a harness process also starts their fork server "
        f"(imports once per process): whole run() {result['first_pooled_run_s']:.2f} s for 4 "
        f"questions. Load average {os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} "
        "cores.\n\n" + "\n".join(table)
    )
    if result["profile"]:
        lines = [
            "| component | share of profiled CPU | CPU ms/question |",
            "|---|---|---|",
            *(
                f"| {p['component']} | {p['share']:.0%} | {p['cpu_ms_per_question']:.1f} |"
                for p in result["profile"]
            ),
        ]
        text += (
            f"\n\nWhere the CPU of answering goes at {result['profile_at']} in flight in one "
            "process (`experiment.workers=1`; a worker spends it the same way): cProfile of "
            "`Evaluator.run` timed in process CPU, each function's own time counted under the "
            "library its file belongs to (a builtin's or other standard-library function's "
            "under its callers'; work in worker threads, such as retrieval, under what the event "
            "loop ran meanwhile); shares applied to the unprofiled CPU per question of the same "
            "level.\n\n" + "\n".join(lines)
        )
    return text


def section(levels: Sequence[int] = LEVELS) -> dict[str, object]:
    """The `make bench` section."""
    result = measure(levels, single_at=SINGLE_AT)
    return {
        "markdown": markdown(result),
        **result,
        "targets": {str(k): v for k, v in TARGETS.items()},
    }


def main(argv: list[str] | None = None) -> int:
    """Measure, print the Markdown, then the JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.perf.concurrency", description=__doc__
    )
    parser.add_argument("--levels", type=int, nargs="+", default=list(LEVELS))
    parser.add_argument("--attempts", type=int, default=2)
    parser.add_argument("--latency", type=float, default=STUB_LATENCY_S)
    parser.add_argument("--least", type=int, default=MIN_QUESTIONS, help="fewest questions")
    parser.add_argument("--profile-at", type=int, default=16, help="0: no profile")
    parser.add_argument(
        "--single-at",
        type=int,
        nargs="*",
        default=list(SINGLE_AT),
        help="levels also run with experiment.workers=1",
    )
    args = parser.parse_args(argv)
    if min(args.levels) < 1 or args.attempts < 1 or args.latency <= 0:
        parser.error("levels and attempts must be at least 1, latency above 0")
    result = measure(
        args.levels,
        args.latency,
        args.attempts,
        args.least,
        args.profile_at or None,
        args.single_at,
    )
    print(markdown(result))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
