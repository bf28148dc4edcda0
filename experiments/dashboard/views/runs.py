"""Runs: all logged runs, filtered by dataset, strategy, LLM, date and tag; pick runs to compare."""

from __future__ import annotations

from typing import Any

import streamlit as st

from experiments.dashboard import selection
from experiments.dashboard.data import filter_runs, metric_choices
from experiments.results import metrics as registry

# The columns after the run and the picked metrics (a bare string here would be shown: magic).
DETAILS = [
    "strategy", "dataset", "llm", "model", "start_time", "status", "sweep", "questions", "run_id",
]  # fmt: skip
DEFAULT_METRICS = ["recall_at_k", "all_gold_at_k", "f1", "hops", "tokens", "cost_usd"]
RUN_WIDTH_PX = 330


def column(name: str) -> Any:
    """How a metric's column reads (experiments.results.metrics): its heading as the title, its
    description and direction as help, its display scale and rounding."""
    metric = registry.get(name)
    about = [metric.description, metric.direction.capitalize()]
    return st.column_config.NumberColumn(
        metric.heading,
        format=metric.format.printf,
        help=" · ".join(a for a in about if a) or None,
    )


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
available = metric_choices(runs)
picked = st.multiselect(
    "Metrics shown",
    available,
    default=[m for m in DEFAULT_METRICS if m in available],
    format_func=lambda m: registry.get(m).heading,
    key="runs_metrics",
    help="Shown right after the run, in this order; per-slice metrics (recall_at_k/cross_book, "
    "recall_at_k/type/bridge) are here too",
)
st.caption(f"{len(shown)} of {len(runs)} runs · tick rows to compare them")
table = shown[["label", *picked, *(c for c in DETAILS if c in shown.columns)]].copy()
for name in picked:
    metric = registry.get(name)
    table[name] = metric.scaled(table[name]).round(metric.format.decimals)
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
