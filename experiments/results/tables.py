"""Terminal tables: one run's metrics with coverage, and several runs side by side."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from experiments.results import metrics as registry
from experiments.results.aggregate import Aggregate, Failures


def fmt(value: float | None, name: str = "") -> str:
    """A value of the metric `name` as every view writes it (experiments.results.metrics)."""
    return registry.get(name).display(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table (also readable in a terminal)."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = [
        "| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in rows
    ]
    return "\n".join([line, rule, *body])


def run_table(
    aggregates: Mapping[str, Aggregate],
    summary: Mapping[str, float],
    failed: Failures | None = None,
) -> str:
    """One run: questions answered; metric, value, coverage (n/total with values) for every
    listed metric the run has, in the registry's order, then those nobody registered; the
    run-level numbers (no coverage). With `failed`, a line under the table names the most common
    error."""
    questions = int(summary.get("questions", 0))
    answered = questions - int(summary.get("failed", 0))
    rows = [["questions answered", str(answered), f"{answered}/{questions}"]]
    unknown = [registry.get(name) for name in aggregates if not registry.known(name)]
    for metric in [*(m for m in registry.listed() if m.per_question), *unknown]:
        agg = aggregates.get(metric.name)
        if agg is not None:
            rows.append([metric.heading, metric.display(agg.mean), agg.coverage])
    for metric in registry.listed():
        if not metric.per_question and metric.name in summary:
            rows.append([metric.heading, metric.display(summary[metric.name]), ""])
    table = markdown_table(["metric", "value", "coverage"], rows)
    if failed is not None and failed.failed:
        table += f"\nmost common error: {failed.most_common()}"
    return table


def compare_table(
    runs: Sequence[tuple[str, Mapping[str, float | None], Mapping[str, str]]],
) -> str:
    """Runs side by side: (label, metric → mean, metric → coverage) per run, one row per listed
    metric any of them has."""
    header = ["metric", *[label for label, _, _ in runs]]
    rows = []
    for metric in registry.listed():
        if not any(metric.name in values for _, values, _ in runs):
            continue
        cells = []
        for _, values, coverage in runs:
            cell = metric.display(values.get(metric.name))
            if coverage.get(metric.name) and coverage[metric.name] != "1.000":
                cell += f" ({coverage[metric.name]})"
            cells.append(cell)
        rows.append([metric.heading, *cells])
    return markdown_table(header, rows)
