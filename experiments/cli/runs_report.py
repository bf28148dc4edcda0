"""`python -m experiments.report RUN_ID ...`: a Markdown report with tables and PNG plots."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from caprag.config import PROJECT_ROOT
from experiments.cli.summary import slice_sections
from experiments.results import metrics as registry
from experiments.results.runs import LoadedRun, connect, distinct_labels, load_run
from experiments.results.tables import compare_table
from experiments.scoring.calibration import expected_calibration_error, reliability
from experiments.scoring.oracle import OracleError, oracle_routing
from experiments.scoring.oracle import markdown as oracle_markdown
from experiments.scoring.significance import compare_runs, render_table

DEFAULT_OUT = PROJECT_ROOT / "outputs" / "reports"
"""Where a report goes unless `--out` names a folder: not the committed `reports/`, which only
`make reports` writes."""


def plot_recall_per_hop(runs: list[LoadedRun], path: Path) -> None:
    """Cumulative gold-passage recall after each hop, one line per run (and set)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for run in runs:
        frame = run.questions
        if frame.empty:
            continue
        ok = frame[frame["status"] == "ok"]
        for set_name, group in ok.groupby("set"):
            cols = [c for c in ("recall_hop1", "recall_hop2", "recall_hop3") if c in group]
            values = group[cols].mean()
            if values.isna().all():
                continue
            ax.plot(
                range(1, len(cols) + 1),
                values.to_numpy(),
                marker="o",
                label=f"{run.strategy} · {set_name}",
            )
    ax.set_xlabel("hop")
    ax.set_xticks([1, 2, 3])
    ax.set_ylabel("cumulative gold-passage recall")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # runs without per-hop recall draw no line
        ax.legend(fontsize=8)
    ax.set_title("Recall per hop")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_cost_quality(runs: list[LoadedRun], path: Path) -> None:
    """Tokens per question vs recall@k, one point per run."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for run in runs:
        tokens = run.metrics.get("tokens")
        recall = run.metrics.get("recall_at_k")
        if tokens is None or recall is None:
            continue
        ax.scatter([tokens], [recall], s=60)
        ax.annotate(
            run.label, (tokens, recall), textcoords="offset points", xytext=(5, 5), fontsize=8
        )
    ax.set_xlabel(registry.get("tokens").heading + " per question")
    ax.set_ylabel(registry.get("recall_at_k").heading)
    ax.grid(alpha=0.3)
    ax.set_title("Cost vs quality")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_calibration(runs: list[LoadedRun], path: Path) -> bool:
    """Reliability diagram: confidence bucket vs share of questions whose context held every gold
    passage. Only runs that record a confidence (adaptive) are drawn; False when there are none."""
    fig, ax = plt.subplots(figsize=(5, 4))
    drawn = False
    for run in runs:
        frame = run.questions
        if frame.empty or "confidence" not in frame or "context_recall" not in frame:
            continue
        ok = frame[(frame["status"] == "ok") & frame["context_recall"].notna()]
        table = reliability(ok["confidence"], (ok["context_recall"] == 1.0).astype(float))
        if table.empty:
            continue
        ece = expected_calibration_error(table)
        ax.plot(
            table["mean_confidence"],
            table["success_rate"],
            marker="o",
            label=f"{run.label} (ECE {ece:.2f})",
        )
        drawn = True
    if not drawn:
        plt.close(fig)
        return False
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey", label="perfect calibration")
    ax.set_xlabel("confidence (bucket mean)")
    ax.set_ylabel("share with every gold passage retrieved")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("Calibration")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def oracle_section(runs: list[LoadedRun]) -> list[str]:
    """The oracle-routing ceiling over the runs that have per-question rows (none: no section)."""
    tables = {run.label: run.questions for run in runs if not run.questions.empty}
    if len(tables) < 2:
        return []
    try:
        result = oracle_routing(tables)
    except OracleError as exc:
        return ["## Oracle routing (ceiling)", "", f"Not computed: {exc}.", ""]
    return ["## Oracle routing (ceiling)", "", oracle_markdown(result)]


BASELINE_METRICS = ["recall_at_k", "all_gold_at_k", "hops", "tokens"]


def baseline_section(runs: list[LoadedRun], baseline: LoadedRun) -> list[str]:
    """Per question set, each run of the baseline's strategy against the baseline, paired."""
    lines = [
        "## Paired significance against the baseline run",
        "",
        f"A = baseline `{baseline.run_id}` ({baseline.name}), B = the run named. 95 % "
        "percentile-bootstrap CI over questions and two-sided paired permutation p (10,000 "
        "draws, seed 0; `experiments.scoring.significance`).",
        "",
    ]
    frame = baseline.questions
    for run in runs:
        if run.strategy != baseline.strategy or run.questions.empty or frame.empty:
            continue
        for set_name in sorted(frame["set"].unique()):
            rows_b = run.questions[run.questions["set"] == set_name]
            table = compare_runs(frame[frame["set"] == set_name], rows_b, BASELINE_METRICS)
            lines += [f"### {set_name}: {run.label}", "", render_table(table, markdown=True), ""]
    return lines


def write_report(
    runs: list[LoadedRun],
    name: str,
    notes: str = "",
    baseline: LoadedRun | None = None,
    out: Path = DEFAULT_OUT,
) -> Path:
    """Render tables and plots for the runs into <out>/<name>.md (+ PNGs)."""
    out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    hop_png = out / f"{slug}-recall-per-hop.png"
    cost_png = out / f"{slug}-cost-vs-quality.png"
    plot_recall_per_hop(runs, hop_png)
    plot_cost_quality(runs, cost_png)
    calibration_png = out / f"{slug}-calibration.png"
    has_calibration = plot_calibration(runs, calibration_png)
    lines = [
        f"# {name}",
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by "
        f"`python -m experiments.report {' '.join(r.run_id for r in runs)}"
        + (f" --baseline {baseline.run_id}" if baseline else "")
        + "`.",
        "",
    ]
    if notes:
        lines += [notes, ""]
    lines += [
        "## All questions",
        "",
        compare_table([(r.label, r.metrics, r.coverage()) for r in runs]),
        "",
    ]
    lines += slice_sections(runs)
    lines += oracle_section(runs)
    if baseline is not None:
        lines += baseline_section(runs, baseline)
    lines += [
        "## Plots",
        "",
        f"![recall per hop]({hop_png.name})",
        "",
        f"![cost vs quality]({cost_png.name})",
        "",
    ]
    if has_calibration:
        lines += [f"![calibration]({calibration_png.name})", ""]
    lines += ["## Runs", ""]
    lines += [f"- `{r.run_id}` {r.name}" for r in runs]
    path = out / f"{slug}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    """Write the report for the given runs."""
    parser = argparse.ArgumentParser(prog="python -m experiments.report", description=main.__doc__)
    parser.add_argument("run_ids", nargs="+")
    parser.add_argument("--name", default="comparison")
    parser.add_argument("--notes", default="", help="a paragraph placed under the title")
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        metavar="FOLDER",
        help="folder to write the report and its plots into (default: outputs/reports/; the "
        "committed reports/ are written by `make reports` only)",
    )
    parser.add_argument(
        "--baseline",
        default=None,
        metavar="RUN_ID",
        help="a run to test the runs of its strategy against, per question set (paired)",
    )
    args = parser.parse_args(argv)
    connect()
    runs = [load_run(r) for r in args.run_ids]
    distinct_labels(runs)
    baseline = load_run(args.baseline) if args.baseline else None
    path = write_report(runs, args.name, args.notes, baseline, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
