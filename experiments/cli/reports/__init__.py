"""`python -m experiments.reports build|check`: the committed reports, regenerated and checked.

Every report in `reports/` that states numbers is code output: a `Report` here says which runs it
needs (Hydra overrides, offline, in a clean store), how it turns them into
Markdown, and which files its numbers depend on (the library, the harness, the scoring code, the
configs, the datasets it reads, its own module). `build` regenerates the reports whose inputs
changed (all of them with `--force`) and records, in `reports/manifest.json`, the commit and a
content hash of every input. `check` recomputes those hashes and exits 1, naming each stale
report and the files that changed, so a report can never quietly disagree with the code (CI runs
it; `make reports` fixes it).

Measured reports (`reports/bench.md`, `reports/local-llm.md`, the walkthrough) are machine
measurements with their load noted, made by `make bench` and `make e2e-local`; they are not
deterministic and not part of this check.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from caprag.config import PROJECT_ROOT

REPORTS = PROJECT_ROOT / "reports"
MANIFEST = REPORTS / "manifest.json"
MODULES = (
    "experiments.cli.reports.adaptive",
    "experiments.cli.reports.strategies",
    "experiments.cli.reports.benchmarks",
    "experiments.cli.reports.baselines",
    "experiments.cli.reports.follow_up",
    "experiments.cli.reports.baseline",
)
"""The modules that register the reports, in the order they are built (the calibrations first:
the adaptive report and the baseline use them)."""

LIBRARY = ("caprag/**/*.py", "caprag/calibrations/*.yaml")
SERVING_ONLY = (
    "caprag/serve/api.py",
    "caprag/serve/web.py",
    "caprag/api.py",
    "caprag/__main__.py",
    "caprag/serve/static/**",
)
"""Modules that only serve answers (HTTP, page, shell): no report number depends on them."""
HARNESS = (
    "experiments/__init__.py",
    "experiments/harness/**/*.py",
    "experiments/scoring/**/*.py",
    "experiments/results/**/*.py",
    "experiments/cli/reports/__init__.py",
    "conf/**/*.yaml",
)
"""What every report's numbers depend on besides its own module and datasets."""


@dataclass
class Context:
    """What a report's build gets: a clean store shared by the reports built together, and a
    way to run the harness there."""

    store: Path
    done: dict[str, Any] = field(default_factory=dict)
    """Results of runs already made in this build, by their overrides (reports share runs)."""

    def fixed(self) -> list[str]:
        """The overrides every report run gets: offline, untracked, uncached, never resumed,
        one process, everything in the clean store."""
        return [
            "tracking.enabled=false",
            "experiment.cache=false",
            "experiment.resume=never",
            "experiment.workers=1",
            "llm=offline",
            "judge=none",
            f"paths.store={self.store / 'store'}",
            f"paths.journals={self.store / 'journals'}",
            f"paths.cache={self.store / 'cache.sqlite'}",
        ]

    def run(self, *overrides: str) -> Any:
        """One harness run (offline, untracked, uncached, in the clean store), or the result of
        the same overrides run earlier in this build."""
        from hydra import compose, initialize_config_dir

        from experiments.harness.run import run

        key = " ".join(overrides)
        if key in self.done:
            return self.done[key]
        print(f"  run: {key}", flush=True)
        with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=[*self.fixed(), *overrides])
        with contextlib.redirect_stdout(sys.stderr):  # the run's own table: not the report's
            result = run(cfg)
        self.done[key] = result
        return result


@dataclass(frozen=True)
class Report:
    """One committed report: its file, what its numbers depend on, how it is built."""

    name: str
    """The file it writes: reports/<name> (a .md, or .json for the gate's baseline)."""
    build: Callable[[Context], str]
    """The report's whole text, built from the runs it makes."""
    inputs: tuple[str, ...] = ()
    """Globs (from the project root) of the data its numbers depend on, beside LIBRARY,
    HARNESS and its own module."""
    module: str = ""
    """The module that defines it (an input too)."""
    extra_outputs: tuple[str, ...] = ()
    """Other files the build writes (the calibrations), relative to the project root."""
    exclude: tuple[str, ...] = ()
    """Globs left out of its inputs (what it writes itself: the calibrations)."""

    @property
    def path(self) -> Path:
        return REPORTS / self.name


_REPORTS: dict[str, Report] = {}


def register(report: Report) -> Report:
    """Add a report (its name must be new)."""
    if report.name in _REPORTS:
        raise ValueError(f"a report named {report.name} is registered already")
    _REPORTS[report.name] = report
    return report


def reports() -> list[Report]:
    """Every registered report, in build order."""
    for module in MODULES:
        importlib.import_module(module)
    return list(_REPORTS.values())


def input_files(report: Report, root: Path = PROJECT_ROOT) -> list[Path]:
    """The files a report's numbers depend on, sorted (relative to root)."""
    patterns = [*LIBRARY, *HARNESS, *report.inputs]
    if report.module:
        patterns.append(report.module.replace(".", "/") + ".py")
    excluded = {p for pattern in (*SERVING_ONLY, *report.exclude) for p in root.glob(pattern)}
    found = {p for pattern in patterns for p in root.glob(pattern) if p.is_file()}
    return sorted(p.relative_to(root) for p in found - excluded if "__pycache__" not in p.parts)


def digests(report: Report, root: Path = PROJECT_ROOT) -> dict[str, str]:
    """sha256 (16 hex) of each input file's bytes, by its path."""
    return {
        str(path): hashlib.sha256((root / path).read_bytes()).hexdigest()[:16]
        for path in input_files(report, root)
    }


def load_manifest(root: Path = PROJECT_ROOT) -> dict[str, Any]:
    """reports/manifest.json ({} when absent)."""
    path = root / MANIFEST.relative_to(PROJECT_ROOT)
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def stale(report: Report, manifest: dict[str, Any], root: Path = PROJECT_ROOT) -> list[str]:
    """Why a report no longer matches the code: the inputs that changed, appeared or went, or
    that it was never built (empty: it is fresh)."""
    recorded = manifest.get(report.name)
    if recorded is None or not (root / "reports" / report.name).is_file():
        return ["never built by `make reports`"]
    now, then = digests(report, root), dict(recorded.get("inputs", {}))
    changed = sorted(p for p in now if p in then and now[p] != then[p])
    added = sorted(set(now) - set(then))
    removed = sorted(set(then) - set(now))
    return (
        [f"{p} changed" for p in changed]
        + [f"{p} is new" for p in added]
        + [f"{p} is gone" for p in removed]
    )


def commit(root: Path = PROJECT_ROOT) -> str:
    """The checkout's commit, '+dirty' with uncommitted changes ('unknown' outside git)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def check(root: Path = PROJECT_ROOT) -> list[str]:
    """One line per stale report: its file and what changed (empty: every report is fresh)."""
    manifest = load_manifest(root)
    lines = []
    for report in reports():
        why = stale(report, manifest, root)
        if why:
            shown = "; ".join(why[:5]) + (f"; and {len(why) - 5} more" if len(why) > 5 else "")
            lines.append(f"reports/{report.name} is stale: {shown}")
    return lines


def build(names: Sequence[str] = (), force: bool = False) -> int:
    """Regenerate the named reports (default: every stale one) in one clean store; write each
    report and its manifest entry as soon as it is done (an interrupted build keeps those)."""
    every = reports()
    unknown = sorted(set(names) - {r.name for r in every})
    if unknown:
        raise SystemExit(
            f"error: no report {', '.join(unknown)}: choose among "
            + ", ".join(r.name for r in every)
        )
    manifest = load_manifest()
    chosen = [
        r
        for r in every
        if (r.name in names if names else True) and (force or names or stale(r, manifest))
    ]
    if not chosen:
        print("every report is up to date (make reports FORCE=1 rebuilds them all)")
        return 0
    with _clean_store() as store:
        context = Context(store)
        for number, report in enumerate(chosen, start=1):
            started = time.monotonic()
            print(f"[{number}/{len(chosen)}] reports/{report.name}", flush=True)
            text = report.build(context)
            report.path.write_text(text, encoding="utf-8")
            manifest[report.name] = {
                "commit": commit(),
                "inputs": digests(report),
                "outputs": [f"reports/{report.name}", *report.extra_outputs],
            }
            MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
            print(f"  wrote reports/{report.name} ({time.monotonic() - started:.0f} s)")
    return 0


@contextlib.contextmanager
def _clean_store() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="caprag-reports-") as folder:
        yield Path(folder)


def main(argv: list[str] | None = None) -> int:
    """Regenerate the committed reports, or check that they match the code."""
    parser = argparse.ArgumentParser(prog="python -m experiments.reports", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="command", required=True)
    build_cmd = sub.add_parser("build", help="regenerate the stale reports (or those named)")
    build_cmd.add_argument("names", nargs="*", help="report files, e.g. adaptive.md")
    build_cmd.add_argument("--force", action="store_true", help="rebuild every report")
    sub.add_parser("check", help="exit 1 naming every report that no longer matches the code")
    sub.add_parser("list", help="the reports and what their numbers depend on")
    args = parser.parse_args(argv)
    if args.command == "build":
        return build(args.names, args.force)
    if args.command == "list":
        for report in reports():
            print(f"reports/{report.name}: {len(input_files(report))} input files")
        return 0
    problems = check()
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        print("run `make reports` and commit what it writes", file=sys.stderr)
        return 1
    print(f"every report matches the code ({len(reports())} reports)")
    return 0
