"""`python -m experiments.summary [RUN_ID ...]`: compare runs (default: the latest sweep)."""

from __future__ import annotations

import argparse
import sys

from experiments.runs import connect, distinct_labels, latest_sweep, load_run, per_set
from experiments.tables import compare_table, fmt_cell, markdown_table
from experiments.tracking import tracking_uri

SET_METRICS = ["recall_at_k", "all_gold_at_k", "f1", "hops", "tokens", "latency_s"]


def main(argv: list[str] | None = None) -> int:
    """Print the comparison table and where to look next."""
    parser = argparse.ArgumentParser(prog="python -m experiments.summary", description=main.__doc__)
    parser.add_argument("run_ids", nargs="*")
    args = parser.parse_args(argv)
    experiment_id = connect()
    run_ids = args.run_ids or latest_sweep(experiment_id)
    if not run_ids:
        print("no runs to compare: run a sweep first (make run)", file=sys.stderr)
        return 2
    runs = [load_run(r) for r in run_ids]
    distinct_labels(runs)
    print("\n## All questions\n")
    print(compare_table([(r.label, r.metrics, r.coverage()) for r in runs]))
    rows = []
    for run in runs:
        table = per_set(run, SET_METRICS)
        for set_name, values in table.iterrows():
            rows.append(
                [
                    run.label,
                    str(set_name),
                    f"{values['questions']:.0f}",
                    *[fmt_cell(values.get(m)) for m in SET_METRICS],
                ]
            )
    if rows:
        print("\n## By question set\n")
        print(markdown_table(["run", "set", "questions", *SET_METRICS], rows))
    uri = tracking_uri()
    ui = (
        uri  # a tracking server serves its own UI
        if uri.startswith(("http://", "https://"))
        else f"uv run mlflow ui --backend-store-uri {uri} --host 127.0.0.1"
        " --port 5000   → http://127.0.0.1:5000"
    )
    print(
        "\nRuns: " + ", ".join(run_ids) + f"\nNext:\n  MLflow UI:  {ui}"
        "\n  Dashboard:  make dashboard   → http://127.0.0.1:8501 (Compare, Trace viewer)"
        "\n  Report:     uv run python -m experiments.report " + " ".join(run_ids)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
