"""reports/calibration.md and reports/adaptive.md: adaptive's confidence model, fitted and judged
on data it was not fitted on, and adaptive depth against always going deep."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from caprag.calibration import CALIBRATIONS, load_calibration
from experiments.cli.reports import Context, Report, register
from experiments.cli.reports.render import (
    Arm,
    difference,
    fmt,
    header,
    share_saved,
    significance,
    strategy_table,
    target,
)
from experiments.results.tables import markdown_table
from experiments.scoring.calibration import (
    expected_calibration_error,
    fit,
    judge,
    ranking_auc,
    reliability,
    save,
)

FITS = {
    "benchmarks": (
        ("dataset=hotpotqa", "dataset=squad"),
        ("coverage", "margin", "log_passages", "open_references"),
        ("curated",),
    ),
    "curated": (
        ("dataset=curated",),
        ("coverage", "margin", "log_passages"),
        ("hotpotqa", "squad"),
    ),
}
"""Each saved calibration: the datasets it is fitted on, its signals, and where it is judged
(held out). The rulebooks use `benchmarks`; the benchmarks use `curated` (conf/dataset/)."""
DATASETS = ("curated", "hotpotqa", "squad")
POWERS = ("1", "2", "3")
SAVING = 0.40
RECALL_POINTS = 0.01


def collect(context: Context, datasets: tuple[str, ...]) -> tuple[str, pd.DataFrame]:
    """The signal rows of an adaptive turn that never stops on confidence, in the clean store."""
    from experiments.cli.calibration import collect as gather

    return gather([*context.fixed(), *datasets])


def build_calibration(context: Context) -> str:
    """Fit each calibration, save it, and judge it where it was not fitted."""
    lines = header(
        "Adaptive's confidence calibration",
        "Adaptive compares a confidence with its query type's threshold (0.9 factual, 0.7 "
        "operational, 0.85 decision, 0.9 strategic). The rule's signals become that confidence "
        "through a logistic model of the probability that every gold passage was read "
        "(`caprag/calibrations/NAME.yaml`, `python -m experiments.calibration fit`): fitted "
        "on the rounds of adaptive turns that never stop on confidence, one row per question "
        "and round, and used only on data it was not fitted on. Each dataset names its choice "
        "(`dataset.calibration`): the benchmarks use `curated`, fitted on the rulebooks; the "
        "rulebooks use none, the weighted heuristic, which was made for them (a held-out fit "
        "rates a passage that answers the question at depth 1 below the 0.9 a factual "
        "question needs). The API and the harness read the same files and the same default "
        "(`CAPRAG_CALIBRATION`, `strategy.calibration`).",
    )
    frames = {name: collect(context, (f"dataset={name}",)) for name in DATASETS}
    rows = []
    for name, (datasets, features, held_out) in FITS.items():
        fitted_on = "+".join(d.removeprefix("dataset=") for d in datasets)
        frame = pd.concat([frames[d.removeprefix("dataset=")][1] for d in datasets])
        calibration = fit(frame, features, name=fitted_on)
        note = (
            f"Fitted by `make reports` on {fitted_on} ({len(frame)} question x round rows), "
            f"signals {', '.join(features)}; judged held out on {', '.join(held_out)} "
            "(reports/calibration.md)."
        )
        save(calibration, CALIBRATIONS / f"{name}.yaml", note)
        rows.append(_judged(name, f"{fitted_on} (in sample)", judge(calibration, frame)))
        for other in held_out:
            rows.append(_judged(name, f"{other} (held out)", judge(calibration, frames[other][1])))
    for dataset, (_label, frame) in frames.items():
        rows.append(_judged("none (the weighted heuristic)", dataset, heuristic_scores(frame)))
    lines += [
        markdown_table(
            ["calibration", "judged on", "rows", "mean confidence", "success rate", "ECE", "AUC"],
            rows,
        ),
        "",
        "ECE: question-weighted gap between confidence and success over 10 buckets; AUC: the "
        "chance a success is more confident than a failure. A held-out ECE above the in-sample "
        "one is what moving to another corpus costs.",
        "",
    ]
    for name in FITS:
        saved = load_calibration(name)
        assert saved is not None
        weights = ", ".join(f"{k} {v:+.3f}" for k, v in saved.weights.items())
        lines.append(f"- `{name}`: intercept {saved.intercept:+.3f}; {weights}.")
    return "\n".join([*lines, ""])


def heuristic_scores(frame: pd.DataFrame) -> dict[str, float]:
    """`judge`'s numbers for the weighted heuristic itself (no calibration)."""
    table = reliability(frame["heuristic"], frame["success"], bins=10)
    return {
        "rows": float(len(frame)),
        "mean_confidence": float(frame["heuristic"].mean()),
        "success_rate": float(frame["success"].mean()),
        "ece": expected_calibration_error(table),
        "auc": ranking_auc(frame["heuristic"].tolist(), frame["success"].tolist()),
    }


def _judged(name: str, where: str, scores: dict[str, float]) -> list[str]:
    return [
        name,
        where,
        f"{scores['rows']:.0f}",
        f"{scores['mean_confidence']:.3f}",
        f"{scores['success_rate']:.3f}",
        f"{scores['ece']:.3f}",
        f"{scores['auc']:.3f}",
    ]


def build_adaptive(context: Context) -> str:
    """Adaptive (auto) against forced depths 1, 2, 3 and a single query, on two datasets."""
    lines = header(
        "Adaptive depth against always going deep",
        "Adaptive classifies the question, searches at its type's depth (passages handed on: "
        "5, 15, 30 at depth 1, 2, 3), rates its confidence (the rule's signals through the "
        "dataset's calibration, `reports/calibration.md`) and, while short of the threshold, "
        "goes a depth deeper with new queries: the citations or linked names the assessment "
        "found unresolved, else the question's expansion; it stops when confident, when a "
        "round added nothing, or on a budget. `power=N` forces one search at depth N (always "
        "deep: power 3). The timeout budget counts searches (1 s each), as the API does by "
        "default, so these rows and a served answer decide alike. Dense MiniLM retrieval.",
    )
    targets: list[str] = []
    sections: list[str] = []
    for dataset, k in (("curated", 8), ("hotpotqa", 10)):
        single = Arm(
            "single", context.run("strategy=single", f"dataset={dataset}", f"retriever.k={k}")
        )
        auto = Arm(
            "adaptive auto",
            context.run("strategy=adaptive", f"dataset={dataset}", f"retriever.k={k}"),
        )
        forced = [
            Arm(
                f"adaptive power={p}",
                context.run(
                    "strategy=adaptive",
                    f"dataset={dataset}",
                    f"retriever.k={k}",
                    f"strategy.power={p}",
                ),
            )
            for p in POWERS
        ]
        deep = forced[-1]
        saved = share_saved(auto.mean("prompt_tokens"), deep.mean("prompt_tokens"))
        lost = difference(deep, auto, "cumulative_recall")
        above = difference(single, auto, "recall_at_k")
        targets += [
            target(
                saved is not None and saved >= SAVING,
                f"{dataset}: auto spends {fmt(saved, '.1%')} fewer prompt tokens than always "
                f"depth 3 (target ≥ {SAVING:.0%}): {fmt(auto.mean('prompt_tokens'), ',.0f')} "
                f"against {fmt(deep.mean('prompt_tokens'), ',.0f')} per question.",
            ),
            target(
                lost is not None and lost >= -RECALL_POINTS,
                f"{dataset}: its cumulative recall {fmt(auto.mean('cumulative_recall'))} "
                f"against depth 3's {fmt(deep.mean('cumulative_recall'))} ({fmt(lost, '+.3f')}; "
                f"target within {RECALL_POINTS}).",
            ),
            target(
                above is not None and above >= 0,
                f"{dataset}: its recall@{k} {fmt(auto.mean('recall_at_k'))} against a single "
                f"query's {fmt(single.mean('recall_at_k'))} ({fmt(above, '+.3f')}; target: not "
                "below).",
            ),
        ]
        metrics = (
            "recall_at_k", "cumulative_recall", "all_gold_at_k", "mrr", "passages_handed",
            "depth", "reached_threshold", "needed_2plus_rounds", "prompt_tokens", "cost_usd",
        )  # fmt: skip
        sections += [
            f"## {dataset} (k = {k})",
            "",
            strategy_table([single, auto, *forced], metrics),
            "",
            f"How auto's turns ended: {_stops(auto)}.",
            "",
            significance(deep, auto, ("recall_at_k", "cumulative_recall", "prompt_tokens")),
            "",
        ]
    return "\n".join([*lines, "## Targets", "", *targets, "", *sections])


def _stops(arm: Arm) -> str:
    """The last round's decision of each turn, most common first, as shares."""
    decisions = Counter((row.hops[-1].adaptive_decision or "—") for row in arm.rows if row.hops)
    total = sum(decisions.values()) or 1
    return ", ".join(f"{name} {count / total:.0%}" for name, count in decisions.most_common())


register(
    Report(
        "calibration.md",
        build_calibration,
        inputs=(
            "datasets/books/*.md",
            "datasets/questions/*.jsonl",
            "datasets/benchmarks/*.jsonl",
            "experiments/cli/calibration.py",
        ),
        module=__name__,
        extra_outputs=tuple(f"caprag/calibrations/{name}.yaml" for name in FITS),
        exclude=("caprag/calibrations/*.yaml",),
    )
)
register(
    Report(
        "adaptive.md",
        build_adaptive,
        inputs=(
            "datasets/books/*.md",
            "datasets/questions/*.jsonl",
            "datasets/benchmarks/hotpotqa_dev_distractor.jsonl",
        ),
        module=__name__,
    )
)
