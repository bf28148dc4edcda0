"""How long the entry points take as whole processes, as a user starts them (`make bench startup`).

Each command is run RUNS times in a fresh process; the table gives the median wall time and the
median CPU seconds the process used (user + system, from the operating system's accounting of the
finished child), with the load average before and after (the machine may be shared). A server is
timed to its first healthy answer, then stopped; its CPU includes the stop.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from caprag.config import BUNDLED_CORPUS, PROJECT_ROOT
from experiments.support.servers import free_port

RUNS = 5
HANG_S = 600.0
"""Only catches a hang (a server that never answers); no result depends on it."""
QUESTION = "How many actions does a character get in one combat round?"
DASHBOARD = PROJECT_ROOT / "experiments" / "dashboard" / "app.py"
FIRST_PAGE = (
    "from streamlit.testing.v1 import AppTest\n"
    f"page = AppTest.from_file({str(DASHBOARD)!r}, default_timeout={HANG_S}).run()\n"
    "assert not page.exception, page.exception\n"
)
"""The dashboard's first page, run through Streamlit's own test runner (the script as a browser's
first visit runs it, without the browser)."""


@dataclass(frozen=True)
class Case:
    """One entry point: its command, what it must print or answer, and its target."""

    name: str
    command: tuple[str, ...]
    target_s: float
    health: str = ""
    """A server: the path that answers 200 once it is ready ('' for a command that exits)."""
    expect: str = ""
    """Text the command's output must hold (so a fast failure does not pass as fast)."""
    exit_code: int = 0


@dataclass(frozen=True)
class Timing:
    """A case's runs: wall and CPU seconds of each."""

    case: Case
    wall: list[float]
    cpu: list[float]

    @property
    def wall_median(self) -> float:
        return statistics.median(self.wall)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)


def _wait(process: subprocess.Popen[bytes]) -> float:
    """Reap the child and return its CPU seconds (user + system) from the OS."""
    _pid, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def run_once(case: Case, env: dict[str, str], cwd: Path, port: int) -> tuple[float, float]:
    """One fresh process of the case: (wall seconds to done or ready, CPU seconds)."""
    command = [part.replace("{port}", str(port)) for part in case.command]
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=out)
        if case.health:
            wall = _until_healthy(process, f"http://127.0.0.1:{port}{case.health}", start)
            process.terminate()
            cpu = _wait(process)
        else:
            cpu = _wait(process)
            wall = time.perf_counter() - start
        out.seek(0)
        said = out.read().decode(errors="replace")
    if not case.health and process.returncode != case.exit_code:
        raise RuntimeError(f"{case.name}: exit {process.returncode}: {said[-2000:]}")
    if case.expect and case.expect not in said:
        raise RuntimeError(f"{case.name}: {case.expect!r} not in its output: {said[-2000:]}")
    return wall, cpu


def _until_healthy(process: subprocess.Popen[bytes], url: str, start: float) -> float:
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return time.perf_counter() - start
        if time.perf_counter() - start > HANG_S:
            process.kill()
            raise TimeoutError(f"{url} did not answer in {HANG_S:.0f} s")
        time.sleep(0.02)


def cases(python: str = sys.executable) -> list[Case]:
    """The entry points a user starts, with the issue's targets."""
    return [
        Case(
            "`python -m experiments.run strategy=multi-hopp` (a typo'd override fails)",
            (python, "-m", "experiments.run", "strategy=multi-hopp"),
            3.0,
            expect="Could not find 'strategy/multi-hopp'",
            exit_code=1,
        ),
        Case(
            "`python -m experiments.run experiment.concurency=4` (did you mean)",
            (python, "-m", "experiments.run", "experiment.concurency=4"),
            3.0,
            expect="did you mean 'concurrency'?",
            exit_code=2,
        ),
        Case(
            "`python -m experiments.run --help`",
            (python, "-m", "experiments.run", "--help"),
            3.0,
            expect="Powered by Hydra",
        ),
        Case(
            '`python -m caprag ask "..."` (ingested store, offline answer)',
            (python, "-m", "caprag", "ask", QUESTION),
            3.0,
            expect="Sources:",
        ),
        Case(
            "`python -m caprag.api` ready (`/health` answers)",
            (python, "-m", "caprag.api", "--port", "{port}"),
            5.0,
            health="/health",
        ),
        Case(
            "the dashboard's first page (Streamlit's AppTest, empty MLflow store)",
            (python, "-c", FIRST_PAGE),
            5.0,
        ),
    ]


def measure(
    runs: int = RUNS, chosen: Callable[[Case], bool] = lambda _case: True
) -> tuple[list[Timing], tuple[float, float]]:
    """Every case, `runs` times each after one unmeasured warm-up run (the file cache), on a
    store ingested once beforehand; and the 1-minute load average before and after."""
    with tempfile.TemporaryDirectory(prefix="caprag-startup-") as folder:
        env = {
            **os.environ,
            "CAPRAG_CHROMA_DIR": str(Path(folder) / "store"),
            "CAPRAG_CHECKPOINTER": "memory",
            "CAPRAG_DECISION_LOG": "off",
            "MLFLOW_TRACKING_URI": f"sqlite:///{Path(folder) / 'mlruns.db'}",
            "PYTHONPATH": str(PROJECT_ROOT),
        }
        subprocess.run(
            [sys.executable, "-m", "caprag.ingest", str(BUNDLED_CORPUS)],
            cwd=folder,
            env=env,
            check=True,
            capture_output=True,
            timeout=HANG_S * 3,
        )
        load_before = os.getloadavg()[0]
        timings = []
        for case in filter(chosen, cases()):
            run_once(case, env, Path(folder), free_port())  # warm-up, not counted
            done = [run_once(case, env, Path(folder), free_port()) for _ in range(runs)]
            timings.append(Timing(case, [w for w, _ in done], [c for _, c in done]))
        return timings, (load_before, os.getloadavg()[0])


def markdown(timings: Sequence[Timing], load: tuple[float, float], runs: int = RUNS) -> str:
    """The table: median wall and CPU of each entry point beside its target."""
    cores = os.cpu_count() or 1
    lines = [
        f"Each entry point started {runs} times as a fresh process (after one warm-up run); "
        "median wall seconds to its answer (a server: to its first healthy answer) and median "
        "CPU seconds of the process (user + system). Load average (1 min) "
        f"{load[0]:.1f} before, {load[1]:.1f} after, on {cores} cores: above {cores} the wall "
        "times include waiting for a core, and the CPU seconds are the figure to compare.",
        "",
        "| entry point | wall s (median) | CPU s (median) | wall min–max | target | met |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for t in timings:
        met = "yes" if t.wall_median <= t.case.target_s else "no"
        lines.append(
            f"| {t.case.name} | {t.wall_median:.2f} | {t.cpu_median:.2f} | "
            f"{min(t.wall):.2f}–{max(t.wall):.2f} | ≤ {t.case.target_s:.0f} s | {met} |"
        )
    lines += [
        "",
        "A typo'd override, `--help` and a bad setting are answered after Hydra composes and the "
        "settings schema validates, before MLflow, LangChain, Chroma, RAGAS or pandas is imported "
        "(tests/integration/test_entry_imports.py). `ask` and the API need LangGraph, Chroma and "
        "the MiniLM encoder to answer; the openai SDK and langchain-openai are imported only for "
        "CAPRAG_LLM=openai.",
    ]
    return "\n".join(lines)


def section() -> dict[str, object]:
    """The `startup` section of reports/bench.md."""
    timings, load = measure()
    return {
        "markdown": markdown(timings, load),
        "load": list(load),
        **{t.case.name: {"wall_s": t.wall, "cpu_s": t.cpu} for t in timings},
    }
