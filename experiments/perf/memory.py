"""Memory of a long run: RSS of `python -m experiments.run` over ≥ 2,000 questions, as a slope.

The curated question sets (`dataset=all`, 348 questions) are copied N times into a temporary
questions folder, each copy's ids suffixed, so one run (one repeat, one pipeline, one
conversation store) asks ≥ 2,000 distinct questions over the bundled corpus. The run is a child
process with a fresh store (it ingests first); its RSS is polled from `/proc/<pid>/status` and its
progress read from its own run journal (one line per finished case), so RSS is known after every
500 questions without hooking the run. Peak = the child's high-water RSS (VmHWM, checked against
`getrusage(RUSAGE_CHILDREN).ru_maxrss`); it includes MLflow logging after the last question.

`python -m experiments.perf.memory [--questions 2000] [--retriever wordllama]` prints the
Markdown and the JSON; `make bench` runs it as section `memory`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from caprag.config import PROJECT_ROOT
from experiments.perf.harness_bench import QUIET_ENV, base_overrides
from experiments.results.questions import SETS

QUESTIONS_DIR = PROJECT_ROOT / "datasets" / "questions"
TARGET_MIB_PER_1000 = 100.0
"""Peak RSS may grow at most this much per 1,000 questions once questions start (issue #18)."""
MARKS = (500, 1000, 1500, 2000)
POLL_S = 0.1


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB; (0, 0) once it is gone."""
    try:
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        )
    except (OSError, ValueError):
        return 0, 0
    if "VmRSS" not in fields:  # a zombie (exited, not yet waited for) has no memory lines
        return 0, 0
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def copy_question_sets(folder: Path, copies: int, source: Path = QUESTIONS_DIR) -> int:
    """Write each curated set `copies` times into `folder` (ids of copy c > 1 end in `~c`, each
    turn's too); return the number of questions written."""
    folder.mkdir(parents=True, exist_ok=True)
    questions = 0
    for name in SETS:  # the sets of dataset=all
        items = [
            json.loads(line)
            for line in (source / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]
        lines = []
        for copy in range(1, copies + 1):
            suffix = "" if copy == 1 else f"~{copy}"
            for item in items:
                item = {**item, "id": item["id"] + suffix}
                if "turns" in item:
                    item["turns"] = [{**t, "id": t["id"] + suffix} for t in item["turns"]]
                questions += len(item.get("turns", [item]))
                lines.append(json.dumps(item, ensure_ascii=False))
        (folder / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return questions


@dataclass
class JournalProgress:
    """Questions finished so far, read from the run's journal as it grows (complete lines only)."""

    folder: Path
    done: int = 0
    _offsets: dict[Path, int] = field(default_factory=dict)

    def poll(self) -> int:
        """Read what was appended since the last poll; the questions finished in all."""
        for path in sorted(self.folder.glob("*.jsonl")) if self.folder.exists() else []:
            offset = self._offsets.get(path, 0)
            with path.open("rb") as handle:
                handle.seek(offset)
                data = handle.read()
            end = data.rfind(b"\n") + 1
            for line in data[:end].splitlines():
                self.done += len(json.loads(line)["rows"])
            self._offsets[path] = offset + end
        return self.done


@dataclass
class Sample:
    """One poll of the child: seconds since start, questions finished, RSS and high water."""

    t: float
    questions: int
    rss_kib: int
    hwm_kib: int


def run_child(
    folder: Path, overrides: list[str], timeout_s: float
) -> tuple[list[Sample], str, int, float | None]:
    """Run `python -m experiments.run` with every file inside `folder`, polling it; (samples,
    output, exact peak from getrusage or 0, seconds since start when questions started)."""
    journals = folder / "journals"
    command = [
        sys.executable,
        "-m",
        "experiments.run",
        *overrides,
        *base_overrides(folder),
        f"hydra.run.dir={folder / 'hydra'}",
    ]
    log_path = folder / "run.log"
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    progress = JournalProgress(journals)
    samples: list[Sample] = []
    started: float | None = None
    start = time.perf_counter()
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command,
            cwd=PROJECT_ROOT,
            env={**os.environ, **QUIET_ENV},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            while process.poll() is None:
                now = time.perf_counter() - start
                if now > timeout_s:
                    raise TimeoutError(f"the memory run took over {timeout_s:.0f} s")
                rss, hwm = rss_kib(process.pid)
                if rss:
                    samples.append(Sample(now, progress.poll(), rss, hwm))
                if started is None and _questions_started(log_path.read_text()):
                    started = now
                time.sleep(POLL_S)
        finally:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)
    output = log_path.read_text()
    if process.returncode != 0:
        raise RuntimeError(f"the memory run failed ({process.returncode}): {output[-2000:]}")
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    exact_peak = children_after if children_after > children_before else 0
    return samples, output, exact_peak, started


def _questions_started(output: str) -> bool:
    """run() prints 'run <name>: N questions' after setup, just before the first question."""
    return any(line.startswith("run ") for line in output.splitlines())


def _mib(kib: float) -> float:
    return kib / 1024


def section(
    questions: int = 2000,
    retriever: str = "wordllama",
    timeout_s: float = 1800.0,
    marks: Sequence[int] = MARKS,
    source: Path = QUESTIONS_DIR,
    corpus: Path | None = None,
) -> dict[str, object]:
    """Peak RSS and RSS at each of `marks` questions (every 500) of one offline run of ≥
    `questions` questions, copies of the question sets in `source` (the curated sets) asked of
    `corpus` (the bundled books)."""
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        per_copy = copy_question_sets(folder / "probe", 1, source)
        copies = max(1, math.ceil(questions / per_copy))
        count = copy_question_sets(folder / "questions", copies, source)
        overrides = [
            "llm=offline",
            "dataset=all",
            f"retriever={retriever}",
            f"paths.questions={folder / 'questions'}",
            *([f"paths.corpus={corpus}"] if corpus is not None else []),
        ]
        samples, output, exact_peak, started = run_child(folder, overrides, timeout_s)
    load_after = os.getloadavg()
    header = next(line for line in output.splitlines() if line.startswith("run "))
    asked = int(header.split(": ", 1)[1].split(" questions")[0].split()[-1])
    if asked != count:
        raise RuntimeError(f"the run asked {asked} questions, {count} were written")
    if started is None or not samples:
        raise RuntimeError("the run never started its questions")
    at_start = next((s for s in samples if s.t >= started), samples[-1])
    peak = max([exact_peak, *(max(s.hwm_kib, s.rss_kib) for s in samples)])
    last_question = next((s for s in samples if s.questions >= count), samples[-1])
    points = []
    for mark in [m for m in marks if m <= count] + ([count] if count not in marks else []):
        sample = next((s for s in samples if s.questions >= mark), None)
        if sample is not None:
            points.append(
                {
                    "questions": mark,
                    "done": sample.questions,
                    "t_s": sample.t,
                    "rss_mib": _mib(sample.rss_kib),
                    "hwm_mib": _mib(sample.hwm_kib),
                }
            )
    growth = _mib(peak - at_start.rss_kib)
    per_1000 = growth / count * 1000
    first, last = points[0], points[-1]
    answering_slope = (
        (last["rss_mib"] - first["rss_mib"]) / (last["done"] - first["done"]) * 1000
        if last["done"] > first["done"]
        else float("nan")
    )
    met = per_1000 <= TARGET_MIB_PER_1000
    wall = samples[-1].t
    table = [
        "| point | questions done | seconds | RSS | high water |",
        "|---|---|---|---|---|",
        f"| questions start (index open) | 0 | {at_start.t:.0f} | "
        f"{_mib(at_start.rss_kib):.0f} MiB | {_mib(at_start.hwm_kib):.0f} MiB |",
    ]
    table += [
        f"| after {p['questions']:,} questions | {p['done']:,} | {p['t_s']:.0f} | "
        f"{p['rss_mib']:.0f} MiB | {p['hwm_mib']:.0f} MiB |"
        for p in points
    ]
    table.append(
        f"| end of run (MLflow results and traces logged) | {count:,} | {wall:.0f} | "
        f"{_mib(samples[-1].rss_kib):.0f} MiB | {_mib(peak):.0f} MiB (peak) |"
    )
    verdict = "pass" if met else "**miss**"
    markdown = (
        f"`python -m experiments.run llm=offline dataset=all retriever={retriever}` over the "
        f"curated sets copied {copies}× (ids suffixed: {count:,} distinct questions in one run, "
        "one repeat) in a subprocess with a fresh temporary store (it ingests first) and MLflow "
        "in a temporary SQLite file, traces on. RSS from `/proc/<pid>/status` every "
        f"{POLL_S:g} s; questions done from the run's own journal; peak = high-water RSS "
        "(VmHWM, checked against `getrusage(RUSAGE_CHILDREN).ru_maxrss`). Load average "
        f"(1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after, on "
        f"{os.cpu_count()} cores.\n\n"
        + "\n".join(table)
        + f"\n\nPeak growth once questions start: {growth:.0f} MiB over {count:,} questions = "
        f"**{per_1000:.0f} MiB per 1,000 questions** (target ≤ {TARGET_MIB_PER_1000:.0f}): "
        f"{verdict}. While answering, RSS grows {answering_slope:.1f} MiB per 1,000 questions "
        f"(from {first['questions']:,} to {last['done']:,} questions); logging after the last "
        f"question adds {_mib(peak - last_question.rss_kib):.0f} MiB to the peak."
    )
    return {
        "markdown": markdown,
        "retriever": retriever,
        "questions": count,
        "copies": copies,
        "rss_at_questions_mib": _mib(at_start.rss_kib),
        "peak_mib": _mib(peak),
        "growth_mib": growth,
        "mib_per_1000_questions": per_1000,
        "answering_mib_per_1000_questions": answering_slope,
        "points": points,
        "wall_s": wall,
        "load_before": load_before[0],
        "load_after": load_after[0],
        "target_mib_per_1000": TARGET_MIB_PER_1000,
        "met": met,
    }


def main(argv: list[str] | None = None) -> int:
    """Measure, print the Markdown, then the JSON."""
    parser = argparse.ArgumentParser(prog="python -m experiments.perf.memory", description=__doc__)
    parser.add_argument("--questions", type=int, default=2000)
    parser.add_argument("--retriever", default="wordllama")
    args = parser.parse_args(argv)
    if args.questions < 1:
        parser.error("--questions must be at least 1")
    result: dict[str, Any] = section(args.questions, args.retriever)
    print(result["markdown"])
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
