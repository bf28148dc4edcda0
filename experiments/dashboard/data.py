"""Pure functions over pandas for the dashboard: runs, filters, Pareto front, per-question diff."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from caprag.schemas import CallUsage
from caprag.serve.decision_log import Round
from caprag.trace import HopTrace
from experiments.results import metrics as registry
from experiments.results.row import SCHEMA, QuestionRow, rows_of
from experiments.scoring.oracle import ORACLE, OracleResult
from experiments.scoring.significance import question_means

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
CURRENT_SCHEMA = SCHEMA
READABLE_SCHEMAS = ("1", SCHEMA)
"""Schemas whose tables this dashboard reads (1 through the legacy adapter: `row.normalised`)."""
QUALITY = ("recall_at_k", "f1", "all_gold_at_k")
"""The quality axes the Compare page offers (labels and units: experiments.results.metrics)."""
COST = ("tokens", "cost_usd")
"""The cost axes (and what the oracle counts) the Compare page offers."""
POWER_PARAM = "params.strategy.power"
"""The adaptive strategy's power (auto, 1, 2, 3) as the harness logs it."""
AUTO = "auto"
ALWAYS_DEEP = "3"
"""The power of the 'always deep' run adaptive (auto) is set against: a forced depth 3."""
DECISION_LOG = ["round", "depth", "chunks", "confidence", "threshold", "decision"]


def runs_frame(raw: pd.DataFrame) -> pd.DataFrame:
    """mlflow.search_runs output → one row per run: identity columns, metrics by name, tags.

    Sweep parents are dropped (they hold no results); a missing tag becomes '?', so runs of an
    older schema still list.
    """
    if raw.empty:
        return pd.DataFrame(columns=[*RUN_COLUMNS, "label", "sweep", "power"])
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
    out["power"] = _power(raw, out)
    names = dict(zip(out["run_id"], out["name"], strict=True))
    out["sweep"] = out["parent_id"].map(lambda p: names.get(p, p) if isinstance(p, str) else "")
    metrics = raw[[c for c in raw.columns if c.startswith("metrics.")]]
    metrics = metrics.rename(columns=lambda c: c.removeprefix("metrics."))
    tags = raw[[c for c in raw.columns if c.startswith("tags.")]]
    out = pd.concat([out, metrics, tags], axis=1)
    out = out[out["role"] != "sweep"].sort_values("start_time", ascending=False)
    out["label"] = out["name"] + " [" + out["run_id"].str[:8] + "]"
    return out.reset_index(drop=True)


def _power(raw: pd.DataFrame, out: pd.DataFrame) -> pd.Series:
    """Each adaptive run's power: the logged `strategy.power` param, else the run name's
    'power=X' (the harness names runs so); None for other strategies."""
    logged = raw[POWER_PARAM] if POWER_PARAM in raw.columns else pd.Series(None, index=raw.index)
    named = out["name"].astype(str).str.extract(r"power=(\w+)", expand=False)
    power = logged.where(logged.notna(), named).astype(object)
    return power.where((out["strategy"] == "adaptive") & power.notna(), None)


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
    if schema not in READABLE_SCHEMAS:
        return f"Run {run['run_id']} uses schema {schema}; this dashboard reads {CURRENT_SCHEMA}."
    return None


def table_metrics() -> list[registry.Metric]:
    """The per-question metrics the Compare page's tables show (and recomputes on a slice)."""
    return [m for m in registry.listed() if m.per_question]


def metric_table(runs: pd.DataFrame, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Metrics side by side (default: every listed per-question one, experiments.results.metrics),
    one column per run, one row per metric any run has, titled by its heading: 'value (n/total)'
    where coverage is partial."""
    names = registry.names(table_metrics()) if metrics is None else metrics
    shown = [registry.get(n) for n in names if n in runs.columns and runs[n].notna().any()]
    table: dict[str, list[str]] = {}
    for _, run in runs.iterrows():
        total = run.get("questions")
        cells = []
        for metric in shown:
            value = run.get(metric.name)
            cell = metric.display(None if pd.isna(value) else float(value))
            share = run.get(f"{metric.name}.coverage")
            if pd.notna(share) and pd.notna(total) and float(share) < 1.0:
                cell += f" ({round(float(share) * float(total))}/{int(total)})"
            cells.append(cell)
        table[str(run["label"])] = cells
    return pd.DataFrame(table, index=[metric.heading for metric in shown])


NOT_METRICS = {"questions", "failed"}
"""Run-level counts the metric pickers leave out (the Runs page shows questions as a detail)."""


def metric_choices(runs: pd.DataFrame) -> list[str]:
    """The metrics a user can pick among the runs' columns: the registered ones in display
    order, then the rest (per-slice metrics such as recall_at_k/cross_book, metrics nobody
    registered) by name; coverage shares and run-level counts left out."""
    usual = registry.names(registry.all())
    numeric = [
        c
        for c in runs.columns
        if pd.api.types.is_numeric_dtype(runs[c])
        and not c.endswith(".coverage")
        and c not in NOT_METRICS
        and runs[c].notna().any()
    ]
    return [m for m in usual if m in numeric] + sorted(c for c in numeric if c not in usual)


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


RULE_MODEL = "offline"
"""The `model` of a step answered by its rule (no call sent)."""


def is_rule(call: CallUsage) -> bool:
    """Whether a usage record is a rule step's (nothing sent) rather than a model call's."""
    return call.model == RULE_MODEL


def steps_ran(calls: Sequence[CallUsage]) -> dict[str, str]:
    """Step → 'rule' or the model that answered it, in the order the steps first ran."""
    ran: dict[str, list[str]] = {}
    for call in calls:
        by = "rule" if is_rule(call) else (call.model or "model")
        seen = ran.setdefault(call.step or "?", [])
        if by not in seen:
            seen.append(by)
    return {step: " + ".join(by) for step, by in ran.items()}


def call_line(number: int, call: CallUsage) -> str:
    """One call in one Markdown line: step, rule or model, tokens, cost, attempts, error, notes."""
    step = _escape(call.step or "?")
    tokens = f"{call.prompt_tokens} + {call.completion_tokens}"
    cost = "cost unknown" if call.cost_usd is None else f"\\${call.cost_usd:.6f}"
    if is_rule(call):
        parts = [f"rule: no call sent · {tokens} tokens if sent · {cost} estimated"]
    else:
        parts = [
            f"model `{(call.model or '?').replace('`', '')}`",
            f"{tokens} tokens",
            cost,
            f"{call.attempts} attempt{'s' if call.attempts != 1 else ''}",
        ]
        if call.cached:
            parts.append("cached (nothing sent this time)")
        if call.messages is None:
            parts.append("messages not recorded")
    if call.error:
        parts.append(f"**error:** {_escape(call.error)}")
    if call.notes:
        parts.append("**notes:** " + "; ".join(_escape(n) for n in call.notes))
    return f"{number}. **{step}** · " + " · ".join(parts)


_MARKDOWN = str.maketrans({c: f"\\{c}" for c in "\\`*_[]<>|$~"})


def _escape(text: str) -> str:
    """Text shown literally inside Markdown (no emphasis, links or math from model output)."""
    return " ".join(text.split()).translate(_MARKDOWN)


def hop_documents(hop: HopTrace, row: QuestionRow) -> pd.DataFrame:
    """One hop's documents as a table: passage, book, page, section, score, new/duplicate, gold."""
    rows = [
        {
            "passage": doc.passage_id,
            "book": doc.book_id,
            "page": doc.page,
            "section": row.passage(doc.passage_id).section,
            "score": round(doc.score, 3),
            "seen": "new" if doc.new else "duplicate",
            "gold": "★ gold" if row.is_gold(doc.passage_id) else "",
        }
        for doc in hop.documents
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


def adaptive_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs of the adaptive strategy in auto mode (depth chosen per question)."""
    if "power" not in runs.columns:
        return runs.iloc[0:0]
    return runs[(runs["strategy"] == "adaptive") & (runs["power"] == AUTO)]


SAME_SETUP = ("dataset", "llm", "model", "tags.caprag.retriever")
"""What an always-deep run must share with an adaptive run to be its baseline."""


def always_deep_run(
    runs: pd.DataFrame, run: pd.Series, prefer: Sequence[str] = ()
) -> pd.Series | None:
    """The fixed depth-3 adaptive run of the same dataset, LLM backend, model and retriever as
    `run` (the latest; one of the run ids in `prefer` first), or None when the store has none."""
    if "power" not in runs.columns:
        return None
    same = runs[(runs["strategy"] == "adaptive") & (runs["power"] == ALWAYS_DEEP)]
    for column in SAME_SETUP:
        if column in runs.columns and pd.notna(run.get(column)):
            same = same[same[column] == run[column]]
    if same.empty:
        return None
    preferred = same[same["run_id"].isin(list(prefer))]
    pool = preferred if not preferred.empty else same
    return pool.sort_values("start_time", ascending=False).iloc[0]


@dataclass(frozen=True)
class Savings:
    """Adaptive (auto) against always deep over the questions both answered: totals and shares."""

    questions: int
    """Questions both runs answered (status ok), repeats averaged per question."""
    left_out: int
    """Questions only one of the runs answered."""
    prompt_tokens: tuple[float, float]
    """Total prompt tokens: adaptive, always deep."""
    cost_usd: tuple[float, float]
    """Total USD: adaptive, always deep."""
    recall_at_k: tuple[float | None, float | None]
    """Mean gold-passage recall@k (None where no question had gold passages)."""

    @property
    def token_saving(self) -> float | None:
        """Share of the always-deep prompt tokens adaptive saved (negative: it spent more)."""
        return _share_saved(*self.prompt_tokens)

    @property
    def cost_saving(self) -> float | None:
        """Share of the always-deep cost adaptive did not spend (negative: it spent more)."""
        return _share_saved(*self.cost_usd)


def savings_vs_deep(adaptive: pd.DataFrame, deep: pd.DataFrame) -> Savings:
    """Prompt tokens, cost and recall of adaptive vs always deep, paired question by question.

    Raises `PairingError` when a table has no `question_id` column (an older schema).
    """
    metrics = ["prompt_tokens", "cost_usd", "recall_at_k"]
    a, d = question_means(adaptive, metrics), question_means(deep, metrics)
    a, d = a.reindex(columns=metrics), d.reindex(columns=metrics)
    asked = a.index.union(d.index)
    common = a.index[a["prompt_tokens"].notna()].intersection(d.index[d["prompt_tokens"].notna()])
    a, d = a.loc[common], d.loc[common]
    return Savings(
        questions=len(common),
        left_out=len(asked) - len(common),
        prompt_tokens=(float(a["prompt_tokens"].sum()), float(d["prompt_tokens"].sum())),
        cost_usd=(float(a["cost_usd"].sum()), float(d["cost_usd"].sum())),
        recall_at_k=(_mean_or_none(a["recall_at_k"]), _mean_or_none(d["recall_at_k"])),
    )


def saving_text(saving: float | None, what: str) -> str:
    """'20.3% fewer prompt tokens', '4.1% more cost', or why there is no share."""
    if saving is None:
        return f"— (nothing spent on {what} to save)"
    less = "fewer" if "token" in what else "less"
    return f"{abs(saving):.1%} {less if saving >= 0 else 'more'} {what}"


def _share_saved(spent: float, baseline: float) -> float | None:
    return None if baseline == 0 else 1.0 - spent / baseline


def _mean_or_none(values: pd.Series) -> float | None:
    clean = values.dropna()
    return float(clean.mean()) if len(clean) else None


def decision_log(hops: Sequence[HopTrace]) -> pd.DataFrame:
    """The adaptive decision of each round: depth, chunks, confidence, threshold, decision
    (empty when the trace has no adaptive round: another strategy, or an older run)."""
    return pd.DataFrame(_rounds(hops), columns=DECISION_LOG)


def _rounds(hops: Sequence[HopTrace]) -> list[dict[str, Any]]:
    """The adaptive rounds of a trace as the decision log keeps them (hops without a depth left
    out)."""
    return [
        Round.model_validate(hop, from_attributes=True).model_dump(include=set(DECISION_LOG))
        for hop in hops
        if hop.depth is not None
    ]


def decision_table(log: pd.DataFrame) -> pd.DataFrame:
    """A decision log as shown: confidence and threshold in percent."""
    return log.assign(
        confidence=log["confidence"].map(percent), threshold=log["threshold"].map(percent)
    )


DEEPER = ["question_id", "rounds", "depths", "confidences", "threshold", "decisions"]
DEEPER += ["recall_at_k", "set", "question"]


def deeper_questions(table: pd.DataFrame) -> pd.DataFrame:
    """The questions where adaptive went past its first depth, one row each (index: the row of
    `table`, to open its trace): rounds, the depth, confidence and decision of each round, the
    threshold, and the recall@k reached."""
    rows = {}
    for index, row in zip(table.index, rows_of(table), strict=True):
        log = _rounds(row.hops)
        if not log or log[-1]["depth"] <= log[0]["depth"]:
            continue
        rows[index] = {
            "question_id": row.question_id or str(index),
            "set": row.set,
            "question": row.question,
            "rounds": len(log),
            "depths": " → ".join(str(r["depth"]) for r in log),
            "confidences": " → ".join(percent(r["confidence"]) for r in log),
            "threshold": percent(log[-1]["threshold"]),
            "decisions": " → ".join(r["decision"] for r in log),
            "recall_at_k": row.values.get("recall_at_k", float("nan")),
        }
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=DEEPER)
    return frame.astype({"rounds": "int64"}) if not frame.empty else frame


def percent(value: Any) -> str:
    """A share as a whole percentage ('—' when missing)."""
    return "—" if value is None or pd.isna(value) else f"{float(value):.0%}"


ORACLE_COLUMNS = ["run", "total", "per_question", "recall", "routed", "saves"]


def oracle_summary(result: OracleResult) -> pd.DataFrame:
    """Each run and the perfect router (last row, run 'oracle'): total and per-question cost,
    mean recall, questions routed to it, and what the router saves against it."""
    rows = [
        {
            "run": totals.name,
            "total": totals.total_cost,
            "per_question": totals.mean_cost,
            "recall": totals.mean_quality,
            "routed": totals.chosen,
            "saves": None if totals.name == ORACLE else result.saving(totals.name),
        }
        for totals in result.totals()
    ]
    return pd.DataFrame(rows, columns=ORACLE_COLUMNS)


def oracle_display(summary: pd.DataFrame, what: str) -> pd.DataFrame:
    """The oracle table as the page shows it: what the router saves against each run in words
    ('47.5% fewer tokens', '29.6% more tokens'), a dash on the router's own row."""
    saves = [
        "—" if run == ORACLE else saving_text(None if pd.isna(v) else float(v), what)
        for run, v in zip(summary["run"], summary["saves"], strict=True)
    ]
    return summary.assign(saves=saves)


def oracle_cell(value: Any, name: str, total: bool = False) -> str:
    """A value of the metric `name` as the page writes it (`total`: a sum over questions, with
    its unit: '12,345 tokens', '0.004321 USD')."""
    metric = registry.get(name)
    number = None if value is None or pd.isna(value) else float(value)
    if not total:
        return metric.display(number)
    unit = metric.total_unit or metric.unit
    return metric.display_total(number) + (f" {unit}" if unit and number is not None else "")
