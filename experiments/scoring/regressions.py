"""Two runs side by side per question: which questions got better, worse or stayed the same on
one metric, with each side's failure tags; filters, counts and the export as a question set."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import pandas as pd

from experiments.results import metrics as registry
from experiments.results import slices
from experiments.results.row import rows_of
from experiments.scoring.failures import Corpus, failure_tags

BETTER, WORSE, SAME, NOT_SCORED = "better", "worse", "same", "not scored"
CHANGES = (WORSE, BETTER, SAME, NOT_SCORED)
"""In the order rows are listed: regressions first."""
KEYS = ("case_id", "question_id", "turn", "repeat")
INFO = ("set", "query_type", "question", "gold_answer")
"""Columns of run A's table each compared row carries (and `gold_ids`, from A's rows)."""
TOLERANCE = 1e-9


def metrics_of(a: pd.DataFrame, b: pd.DataFrame) -> list[str]:
    """The per-question metrics with a better direction (experiments.results.metrics) both tables
    can be compared on, in the registry's order."""
    return [
        m.name
        for m in registry.directed()
        if _values(a, m.name) is not None and _values(b, m.name) is not None
    ]


def compare(
    a: pd.DataFrame, b: pd.DataFrame, metric: str, corpus: Corpus | None = None
) -> pd.DataFrame:
    """Per question answered by both runs: each side's value and failure tags, and the change
    from A to B (better, worse, same, or not scored when the metric does not apply).

    A failed question counts as the metric's `failed_counts_as` (0 for quality scores) where the
    metric applies to it (the other run has a value), so a question that now fails is `worse`,
    not dropped; a metric without one (costs) leaves it not scored. Which way is better is the
    metric's direction; a metric with none is refused. `corpus` (where the passages a row does
    not keep are) lets the tags name a citation not followed.
    """
    keys = [k for k in KEYS if k in a.columns and k in b.columns]
    if "question_id" not in keys:
        raise ValueError("both runs' tables need a question_id column to be matched")
    rule = registry.get(metric)
    if rule.higher_is_better is None:
        raise ValueError(f"{metric} has no better direction: no question got better or worse")
    base = a[keys].copy()
    for column in INFO:
        base[column] = a[column] if column in a.columns else ""
    base["gold_ids"] = [row.gold_ids for row in rows_of(a)]
    sides = []
    for frame, tag in ((a, "a"), (b, "b")):
        side = frame[keys].copy()
        values = _values(frame, metric)
        side[f"value_{tag}"] = values if values is not None else float("nan")
        side[f"status_{tag}"] = frame["status"] if "status" in frame.columns else "ok"
        side[f"tags_{tag}"] = [failure_tags(row, corpus=corpus) for row in rows_of(frame)]
        sides.append(side)
    merged = base.merge(sides[0], on=keys).merge(sides[1], on=keys)
    for tag, other in (("a", "b"), ("b", "a")):
        failed = (merged[f"status_{tag}"] != "ok") & merged[f"value_{tag}"].isna()
        applies = merged[f"value_{other}"].notna()
        if rule.failed_counts_as is not None:
            worst = failed & applies
            merged.loc[worst, f"value_{tag}"] = rule.failed_counts_as
    delta = merged["value_b"] - merged["value_a"]
    if not rule.higher_is_better:
        delta = -delta
    merged["type"] = slices.question_type(merged)  # the Compare page's and reports' types
    merged["change"] = [_change(d) for d in delta]
    merged["delta"] = merged["value_b"] - merged["value_a"]
    return merged


def _change(delta: float) -> str:
    if pd.isna(delta):
        return NOT_SCORED
    if delta > TOLERANCE:
        return BETTER
    if delta < -TOLERANCE:
        return WORSE
    return SAME


def _values(frame: pd.DataFrame, metric: str) -> pd.Series | None:
    """The metric's column (all-gold from recall 1 in tables logged before its column)."""
    if metric in frame.columns:
        return pd.to_numeric(frame[metric], errors="coerce")
    if metric == "all_gold_at_k" and "recall_at_k" in frame.columns:
        recall = pd.to_numeric(frame["recall_at_k"], errors="coerce")
        return (recall >= 1.0).astype(float).mask(recall.isna())
    return None


def filtered(
    frame: pd.DataFrame,
    sets: Collection[str] = (),
    types: Collection[str] = (),
    tags: Collection[str] = (),
    changes: Collection[str] = (),
) -> pd.DataFrame:
    """The rows in the chosen sets, types and changes that carry a chosen tag in either run
    (an empty choice keeps everything)."""
    keep = pd.Series(True, index=frame.index)
    if sets:
        keep &= frame["set"].astype(str).isin(sets)
    if types:
        keep &= frame["type"].astype(str).isin(types)
    if tags:
        wanted = set(tags)
        pairs = zip(frame["tags_a"], frame["tags_b"], strict=True)
        keep &= pd.Series([bool(wanted & {*a, *b}) for a, b in pairs], index=frame.index)
    if changes:
        keep &= frame["change"].isin(changes)
    return frame[keep]


def ordered(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows by change (worse first, as `CHANGES`), then set and question id."""
    rank = frame["change"].map({change: i for i, change in enumerate(CHANGES)})
    order = frame.assign(_rank=rank).sort_values(["_rank", "set", "question_id"], kind="stable")
    return order.drop(columns="_rank")


def counts(frame: pd.DataFrame) -> dict[str, int]:
    """How many rows got worse, better, stayed the same or were not scored."""
    found = frame["change"].value_counts()
    return {change: int(found.get(change, 0)) for change in CHANGES}


def single_questions(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows that are questions of their own: a turn of a conversation cannot be asked
    without the turns before it, so it is left out of an exported set."""
    if "case_id" not in frame.columns:
        return frame
    alone = frame["case_id"].astype(str) == frame["question_id"].astype(str)
    return frame[alone]


def as_dataset(
    frame: pd.DataFrame, labels: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """The rows as question-set items (`experiments.results.questions.GoldQuestion`): id, question,
    gold answer and passages, hops, books, type and set. A run's table keeps neither the
    reference text nor answer aliases, so those are left empty; a question asked in several
    repeats is written once. `labels` (question id → a human label's text) fill `label`."""
    items: dict[str, dict[str, Any]] = {}
    labels = labels or {}
    for row in single_questions(frame).to_dict("records"):
        gold = [str(p) for p in row.get("gold_ids") or []]
        items.setdefault(
            str(row["question_id"]),
            {
                "id": str(row["question_id"]),
                "question": str(row["question"]),
                "answer": str(row.get("gold_answer") or ""),
                "gold_passages": gold,
                "hops": len(gold),
                "books": list(dict.fromkeys(p.split("/")[0] for p in gold)),
                "query_type": str(row["query_type"]),
                "set": str(row.get("set") or ""),
                **(
                    {"label": labels[str(row["question_id"])]}
                    if str(row["question_id"]) in labels
                    else {}
                ),
            },
        )
    return list(items.values())


def to_jsonl(items: Iterable[dict[str, Any]]) -> str:
    """One JSON object a line, as the question files are written."""
    return "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items)
