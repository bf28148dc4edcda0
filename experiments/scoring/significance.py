"""Paired significance of run B against run A over per-question rows (repeats averaged first).

Each question is one observation: its metric is averaged over the run's repeats (failed rows and
missing values left out), the two runs are joined on `question_id`, and the per-question
differences B − A get a percentile bootstrap confidence interval (`scipy.stats.bootstrap`, paired)
and a sign-flip permutation p-value (`scipy.stats.permutation_test`, permutation_type="samples":
swapping A and B within a question flips the sign of its difference).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd
from scipy import stats

from experiments.results import metrics as registry
from experiments.results.tables import markdown_table

KEY = "question_id"
ALPHA = 0.05
MIN_PAIRED = 2
EXACT_MAX_N = 16
"""Up to this many paired questions every one of the 2^n sign patterns is tried (exact p)."""
BATCH = 1_000
"""Resamples scipy evaluates at once (bounds memory: BATCH x n values per sample)."""
HEADER = ("metric", "A", "B", "B − A", "{confidence:.0%} CI", "p", "n")

Floats = npt.NDArray[np.float64]


class PairingError(ValueError):
    """The two tables cannot be matched question by question."""


@dataclass(frozen=True)
class Pairing:
    """Each run's per-question means (index: question id, one column per metric present)."""

    metrics: tuple[str, ...]
    means_a: pd.DataFrame
    means_b: pd.DataFrame
    rows_a: int
    rows_b: int

    @property
    def paired(self) -> list[str]:
        """Question ids both runs asked."""
        return sorted(set(self.means_a.index) & set(self.means_b.index))

    @property
    def only_a(self) -> list[str]:
        """Question ids only run A asked."""
        return sorted(set(self.means_a.index) - set(self.means_b.index))

    @property
    def only_b(self) -> list[str]:
        """Question ids only run B asked."""
        return sorted(set(self.means_b.index) - set(self.means_a.index))

    def describe(self) -> str:
        """One line: how many questions were paired and how many were left out, per side."""
        return (
            f"{len(self.paired)} questions paired; {len(self.only_a)} only in A, "
            f"{len(self.only_b)} only in B (A: {self.rows_a} rows, B: {self.rows_b} rows; "
            "repeats averaged per question)"
        )


@dataclass(frozen=True)
class BootstrapCI:
    """Mean per-question difference B − A with its percentile bootstrap interval."""

    diff: float
    low: float
    high: float


@dataclass(frozen=True)
class MetricComparison:
    """One metric of run B against run A over the questions both have a value for.

    The numbers are None when the metric could not be compared; `reason` then says why.
    """

    metric: str
    n_paired: int
    mean_a: float | None
    mean_b: float | None
    diff: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    only_a: int = 0
    only_b: int = 0
    reason: str = ""

    def significant(self, alpha: float = ALPHA) -> bool:
        """Whether B − A differs from 0 at alpha."""
        if self.p_value is None or self.diff is None:
            return False
        return self.p_value < alpha and self.diff != 0

    def better(self, alpha: float = ALPHA) -> str:
        """'A' or 'B' when the difference is significant at alpha (by the metric's direction),
        else '' (also for a metric with no better direction)."""
        higher = registry.get(self.metric).higher_is_better
        if higher is None or self.diff is None or not self.significant(alpha):
            return ""
        return "B" if (self.diff > 0) == higher else "A"


def question_means(rows: pd.DataFrame, metrics: Sequence[str], key: str = KEY) -> pd.DataFrame:
    """Each question's mean of each metric over its repeats, counting only rows with status ok.

    A question whose every row failed or lacks the metric is NaN for it; metrics the table does
    not have are not columns of the result.
    """
    if key not in rows.columns:
        raise PairingError(
            f"the per-question table has no `{key}` column (an older schema): "
            "its questions cannot be matched with another run's"
        )
    present = [m for m in metrics if m in rows.columns]
    values = rows[present].astype(float)
    if "status" in rows.columns:
        values.loc[(rows["status"] != "ok").to_numpy()] = np.nan
    values.index = pd.Index(rows[key].astype(str), name=key)
    return values.groupby(level=key).mean()


def default_metrics(rows_a: pd.DataFrame, rows_b: pd.DataFrame) -> list[str]:
    """The headline metrics (experiments.results.metrics) either table has (one missing in a run
    gets a reason later)."""
    columns = set(rows_a.columns) | set(rows_b.columns)
    return [m.name for m in registry.headline() if m.name in columns]


def pair_runs(
    rows_a: pd.DataFrame,
    rows_b: pd.DataFrame,
    metrics: Sequence[str] | None = None,
    key: str = KEY,
) -> Pairing:
    """Both runs' per-question means, ready to be compared question by question."""
    chosen = tuple(
        dict.fromkeys(metrics if metrics is not None else default_metrics(rows_a, rows_b))
    )
    means = {}
    for side, rows in (("A", rows_a), ("B", rows_b)):
        try:
            means[side] = question_means(rows, chosen, key)
        except PairingError as exc:
            raise PairingError(f"run {side}: {exc}") from exc
    return Pairing(chosen, means["A"], means["B"], rows_a=len(rows_a), rows_b=len(rows_b))


def paired_bootstrap_ci(
    a: npt.ArrayLike,
    b: npt.ArrayLike,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> BootstrapCI:
    """Mean of b − a and its percentile interval from resampling questions with replacement."""
    return _bootstrap(_differences(a, b), confidence, _Draws(n_resamples, seed))


def paired_permutation_test(
    a: npt.ArrayLike, b: npt.ArrayLike, n_permutations: int = 10_000, seed: int = 0
) -> float:
    """Two-sided p-value that b − a is centred on 0, flipping the sign of each difference.

    Every one of the 2^n sign patterns is tried when n ≤ 16; otherwise n_permutations random
    ones, with p = (count + 1) / (n_permutations + 1) so that it is never 0.
    """
    return _permutation_p(_differences(a, b), _Draws(n_permutations, seed))


def compare_pairing(
    pairing: Pairing, n_resamples: int = 10_000, confidence: float = 0.95, seed: int = 0
) -> list[MetricComparison]:
    """Every metric of the pairing: means, B − A, bootstrap CI and permutation p (or a reason)."""
    draws = _Draws(n_resamples, seed)
    return [_compare_metric(pairing, metric, confidence, draws) for metric in pairing.metrics]


def compare_runs(
    rows_a: pd.DataFrame,
    rows_b: pd.DataFrame,
    metrics: Sequence[str] | None = None,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> list[MetricComparison]:
    """Run B against run A, metric by metric, over the questions both answered."""
    return compare_pairing(pair_runs(rows_a, rows_b, metrics), n_resamples, confidence, seed)


@dataclass(frozen=True)
class _Draws:
    """How many resamples (or random sign patterns) to draw, and the seed they come from: every
    metric gets a fresh generator from the seed, so metrics with as many questions get the same
    draws."""

    count: int
    seed: int

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"need at least one resample, got {self.count}")

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)


def _mean_difference(a: Floats, b: Floats, axis: int = -1) -> Floats:
    return np.mean(b - a, axis=axis)


def _absolute_sum(a: Floats, b: Floats, axis: int = -1) -> Floats:
    return np.abs(np.sum(b - a, axis=axis))


def _bootstrap(d: Floats, confidence: float, draws: _Draws) -> BootstrapCI:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, not {confidence}")
    diff = float(d.mean())
    if np.all(d == d[0]):
        return BootstrapCI(diff, diff, diff)  # every resample has this mean (scipy warns on it)
    result = stats.bootstrap(
        (np.zeros_like(d), d),  # the pairs (a, b) shifted so that a = 0: b − a is unchanged
        _mean_difference,
        n_resamples=draws.count,
        batch=BATCH,
        vectorized=True,
        paired=True,
        confidence_level=confidence,
        method="percentile",
        rng=draws.rng(),
    )
    interval = result.confidence_interval
    return BootstrapCI(diff, float(interval.low), float(interval.high))


def _permutation_p(d: Floats, draws: _Draws) -> float:
    """P(|sum of sign-flipped d| ≥ |sum of d|): the statistic is |sum|, so 'greater' is two-sided.

    scipy enumerates every pattern when n_resamples reaches their number (2^n), which it does
    for n ≤ EXACT_MAX_N."""
    count = max(draws.count, 2**d.size) if d.size <= EXACT_MAX_N else draws.count
    result = stats.permutation_test(
        (np.zeros_like(d), d),
        _absolute_sum,
        permutation_type="samples",
        n_resamples=count,
        batch=BATCH,
        vectorized=True,
        alternative="greater",
        rng=draws.rng(),
    )
    return float(result.pvalue)


def _compare_metric(
    pairing: Pairing, metric: str, confidence: float, draws: _Draws
) -> MetricComparison:
    # 1. the metric must have values in both runs
    missing = [
        f"run {side} did not log it"
        if metric not in means.columns
        else f"run {side} has no value for it (every row failed or it does not apply)"
        for side, means in (("A", pairing.means_a), ("B", pairing.means_b))
        if metric not in means.columns or means[metric].isna().all()
    ]
    if missing:
        return _not_compared(metric, 0, "; ".join(missing))
    # 2. pair the questions that have a value in both runs
    a_values = pairing.means_a[metric].dropna()
    b_values = pairing.means_b[metric].dropna()
    shared = a_values.index.intersection(b_values.index).sort_values()
    only_a = len(a_values.index.difference(b_values.index))
    only_b = len(b_values.index.difference(a_values.index))
    if len(shared) < MIN_PAIRED:
        reason = f"{len(shared)} question(s) with a value in both runs; needs {MIN_PAIRED}"
        return _not_compared(metric, len(shared), reason, only_a, only_b)
    a = a_values.loc[shared].to_numpy(dtype=float)
    b = b_values.loc[shared].to_numpy(dtype=float)
    # 3. interval and p-value on the per-question differences
    d = _differences(a, b)
    ci = _bootstrap(d, confidence, draws)
    return MetricComparison(
        metric=metric,
        n_paired=len(shared),
        mean_a=float(a.mean()),
        mean_b=float(b.mean()),
        diff=ci.diff,
        ci_low=ci.low,
        ci_high=ci.high,
        p_value=_permutation_p(d, draws),
        only_a=only_a,
        only_b=only_b,
    )


def _not_compared(
    metric: str, n_paired: int, reason: str, only_a: int = 0, only_b: int = 0
) -> MetricComparison:
    return MetricComparison(
        metric, n_paired, None, None, None, None, None, None, only_a, only_b, reason
    )


def _differences(a: npt.ArrayLike, b: npt.ArrayLike) -> Floats:
    a_arr = np.asarray(a, dtype=float)
    b_arr = np.asarray(b, dtype=float)
    if a_arr.ndim != 1 or a_arr.shape != b_arr.shape or a_arr.size == 0:
        raise ValueError(
            f"need two equally long, non-empty 1-D arrays, got {a_arr.shape} and {b_arr.shape}"
        )
    d = b_arr - a_arr
    if np.isnan(d).any():
        raise ValueError("paired values contain NaN: drop unpaired questions first")
    return d


def format_p(p: float | None) -> str:
    """p to 3 places, '<0.001' below that, '—' when not computed."""
    if p is None:
        return "—"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def table_rows(comparisons: Sequence[MetricComparison]) -> list[list[str]]:
    """Cells of the comparison table: metric (its heading), A, B, B − A, CI as [low, high], p, n,
    note; values written as the metric's registry entry says."""
    rows = []
    for c in comparisons:
        metric = registry.get(c.metric)
        if c.diff is None or c.ci_low is None or c.ci_high is None:
            diff = interval = "—"
        else:
            diff = ("+" if c.diff > 0 else "") + metric.display(c.diff)
            interval = f"[{metric.display(c.ci_low)}, {metric.display(c.ci_high)}]"
        unpaired = [f"{n} only in {side}" for side, n in (("A", c.only_a), ("B", c.only_b)) if n]
        note = "; ".join([*([c.reason] if c.reason else []), *unpaired])
        rows.append(
            [
                metric.heading,
                metric.display(c.mean_a),
                metric.display(c.mean_b),
                diff,
                interval,
                format_p(c.p_value),
                str(c.n_paired),
                note,
            ]
        )
    return rows


def header(confidence: float = 0.95) -> list[str]:
    """Column names of table_rows (the note column last)."""
    return [h.format(confidence=confidence) for h in HEADER] + ["note"]


def render_table(
    comparisons: Sequence[MetricComparison], markdown: bool = False, confidence: float = 0.95
) -> str:
    """The comparison as a Markdown table or as aligned plain text (note column only if used)."""
    names = header(confidence)
    rows = table_rows(comparisons)
    if not any(row[-1] for row in rows):
        names, rows = names[:-1], [row[:-1] for row in rows]
    if markdown:
        return markdown_table(names, rows)
    widths = [max(len(cell) for cell in column) for column in zip(names, *rows, strict=True)]
    lines = [names, ["-" * w for w in widths], *rows]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def verdict(comparisons: Sequence[MetricComparison], alpha: float = ALPHA) -> str:
    """Which run is better on which metric at p < alpha, and where there is no clear difference."""
    if not comparisons:
        return "No metric to compare: neither run logged any of the metrics asked for."
    groups: dict[str, list[str]] = {"B": [], "A": [], "": [], "differs": [], "not compared": []}
    for c in comparisons:
        if c.reason:
            side = "not compared"
        else:
            side = c.better(alpha) or ("differs" if c.significant(alpha) else "")
        groups[side].append(registry.get(c.metric).label)
    parts = [f"{side} better on {', '.join(groups[side])}" for side in ("B", "A") if groups[side]]
    if groups["differs"]:
        parts.append(f"different (neither is better) on {', '.join(groups['differs'])}")
    if groups[""]:
        parts.append(f"no significant difference on {', '.join(groups[''])}")
    if groups["not compared"]:
        parts.append(f"not compared: {', '.join(groups['not compared'])}")
    lower = [
        m.label
        for m in map(registry.get, dict.fromkeys(c.metric for c in comparisons))
        if m.higher_is_better is False
    ]
    rule = f" (lower is better for {', '.join(lower)})" if lower else ""
    return f"At p < {alpha:g}{rule}: " + "; ".join(parts) + "."
