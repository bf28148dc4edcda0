"""Runs: all logged runs, filtered by dataset, strategy, LLM, date and tag; pick runs to compare."""

from __future__ import annotations

import streamlit as st

from experiments.dashboard import selection
from experiments.dashboard.data import filter_runs

SHOWN = [
    "label", "strategy", "dataset", "llm", "model", "start_time", "status", "sweep",
    "questions", "recall_at_k", "all_gold_at_k", "f1", "hops", "tokens", "cost_usd", "run_id",
]  # fmt: skip

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
st.caption(f"{len(shown)} of {len(runs)} runs · tick rows to compare them")
event = st.dataframe(
    shown[[c for c in SHOWN if c in shown.columns]],
    hide_index=True,
    on_select="rerun",
    selection_mode="multi-row",
    key="runs_table",
    column_config={
        "label": st.column_config.TextColumn("run", width="medium"),
        "start_time": st.column_config.DatetimeColumn("started", format="YYYY-MM-DD HH:mm"),
        "cost_usd": st.column_config.NumberColumn("USD / q", format="%.6f"),
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
    st.switch_page("pages/compare.py", query_params={"runs": chosen})
