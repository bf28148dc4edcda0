"""`python -m experiments.summary [RUN_ID ...]`: compare runs (default: the latest sweep)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from experiments.results import metrics as registry
from experiments.results.runs import LoadedRun, connect, distinct_labels, latest_sweep, load_run
from experiments.results.slices import DIMENSION_LABELS, DIMENSIONS, slice_means
from experiments.results.tables import compare_table, markdown_table
from experiments.results.tracking import tracking_uri
from experiments.scoring.verdict import Contender, verdict_lines


def slice_sections(runs: Sequence[LoadedRun], metrics: Sequence[str] | None = None) -> list[str]:
    """'## By question set' (and type, gold hops) with a Markdown table each: one row per run
    and slice, a column per metric (default: those registered as `sliced`). A type or gold-hops
    breakdown where no run has two slices is left out (it would repeat the table of all
    questions)."""
    if metrics is None:
        metrics = registry.names(registry.sliced())
    headings = [registry.get(m).heading for m in metrics]
    lines: list[str] = []
    for by in DIMENSIONS:
        tables = [(run, slice_means(run.questions, metrics, by)) for run in runs]
        if by != "set" and all(len(table) < 2 for _, table in tables):
            continue
        rows = [
            [run.label, str(key), f"{values['questions']:.0f}"]
            + [_cell(values.get(m), m) for m in metrics]
            for run, table in tables
            for key, values in table.iterrows()
        ]
        if rows:
            header = ["run", DIMENSION_LABELS[by], "questions", *headings]
            lines += [f"## By {DIMENSION_LABELS[by]}", "", markdown_table(header, rows), ""]
    return lines


def _cell(value: object, metric: str) -> str:
    number = float(value) if isinstance(value, int | float) else None
    return registry.get(metric).display(number)


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
    sections = slice_sections(runs)
    if sections:
        print("\n" + "\n".join(sections).rstrip())
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
        "\n  Report:     uv run python -m experiments.report " + " ".join(run_ids) + "\n"
    )
    print("\n".join(verdict_lines([Contender(r.label, r.questions, r.generator) for r in runs])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
