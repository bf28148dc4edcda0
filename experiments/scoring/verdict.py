"""The verdict that ends every run, sweep and summary: at most ten lines a reader acts on.

Per question set, the runs are ranked by the set's main metric (gold-passage recall@k; token F1
where no question has gold passages; correct refusal on an unanswerable set), and the best run is
tested against the runner-up question by question (`experiments.scoring.significance`): the
difference with its 95 % bootstrap interval and permutation p, the same for token F1, and what the
winner costs per answer relative to the runner-up. A lead that is not significant (p ≥ 0.05) is
not called a win. One more line explains a metric that reads 0 by construction (exact match of
the offline extractive reader), so a 0.000 column is not mistaken for a broken run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from experiments.results import metrics as registry
from experiments.scoring.significance import MetricComparison, compare_runs, format_p

MAIN = ("recall_at_k", "f1", "correct_refusal")
"""The main metrics, in order: a set is ranked by the first one its questions have."""
SECOND = "f1"
"""Reported beside the main metric when it is not the main one itself."""
COST = "cost_usd"
MAX_LINES = 10
RESAMPLES = 2_000
"""Bootstrap draws per comparison: enough for a two-digit CI at the verdict's precision (the full
`python -m experiments.compare` uses 10,000)."""


@dataclass(frozen=True)
class Contender:
    """One run as the verdict needs it: a label, its per-question table, its generator step."""

    label: str
    questions: pd.DataFrame
    generator: str = ""
    """`rule` (the offline extractive reader), `llm`, or '' when unknown."""


def verdict_lines(runs: Sequence[Contender], resamples: int = RESAMPLES) -> list[str]:
    """The verdict: a heading, one line per question set, and the notes; at most MAX_LINES."""
    usable = [r for r in runs if not r.questions.empty and "set" in r.questions.columns]
    if len(usable) < 2:
        return ["Verdict: needs two runs with per-question tables (a sweep, or two run ids)."]
    sets = sorted(set().union(*(set(r.questions["set"].dropna().astype(str)) for r in usable)))
    notes = zero_by_construction(usable)
    room = MAX_LINES - 1 - len(notes)
    lines = [
        f"Verdict ({len(usable)} runs; per set: best run vs runner-up, paired over questions, "
        "95 % CI, p < 0.05 to win):"
    ]
    shown = sets if len(sets) <= room else sets[: room - 1]
    lines += [set_line(usable, name, resamples) for name in shown]
    if len(shown) < len(sets):
        lines.append(f"  … {len(sets) - len(shown)} more sets: python -m experiments.summary")
    return lines + notes


def set_line(runs: Sequence[Contender], set_name: str, resamples: int = RESAMPLES) -> str:
    """One set: the winner on its main metric, B − A with CI and p, F1 beside it, cost ratio."""
    tables = [(r, r.questions[r.questions["set"].astype(str) == set_name]) for r in runs]
    main = next((m for m in MAIN if any(_mean(t, m) is not None for _, t in tables)), None)
    count = max(len(t) for _, t in tables)
    if main is None:
        return f"  {set_name} ({count} q): no main metric ({', '.join(MAIN)}) has a value"
    metric = registry.get(main)
    ranked = sorted(
        (pair for pair in tables if _mean(pair[1], main) is not None),
        key=lambda pair: _mean(pair[1], main) or 0.0,
        reverse=bool(metric.higher_is_better),
    )
    if len(ranked) < 2:
        return f"  {set_name} ({count} q): only {ranked[0][0].label} has {metric.label}"
    (best, best_rows), (second, second_rows) = ranked[0], ranked[1]
    tested = [main] + ([SECOND] if main != SECOND else [])
    results = {
        c.metric: c for c in compare_runs(second_rows, best_rows, tested, n_resamples=resamples)
    }
    compared = [results[m] for m in tested if m == main or results[m].diff is not None]
    parts = [f"{best.label} vs {second.label}: " + "; ".join(map(_difference, compared))]
    wins = {
        side: [registry.get(c.metric).label for c in compared if c.better() == side]
        for side in ("B", "A")
    }
    said = [
        f"{run.label} wins on {', '.join(wins[side])}"
        for side, run in (("B", best), ("A", second))
        if wins[side]
    ]
    parts.append(" and ".join(said) if said else "no significant difference")
    parts.append(cost_ratio(best_rows, second_rows))
    return f"  {set_name} ({count} q): " + " → ".join(parts[:2]) + "; " + parts[2]


def _difference(c: MetricComparison) -> str:
    """'gold-passage recall@k +0.412 [0.301, 0.520] p<0.001'."""
    metric = registry.get(c.metric)
    if c.diff is None or c.ci_low is None or c.ci_high is None:
        return f"{metric.label} not compared ({c.reason or 'no pairs'})"
    sign = "+" if c.diff > 0 else ""
    p = format_p(c.p_value)
    return (
        f"{metric.label} {sign}{metric.display(c.diff)} "
        f"[{metric.display(c.ci_low)}, {metric.display(c.ci_high)}] p{'' if p[0] == '<' else '='}"
        + p
    )


def cost_ratio(best: pd.DataFrame, second: pd.DataFrame) -> str:
    """What the winner costs per answer as a multiple of the runner-up's, with both costs."""
    metric = registry.get(COST)
    a, b = _mean(best, COST), _mean(second, COST)
    if a is None or b is None:
        return "cost not recorded"
    both = f"{metric.display(a)} vs {metric.display(b)} per 1,000 q"
    if b == 0:
        return f"cost {both}"
    return f"cost ×{a / b:.2f} ({both})"


def zero_by_construction(runs: Sequence[Contender]) -> list[str]:
    """The note for exact match when every run that reads 0 on it used the extractive reader."""
    metric = registry.get("exact_match")
    zero = [r for r in runs if _mean(r.questions, "exact_match") == 0.0]
    if not zero or not all(r.generator == "rule" for r in zero):
        return []
    return [
        f"Note: {metric.label} reads 0 by construction here: the offline extractive reader "
        "(generator=rule) answers with whole sentences of the passages, never the short gold "
        "answer; read token F1 (or run a model: llm=openai)."
    ]


def _mean(rows: pd.DataFrame, metric: str) -> float | None:
    """The mean of a metric over a table's answered questions (None when none has it)."""
    if rows.empty or metric not in rows.columns:
        return None
    values = rows[metric]
    if "status" in rows.columns:
        values = values[rows["status"] == "ok"]
    mean = pd.to_numeric(values, errors="coerce").mean()
    return None if mean is None or math.isnan(mean) else float(mean)
