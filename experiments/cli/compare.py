"""`python -m experiments.compare RUN_A RUN_B`: is B really better than A, metric by metric?

Pairs the two runs' questions (repeats averaged per question) and prints, per metric, both means,
B − A with its bootstrap confidence interval, the permutation-test p-value and the questions paired.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from experiments.results.runs import LoadedRun, load_run
from experiments.results.tracking import TABLE, mlflow, tracking_uri
from experiments.scoring.significance import (
    PairingError,
    compare_pairing,
    pair_runs,
    render_table,
    verdict,
)


class RunNotReadable(Exception):
    """A run id the store does not know, or a run without a per-question table."""


def load(run_id: str, uri: str) -> LoadedRun:
    """The run with its per-question table, from whichever experiment holds it."""
    try:
        run = load_run(run_id)
    except mlflow.exceptions.MlflowException as exc:
        raise RunNotReadable(f"no run {run_id!r} in the MLflow store {uri}") from exc
    if run.questions.empty:
        raise RunNotReadable(
            f"run {run_id} has no per-question table ({TABLE}): it failed before any question "
            "finished, so there is nothing to pair"
        )
    return run


def main(argv: list[str] | None = None) -> int:
    """Print the paired comparison of run B against run A and which one is better where."""
    parser = argparse.ArgumentParser(prog="python -m experiments.compare", description=main.__doc__)
    parser.add_argument("run_a", metavar="RUN_A", help="run id of A (the baseline)")
    parser.add_argument("run_b", metavar="RUN_B", help="run id of B (the candidate)")
    parser.add_argument(
        "--metrics",
        type=lambda text: [m.strip() for m in text.split(",") if m.strip()],
        help="comma-separated per-question columns (default: quality and cost metrics)",
    )
    parser.add_argument(
        "--set",
        dest="set_name",
        metavar="NAME",
        help="compare only the questions of one question set (e.g. cross_book, hotpotqa:bridge)",
    )
    parser.add_argument("--resamples", type=_positive, default=10_000, help="default 10000")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = parser.parse_args(argv)

    uri = tracking_uri(None)
    mlflow.set_tracking_uri(uri)
    try:
        run_a, run_b = load(args.run_a, uri), load(args.run_b, uri)
        rows_a, rows_b = run_a.questions, run_b.questions
        if args.set_name is not None:
            rows_a, rows_b = (one_set(rows, args.set_name) for rows in (rows_a, rows_b))
        pairing = pair_runs(rows_a, rows_b, args.metrics)
    except (RunNotReadable, PairingError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    comparisons = compare_pairing(pairing, args.resamples, seed=args.seed)
    for side, run in (("A", run_a), ("B", run_b)):
        print(f"{side} = {run.name} · {run.label} · {run.run_id}")
    if args.set_name is not None:
        print(f"question set: {args.set_name}")
    print(pairing.describe() + "\n")
    print(render_table(comparisons, markdown=args.markdown))
    print(
        f"\nB − A: mean per-question difference; CI: percentile bootstrap over questions; p: "
        f"two-sided paired sign-flip permutation test ({args.resamples} draws, seed {args.seed})."
    )
    print(verdict(comparisons))
    return 0


def one_set(rows: pd.DataFrame, name: str) -> pd.DataFrame:
    """The rows of one question set; PairingError naming the sets the table has when none is."""
    sets = rows["set"].astype(str) if "set" in rows.columns else pd.Series(dtype=str)
    chosen = rows[(sets == name).to_numpy()]
    if chosen.empty:
        known = ", ".join(sorted(set(sets))) or "none"
        raise PairingError(f"no question of set {name!r} in the run; its sets: {known}")
    return chosen


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


if __name__ == "__main__":
    sys.exit(main())
