"""Pure functions over pandas for the dashboard: runs, filters, Pareto front, per-question diff."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd

from experiments.tables import SHOWN, fmt

IDENTITY = {
    "name": "tags.mlflow.runName",
    "strategy": "tags.caprag.strategy",
    "dataset": "tags.caprag.dataset",
    "llm": "tags.caprag.llm",
    "model": "tags.caprag.model",
    "schema": "tags.caprag.schema",
    "role": "tags.caprag.role",
    "parent_id": "tags.mlflow.parentRunId",
}
RUN_COLUMNS = ["run_id", "experiment_id", "start_time", "status", *IDENTITY]
UNKNOWN = "?"
CURRENT_SCHEMA = "1"
QUALITY = {
    "recall_at_k": "gold-passage recall@k",
    "f1": "token F1",
    "all_gold_at_k": "all gold in k",
}
COST = {"tokens": "tokens / question", "cost_usd": "USD / question"}
Criterion = Literal["all_gold", "f1"]


def runs_frame(raw: pd.DataFrame) -> pd.DataFrame:
    """mlflow.search_runs output → one row per run: identity columns, metrics by name, tags.

    Sweep parents are dropped (they hold no results); a missing tag becomes '?', so runs of an
    older schema still list.
    """
    if raw.empty:
        return pd.DataFrame(columns=[*RUN_COLUMNS, "label", "sweep"])
    out = pd.DataFrame(index=raw.index)
    out["run_id"] = raw["run_id"].astype(str)
    out["experiment_id"] = raw["experiment_id"].astype(str)
    out["start_time"] = pd.to_datetime(raw["start_time"], utc=True)
    out["status"] = raw.get("status", pd.Series(UNKNOWN, index=raw.index))
    for column, tag in IDENTITY.items():
        values = raw[tag] if tag in raw.columns else pd.Series(None, index=raw.index)
        out[column] = values.where(values.notna(), None)
    for column in ("strategy", "dataset", "llm", "model"):
        out[column] = out[column].fillna(UNKNOWN)
    out["name"] = out["name"].fillna(out["run_id"])
    names = dict(zip(out["run_id"], out["name"], strict=True))
    out["sweep"] = out["parent_id"].map(lambda p: names.get(p, p) if isinstance(p, str) else "")
    metrics = raw[[c for c in raw.columns if c.startswith("metrics.")]]
    metrics = metrics.rename(columns=lambda c: c.removeprefix("metrics."))
    tags = raw[[c for c in raw.columns if c.startswith("tags.")]]
    out = pd.concat([out, metrics, tags], axis=1)
    out = out[out["role"] != "sweep"].sort_values("start_time", ascending=False)
    out["label"] = out["name"] + " [" + out["run_id"].str[:8] + "]"
    return out.reset_index(drop=True)


def filter_runs(
    runs: pd.DataFrame,
    *,
    datasets: Sequence[str] = (),
    strategies: Sequence[str] = (),
    llms: Sequence[str] = (),
    since: dt.date | None = None,
    until: dt.date | None = None,
    tag: str = "",
) -> pd.DataFrame:
    """Runs matching every filter given; `tag` is 'key=value' or a key that must be set."""
    keep = pd.Series(True, index=runs.index)
    for column, wanted in (("dataset", datasets), ("strategy", strategies), ("llm", llms)):
        if wanted:
            keep &= runs[column].isin(list(wanted))
    day = runs["start_time"].dt.date
    if since is not None:
        keep &= day >= since
    if until is not None:
        keep &= day <= until
    if tag.strip():
        key, _, value = tag.strip().partition("=")
        column = key.strip() if key.strip().startswith("tags.") else f"tags.{key.strip()}"
        if column not in runs.columns:
            return runs.iloc[0:0]
        values = runs[column]
        keep &= values.astype(str).eq(value.strip()) if value.strip() else values.notna()
    return runs[keep]


def schema_warning(run: pd.Series) -> str | None:
    """Why a run may lack columns or tags (logged by an older caprag), or None."""
    schema = run.get("schema")
    if not isinstance(schema, str) or not schema:
        return (
            f"Run {run['run_id']} has no `caprag.schema` tag: it was logged by an older caprag, "
            "so some metrics, tags or per-question columns may be missing (shown as —)."
        )
    if schema != CURRENT_SCHEMA:
        return f"Run {run['run_id']} uses schema {schema}; this dashboard reads {CURRENT_SCHEMA}."
    return None


def metric_table(runs: pd.DataFrame, metrics: Sequence[tuple[str, str]] = SHOWN) -> pd.DataFrame:
    """Metrics side by side, one column per run: 'value (n/total)' where coverage is partial."""
    table: dict[str, list[str]] = {}
    shown = [(n, label) for n, label in metrics if n in runs.columns and runs[n].notna().any()]
    for _, run in runs.iterrows():
        total = run.get("questions")
        cells = []
        for name, _label in shown:
            value = run.get(name)
            cell = fmt(None if pd.isna(value) else float(value), name)
            share = run.get(f"{name}.coverage")
            if pd.notna(share) and pd.notna(total) and float(share) < 1.0:
                cell += f" ({round(float(share) * float(total))}/{int(total)})"
            cells.append(cell)
        table[str(run["label"])] = cells
    return pd.DataFrame(table, index=[label for _, label in shown])


def pareto_front(frame: pd.DataFrame, cost: str, quality: str) -> pd.Series:
    """True for rows no other row beats (cost no higher and quality no lower, one strictly)."""
    if cost not in frame.columns or quality not in frame.columns:
        return pd.Series(False, index=frame.index)
    points = frame[[cost, quality]].dropna().sort_values([cost, quality], ascending=[True, False])
    kept, best = [], float("-inf")
    for index, value in zip(points.index, points[quality], strict=True):
        if value > best:
            kept.append(index)
            best = value
    return pd.Series(frame.index.isin(kept), index=frame.index)


def recall_curve(runs: pd.DataFrame, hops: int = 3) -> pd.DataFrame:
    """Cumulative gold-passage recall after each hop: columns label, strategy, hop, recall."""
    rows = [
        {
            "label": run["label"],
            "strategy": run["strategy"],
            "hop": h,
            "recall": run[f"recall_hop{h}"],
        }
        for _, run in runs.iterrows()
        for h in range(1, hops + 1)
        if f"recall_hop{h}" in runs.columns and pd.notna(run[f"recall_hop{h}"])
    ]
    return pd.DataFrame(rows, columns=["label", "strategy", "hop", "recall"])


def correct(questions: pd.DataFrame, criterion: Criterion, threshold: float = 0.5) -> pd.Series:
    """Whether each question is right: all gold passages in context, or F1 ≥ threshold.

    A failed question is wrong; one the metric does not apply to (unanswerable) is NA.
    """
    if criterion == "f1":
        values = _column(questions, "f1")
        right = (values >= threshold).astype("boolean")
    else:
        values = _column(questions, "all_gold_at_k")
        if values.isna().all() and "recall_at_k" in questions.columns:
            values = _column(questions, "recall_at_k")  # older tables: all gold ⇔ recall 1
        right = (values >= 1.0).astype("boolean")
    right = right.mask(values.isna())
    return right.mask(_column(questions, "status", "ok") != "ok", False)


def question_diff(
    a: pd.DataFrame, b: pd.DataFrame, criterion: Criterion = "all_gold", threshold: float = 0.5
) -> pd.DataFrame:
    """Questions of both runs side by side: right in A / B, hop counts, and the outcome."""
    keys = [k for k in ("case_id", "question_id", "turn") if k in a.columns and k in b.columns]
    if "question_id" not in keys:
        return pd.DataFrame()
    info = ["set", "query_type", "question"]

    def side(frame: pd.DataFrame, tag: str) -> pd.DataFrame:
        part = frame[keys].copy()
        part[f"right_{tag}"] = correct(frame, criterion, threshold)
        part[f"hops_{tag}"] = _column(frame, "hops")
        part[f"f1_{tag}"] = _column(frame, "f1")
        part[f"recall_{tag}"] = _column(frame, "recall_at_k")
        return part

    base = a[keys].copy()
    for column in info:
        base[column] = _column(a, column, "")
    merged = base.merge(side(a, "a"), on=keys).merge(side(b, "b"), on=keys)
    merged["outcome"] = [
        _outcome(x, y) for x, y in zip(merged["right_a"], merged["right_b"], strict=True)
    ]
    return merged


def _outcome(a: Any, b: Any) -> str:
    if pd.isna(a) or pd.isna(b):
        return "not scored"
    if a and not b:
        return "only A right"
    if b and not a:
        return "only B right"
    return "both right" if a else "both wrong"


def _column(frame: pd.DataFrame, name: str, default: Any = float("nan")) -> pd.Series:
    if name in frame.columns:
        return frame[name]
    return pd.Series(default, index=frame.index)


@dataclass
class TraceView:
    """What the trace view shows for one answered question (logged or asked live)."""

    question: str
    main_question: str
    hops: list[dict[str, Any]]
    answer: str
    context_ids: list[str]
    gold_answer: str = ""
    gold_ids: list[str] = field(default_factory=list)
    status: str = "ok"
    error: str = ""
    sections: dict[str, str] = field(default_factory=dict)
    calls: list[dict[str, Any]] | None = None
    """Every LLM step of the turn in order (CallUsage as data); None when the run did not record
    them (tables logged before the `calls` column)."""


def trace_from_row(row: pd.Series) -> TraceView:
    """A logged question row (JSON columns decoded; columns an older table lacks left empty)."""
    hops = _json(row.get("trace"), [])
    sections = {
        doc["passage_id"]: doc.get("section", "")
        for hop in hops
        for doc in hop.get("documents", [])
        if doc.get("section")
    }
    return TraceView(
        question=str(row.get("question", "") or ""),
        main_question=str(row.get("main_question", "") or ""),
        hops=hops,
        answer=str(row.get("answer", "") or ""),
        context_ids=_json(row.get("context_ids"), []),
        gold_answer=str(row.get("gold_answer", "") or ""),
        gold_ids=_json(row.get("gold_ids"), []),
        status=str(row.get("status", "ok") or "ok"),
        error=str(row.get("error", "") or ""),
        sections=sections,
        calls=_calls(row.get("calls")),
    )


def _json(value: Any, default: list[Any]) -> list[Any]:
    if isinstance(value, str) and value:
        decoded = json.loads(value)
        return list(decoded) if isinstance(decoded, list) else default
    return default


def _calls(value: Any) -> list[dict[str, Any]] | None:
    """The `calls` column decoded; None when the table has no such column (or no value)."""
    if not isinstance(value, str):
        return None
    if not value:
        return []
    try:
        decoded = json.loads(value)
    except json.JSONDecodeError:
        return None
    return [c for c in decoded if isinstance(c, dict)] if isinstance(decoded, list) else None


RULE_MODEL = "offline"
"""The `model` of a step answered by its rule (no call sent)."""


def is_rule(call: dict[str, Any]) -> bool:
    """Whether a usage record is a rule step's (nothing sent) rather than a model call's."""
    return str(call.get("model", "")) == RULE_MODEL


def steps_ran(calls: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Step → 'rule' or the model that answered it, in the order the steps first ran."""
    ran: dict[str, list[str]] = {}
    for call in calls:
        by = "rule" if is_rule(call) else str(call.get("model") or "model")
        seen = ran.setdefault(str(call.get("step") or "?"), [])
        if by not in seen:
            seen.append(by)
    return {step: " + ".join(by) for step, by in ran.items()}


def call_line(number: int, call: dict[str, Any]) -> str:
    """One call in one Markdown line: step, rule or model, tokens, cost, attempts, error, notes."""
    step = _escape(str(call.get("step") or "?"))
    tokens = f"{int(call.get('prompt_tokens') or 0)} + {int(call.get('completion_tokens') or 0)}"
    cost = f"\\${float(call.get('cost_usd') or 0.0):.6f}"
    if is_rule(call):
        parts = [f"rule: no call sent · {tokens} tokens if sent · {cost} estimated"]
    else:
        attempts = int(call.get("attempts") or 1)
        parts = [
            f"model `{str(call.get('model') or '?').replace('`', '')}`",
            f"{tokens} tokens",
            cost,
            f"{attempts} attempt{'s' if attempts != 1 else ''}",
        ]
        if call.get("cached"):
            parts.append("cached (nothing sent this time)")
        if call.get("messages") is None:
            parts.append("messages not recorded")
    if call.get("error"):
        parts.append(f"**error:** {_escape(str(call['error']))}")
    notes = [str(n) for n in call.get("notes") or []]
    if notes:
        parts.append("**notes:** " + "; ".join(_escape(n) for n in notes))
    return f"{number}. **{step}** · " + " · ".join(parts)


_MARKDOWN = str.maketrans({c: f"\\{c}" for c in "\\`*_[]<>|$~"})


def _escape(text: str) -> str:
    """Text shown literally inside Markdown (no emphasis, links or math from model output)."""
    return " ".join(text.split()).translate(_MARKDOWN)


def hop_documents(hop: dict[str, Any], sections: dict[str, str]) -> pd.DataFrame:
    """One hop's documents as a table: passage, book, page, score, new/duplicate, gold."""
    rows = [
        {
            "passage": doc.get("passage_id", ""),
            "book": doc.get("book_id", ""),
            "page": doc.get("page", ""),
            "section": doc.get("section") or sections.get(doc.get("passage_id", ""), ""),
            "score": round(float(doc.get("score", 0.0)), 3),
            "seen": "new" if doc.get("new", True) else "duplicate",
            "gold": "★ gold" if doc.get("gold") else "",
        }
        for doc in hop.get("documents", [])
    ]
    return pd.DataFrame(
        rows, columns=["passage", "book", "page", "section", "score", "seen", "gold"]
    )


def default_comparison(runs: pd.DataFrame) -> list[str]:
    """The runs of the latest sweep, else the two latest runs."""
    swept = runs[runs["parent_id"].notna() & (runs["parent_id"] != "")]
    if not swept.empty:
        parent = swept.iloc[0]["parent_id"]
        return list(swept[swept["parent_id"] == parent]["run_id"])
    return list(runs["run_id"].head(2))
