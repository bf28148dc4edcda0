"""Metrics by slice of the questions: by question set, question type and gold hop count.

The one aggregation behind every breakdown (MLflow metrics, `experiments.cli.summary`, reports, the
dashboard's Compare page), computed from a run's per-question table, so runs logged before slices
existed slice too. A slice's mean covers its answered questions (status ok) that have the metric;
its `questions` counts all of its questions, failed ones included.

MLflow metric names (slashes group them in the MLflow UI; `=` is not allowed in a metric name):

- `<metric>/<set>`: by question set, e.g. `recall_at_k/cross_book`, `cost_usd/follow_up`;
- `<metric>/type/<type>`: by question type, e.g. `recall_at_k/type/bridge`;
- `<metric>/gold_hops/<n>`: by the number of gold passages (the hops a question needs),
  e.g. `recall_at_k/gold_hops/2`;
- `questions/<slice>` (same suffixes): the number of questions in the slice.

A character MLflow does not allow in a name (or a colon, which Windows stores reject) becomes `_`:
the set `hotpotqa:bridge` logs as `recall_at_k/hotpotqa_bridge`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import pandas as pd

from experiments.results import metrics as registry
from experiments.results.row import GOLD_HOPS

Dimension = Literal["set", "type", "gold_hops"]
DIMENSIONS: tuple[Dimension, ...] = ("set", "type", "gold_hops")
DIMENSION_LABELS: dict[Dimension, str] = {
    "set": "question set",
    "type": "question type",
    "gold_hops": "gold hops",
}
QUESTIONS = "questions"
_UNSAFE = re.compile(r"[^\w.\- ]")


def question_type(frame: pd.DataFrame) -> pd.Series:
    """Each question's type: the benchmark type of a `<benchmark>:<type>` set (`bridge` of
    `hotpotqa:bridge`, benchmarks give every question the query type `factual`), else its
    curated `query_type` (factual, operational, decision, strategic…)."""
    sets = _text(frame, "set")
    kinds = _text(frame, "query_type")
    benchmark = sets.str.partition(":")[2]
    return benchmark.where(benchmark != "", kinds)


def gold_hops(frame: pd.DataFrame) -> pd.Series:
    """The number of gold passages of each question (its hops; 0 for unanswerable ones), as
    text; empty where the table has no `gold_hops` column (a table that never knew its gold)."""
    if GOLD_HOPS not in frame.columns:
        return pd.Series("", index=frame.index, dtype=object)
    counts = pd.to_numeric(frame[GOLD_HOPS], errors="coerce")
    return counts.map(lambda n: "" if pd.isna(n) else str(int(n))).astype(object)


def slice_keys(frame: pd.DataFrame, by: Dimension) -> pd.Series:
    """The slice each question falls in along one dimension ('' where unknown)."""
    if by == "set":
        return _text(frame, "set")
    if by == "type":
        return question_type(frame)
    return gold_hops(frame)


def slice_means(frame: pd.DataFrame, metrics: Sequence[str], by: Dimension = "set") -> pd.DataFrame:
    """One row per slice (index: the slice, sorted): each metric's mean over the slice's answered
    questions, `questions` (all of the slice's questions) and `<metric>.coverage` (the share of
    them with a value). Empty when the table is empty or has no key for this dimension."""
    if frame.empty:
        return pd.DataFrame()
    keys = slice_keys(frame, by)
    if (keys == "").all():
        return pd.DataFrame()
    present = [m for m in metrics if m in frame.columns]
    values = frame[present].apply(pd.to_numeric, errors="coerce")
    status = _text(frame, "status").replace("", "ok")
    values.loc[status != "ok"] = float("nan")
    groups = values.groupby(keys, sort=True)
    table = groups.mean()
    table[QUESTIONS] = keys.groupby(keys, sort=True).size()
    counts = groups.count()
    for metric in present:
        table[f"{metric}.coverage"] = counts[metric] / table[QUESTIONS]
    table.index.name = by
    return table.drop(index="", errors="ignore")


def metric_name(metric: str, by: Dimension, key: str) -> str:
    """The MLflow name of a metric on one slice: `recall_at_k/cross_book`,
    `recall_at_k/type/bridge`, `recall_at_k/gold_hops/2`."""
    part = _UNSAFE.sub("_", key).strip() or "_"
    if part in {".", ".."}:
        part = part.replace(".", "_")
    return f"{metric}/{part}" if by == "set" else f"{metric}/{by}/{part}"


def slice_metrics(frame: pd.DataFrame, metrics: Sequence[str] | None = None) -> dict[str, float]:
    """Every slice's metric means and question count under its MLflow name (by default of the
    metrics registered as `sliced`: the main ones; the overall run logs them all).

    Sets are always logged; a type or gold-hops breakdown with a single slice repeats the
    overall metrics and is left out. A metric with no value on a slice is not logged there
    (its `questions/<slice>` count still is).
    """
    if metrics is None:
        metrics = registry.names(registry.sliced())
    out: dict[str, float] = {}
    for by in DIMENSIONS:
        table = slice_means(frame, metrics, by)
        if table.empty or (by != "set" and len(table) < 2):
            continue
        for key, row in table.iterrows():
            out[metric_name(QUESTIONS, by, str(key))] = float(row[QUESTIONS])
            for metric in metrics:
                value = row.get(metric)
                if value is not None and pd.notna(value):
                    out[metric_name(metric, by, str(key))] = float(value)
    return out


def _text(frame: pd.DataFrame, column: str) -> pd.Series:
    if column not in frame.columns:
        return pd.Series("", index=frame.index, dtype=object)
    return frame[column].fillna("").astype(str)


def keys_of(tables: Mapping[str, pd.DataFrame], by: Dimension) -> list[str]:
    """Every slice along `by` that any of the tables has, sorted."""
    found: set[str] = set()
    for table in tables.values():
        if not table.empty:
            found |= set(slice_keys(table, by)) - {""}
    return sorted(found, key=_natural)


def rows_in(table: pd.DataFrame, by: Dimension, key: str) -> pd.DataFrame:
    """The questions of a per-question table that fall in one slice."""
    return table[slice_keys(table, by) == key] if not table.empty else table


def sliced_runs(
    runs: pd.DataFrame,
    tables: Mapping[str, pd.DataFrame],
    by: Dimension,
    key: str,
    metrics: Sequence[str],
) -> pd.DataFrame:
    """The runs frame (one row per run, metric columns) with each metric, its coverage and
    `questions` recomputed on one slice from the run's per-question table (`tables`, by run id).
    A run without a table, or without questions in the slice, gets no values (shown as —)."""
    names = [*metrics, *(f"{m}.coverage" for m in metrics), QUESTIONS]
    found: dict[Any, dict[Any, Any]] = {}
    for index, run_id in zip(runs.index, runs["run_id"].astype(str), strict=True):
        table = tables.get(run_id)
        means = slice_means(table, metrics, by) if table is not None else pd.DataFrame()
        if key in means.index:
            found[index] = means.loc[key].to_dict()
    values = pd.DataFrame.from_dict(found, orient="index", dtype=float)
    out = runs.copy()
    out[names] = values.reindex(index=runs.index, columns=names)
    return out


def _natural(key: str) -> tuple[int, float, str]:
    """Numbers (gold hops) in numeric order, then text."""
    try:
        return (0, float(key), "")
    except ValueError:
        return (1, 0.0, key)
