"""`python -m experiments.gate [--update]`: fail when quality drops against reports/baseline.json.

Runs a small deterministic offline evaluation (the first N questions of the single-book and
cross-book sets, with multi-hop and multi-question), compares each metric with the committed
baseline within its tolerance, prints a table, exits 1 on a regression.
Update the baseline on purpose with `python -m experiments.gate --update` and commit the file.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from hydra import compose, initialize_config_dir

from caprag.config import PROJECT_ROOT
from experiments.harness.run import RunResult, run
from experiments.results import metrics as registry
from experiments.results.tables import markdown_table
from experiments.results.tracking import git_commit

BASELINE = PROJECT_ROOT / "reports" / "baseline.json"
STRATEGIES = ("multi-hop", "multi-question")
SETS = ("single_book", "cross_book")
PER_SET = 25


@dataclass(frozen=True)
class Tolerance:
    """How far a metric may move the wrong way before it counts as a regression (which way is
    wrong is the metric's direction, experiments.results.metrics)."""

    absolute: float = 0.0
    relative: float = 0.0

    def allowed(self, baseline: float, higher_is_better: bool) -> float:
        """The worst value still accepted."""
        slack = max(self.absolute, abs(baseline) * self.relative)
        return baseline - slack if higher_is_better else baseline + slack


TOLERANCES = {
    "recall_at_k": Tolerance(absolute=0.02),
    "all_gold_at_k": Tolerance(absolute=0.02),
    "mrr": Tolerance(absolute=0.02),
    "f1": Tolerance(absolute=0.02),
    "ragas_context_recall": Tolerance(absolute=0.02),
    "tokens": Tolerance(relative=0.15),
}
"""The metrics the gate checks and how far each may move the wrong way."""


def higher_is_better(metric: str) -> bool:
    """The gated metric's direction; a metric without one cannot be gated."""
    direction = registry.get(metric).higher_is_better
    if direction is None:
        raise ValueError(f"{metric} has no better direction (experiments.results.metrics)")
    return direction


def evaluate(overrides: list[str]) -> dict[str, dict[str, float]]:
    """Metric means per 'strategy/set' for the gate's fixed configuration."""
    results: dict[str, dict[str, float]] = {}
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        for strategy in STRATEGIES:
            cfg = compose(
                "config",
                overrides=[
                    f"strategy={strategy}",
                    "dataset=curated",
                    "llm=offline",
                    "judge=none",
                    f"experiment.limit_per_set={PER_SET}",
                    "experiment.name=gate",
                    "tracking.enabled=false",
                    "experiment.progress=false",
                    *overrides,
                ],
            )
            result: RunResult = run(cfg)
            for set_name in SETS:
                rows = [r for r in result.rows if r.set == set_name and r.status == "ok"]
                results[f"{strategy}/{set_name}"] = {
                    name: sum(r.values[name] for r in rows) / len(rows)
                    for name in TOLERANCES
                    if rows and all(name in r.values for r in rows)
                }
                results[f"{strategy}/{set_name}"]["failed"] = float(
                    sum(1 for r in result.rows if r.set == set_name and r.status != "ok")
                )
    return results


def compare(
    baseline: dict[str, dict[str, float]], now: dict[str, dict[str, float]]
) -> tuple[list[list[str]], int]:
    """Table rows and the number of regressions."""
    rows: list[list[str]] = []
    regressions = 0
    for key in sorted(baseline):
        for name, tolerance in TOLERANCES.items():
            if name not in baseline[key]:
                continue
            metric = registry.get(name)
            before = baseline[key][name]
            after = now.get(key, {}).get(name)
            if after is None:
                status, regressions = "MISSING", regressions + 1
                rows.append([key, metric.heading, metric.display(before), "—", "", "", status])
                continue
            higher = higher_is_better(name)
            limit = tolerance.allowed(before, higher)
            worse = after < limit if higher else after > limit
            status = "REGRESSION" if worse else "ok"
            regressions += worse
            change = after - before
            rows.append(
                [
                    key,
                    metric.heading,
                    metric.display(before),
                    metric.display(after),
                    ("+" if change >= 0 else "") + metric.display(change),
                    metric.display(limit),
                    status,
                ]
            )
        failed = now.get(key, {}).get("failed", 0.0)
        if failed:
            regressions += 1
            metric = registry.get("failed")
            rows.append([key, metric.heading, "0", metric.display(failed), "", "0", "REGRESSION"])
    return rows, regressions


def baseline_text(now: dict[str, dict[str, float]]) -> str:
    """The baseline file for these results: the gate's settings and the numbers (what
    `--update` and `make reports` write)."""
    payload = {
        "commit": git_commit(),
        "questions_per_set": PER_SET,
        "tolerances": {
            k: {"higher_is_better": higher_is_better(k), **vars(v)} for k, v in TOLERANCES.items()
        },
        "results": now,
    }
    return json.dumps(payload, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the gate; --update rewrites the baseline instead of checking it."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.gate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--update", action="store_true", help="write reports/baseline.json")
    parser.add_argument("--baseline", type=Path, default=BASELINE)
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = parser.parse_args(argv)
    now = evaluate(args.overrides)
    if args.update:
        args.baseline.write_text(baseline_text(now))
        print(f"wrote {args.baseline}; commit it to make it the baseline")
        return 0
    if not args.baseline.exists():
        print(f"error: no baseline at {args.baseline}; create it with --update", file=sys.stderr)
        return 2
    baseline = json.loads(args.baseline.read_text())["results"]
    rows, regressions = compare(baseline, now)
    print(markdown_table(["run", "metric", "baseline", "now", "delta", "limit", "status"], rows))
    if regressions:
        print(f"gate: {regressions} regression(s) against {args.baseline}")
        return 1
    print(f"gate: no regression against {args.baseline}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
