"""Runs: all logged runs, filtered by dataset, strategy, LLM, date and tag; pick runs to compare."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from experiments.dashboard import selection
from experiments.dashboard.data import filter_runs
from experiments.results.tables import SHOWN as METRIC_NAMES

# The columns after the run and the picked metrics (a bare string here would be shown: magic).
DETAILS = [
    "strategy", "dataset", "llm", "model", "start_time", "status", "sweep", "questions", "run_id",
]  # fmt: skip
DEFAULT_METRICS = ["recall_at_k", "all_gold_at_k", "f1", "hops", "tokens", "cost_usd"]
SHORT = {
    "recall_at_k": "recall@k",
    "all_gold_at_k": "all gold@k",
    "precision_at_k": "precision@k",
    "mrr": "MRR",
    "f1": "F1",
    "exact_match": "exact match",
    "prompt_tokens": "prompt tok/q",
    "completion_tokens": "compl. tok/q",
    "tokens": "tokens/q",
    "cost_usd": "$ / 1k q",
    "latency_s": "latency s",
}
LONG = dict(METRIC_NAMES) | {"tokens": "tokens per question (prompt + completion)"}
NOT_METRICS = {"questions", "failed"}
PER_1K = 1000
RUN_WIDTH_PX = 330


def metric_columns(runs: pd.DataFrame) -> list[str]:
    """The metrics a user can show: the usual ones in their usual order, then the rest (slices
    such as recall_at_k/cross_book) by name; coverage shares and counts left out."""
    usual = [name for name, _ in METRIC_NAMES] + ["tokens"]
    numeric = [
        c
        for c in runs.columns
        if pd.api.types.is_numeric_dtype(runs[c])
        and not c.endswith(".coverage")
        and c not in NOT_METRICS
        and runs[c].notna().any()
    ]
    return [m for m in usual if m in numeric] + sorted(c for c in numeric if c not in usual)


def decimals(name: str) -> int:
    """Places a metric is rounded to: shares 3, tokens, calls and counts 0, hops and latency 2,
    dollars per 1,000 questions 3."""
    base = name.partition("/")[0]
    if base.endswith(("tokens", "calls")) or base in {"distinct_passages", "questions"}:
        return 0
    if base.startswith("latency") or base in {"hops", "depth"}:
        return 2
    return 3


def shown_value(name: str, values: pd.Series) -> pd.Series:
    """A metric column as the table holds it: cost in dollars per 1,000 questions, rounded."""
    if name.partition("/")[0] == "cost_usd":
        values = values * PER_1K
    return values.round(decimals(name))


def column(name: str) -> Any:
    """How a metric's column reads: a short title, its meaning as help, its rounding."""
    base, _, part = name.partition("/")
    title = SHORT.get(base, base) + (f" · {part.replace('/', ' ')}" if part else "")
    help_text = LONG.get(base, base) + (f", questions of {part}" if part else "")
    number = f"%.{decimals(name)}f"
    if base == "cost_usd":
        number = "$" + number
        help_text = "USD per 1,000 questions (" + help_text + ")"
    return st.column_config.NumberColumn(title, format=number, help=help_text, width="small")


st.title("Runs")
runs = selection.require_runs()
selection.runs_from_url(runs)

left, mid, right = st.columns(3)
datasets = left.multiselect("Dataset", sorted(runs["dataset"].unique()), key="f_dataset")
strategies = mid.multiselect("Strategy", sorted(runs["strategy"].unique()), key="f_strategy")
llms = right.multiselect("LLM", sorted(runs["llm"].unique()), key="f_llm")
first, last = runs["start_time"].min().date(), runs["start_time"].max().date()
left2, right2 = st.columns([1, 2])
dates = left2.date_input("Started between", (first, last), key="f_dates")
tag = right2.text_input(
    "Tag", key="f_tag", placeholder="caprag.experiment=compare (or a tag key that must be set)"
)
since, until = (dates[0], dates[-1]) if isinstance(dates, tuple) and dates else (None, None)
shown = filter_runs(
    runs, datasets=datasets, strategies=strategies, llms=llms, since=since, until=until, tag=tag
)
available = metric_columns(runs)
picked = st.multiselect(
    "Metrics shown",
    available,
    default=[m for m in DEFAULT_METRICS if m in available],
    format_func=lambda m: LONG.get(m, m),
    key="runs_metrics",
    help="Shown right after the run, in this order; per-slice metrics (recall_at_k/cross_book, "
    "recall_at_k/type/bridge) are here too",
)
st.caption(f"{len(shown)} of {len(runs)} runs · tick rows to compare them")
table = shown[["label", *picked, *(c for c in DETAILS if c in shown.columns)]].copy()
for name in picked:
    table[name] = shown_value(name, table[name])
event = st.dataframe(
    table,
    hide_index=True,
    on_select="rerun",
    selection_mode="multi-row",
    key="runs_table",
    column_config={
        "label": st.column_config.TextColumn("run", width=RUN_WIDTH_PX, pinned=True),
        **{name: column(name) for name in picked},
        "start_time": st.column_config.DatetimeColumn("started", format="YYYY-MM-DD HH:mm"),
        "questions": st.column_config.NumberColumn("questions", format="%d"),
    },
)
rows = list(event.selection.rows) if event is not None else []
if rows:
    selection.remember(list(shown.iloc[rows]["run_id"]))
chosen = selection.selected(runs)
selection.share(selection.SELECTED, "runs", chosen)
older = [r for r in chosen if not runs.loc[runs["run_id"] == r, "schema"].notna().all()]
if chosen:
    st.write(f"Selected: {', '.join(runs.set_index('run_id').loc[chosen, 'label'])}")
    if older:
        st.warning(
            f"{len(older)} selected run(s) have no `caprag.schema` tag (an older caprag): "
            "missing metrics show as —."
        )
if st.button("Compare selected", disabled=len(chosen) < 2, help="Choose two or more rows"):
    st.switch_page("views/compare.py", query_params={"runs": chosen})
