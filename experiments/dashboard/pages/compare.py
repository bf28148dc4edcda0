"""Compare: metrics, cost vs quality, recall per hop, hop counts; two runs: significance, diff."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from experiments.calibration import reliability
from experiments.dashboard import charts, selection
from experiments.dashboard.data import (
    COST,
    QUALITY,
    Criterion,
    default_comparison,
    metric_table,
    question_diff,
    recall_curve,
    schema_warning,
)
from experiments.dashboard.significance_view import render_significance

st.title("Compare runs")
runs = selection.require_runs()
labels = dict(zip(runs["run_id"], runs["label"], strict=True))
chosen = st.multiselect(
    "Runs",
    list(runs["run_id"]),
    default=selection.selected(runs) or default_comparison(runs),
    format_func=labels.__getitem__,
    key="compare_runs",
)
selection.remember(chosen)
if len(chosen) < 2:
    st.info("Choose two or more runs to compare (here or by ticking rows on the Runs page).")
    st.stop()
picked = runs.set_index("run_id").loc[chosen].reset_index()
for _, run in picked.iterrows():
    warning = schema_warning(run)
    if warning:
        st.warning(warning)

st.header("Metrics")
st.caption("value (questions with a value / all questions) where a metric is not defined for all")
st.table(metric_table(picked))

st.header("Cost vs quality")
c1, c2, c3 = st.columns(3)
cost = c1.radio("Cost", list(COST), format_func=COST.__getitem__, horizontal=True, key="cost")
quality = c2.radio(
    "Quality", list(QUALITY), format_func=QUALITY.__getitem__, horizontal=True, key="quality"
)
scope = c3.radio("Runs shown", ["selected", "all"], horizontal=True, key="scope")
points = picked if scope == "selected" else runs
if {cost, quality} <= set(points.columns) and points[[cost, quality]].notna().all(axis=1).any():
    st.plotly_chart(charts.cost_quality(points, cost, quality, chosen), key="scatter")
else:
    st.info(f"No run here has both `{cost}` and `{quality}` logged.")

st.header("Cumulative gold-passage recall per hop")
curve = recall_curve(picked)
if curve.empty:
    st.info("These runs logged no per-hop recall (recall_hop1…3).")
else:
    st.plotly_chart(charts.recall_per_hop(curve), key="recall_curve")

tables: dict[str, pd.DataFrame] = {}
for _, run in picked.iterrows():
    table = selection.load_questions(run)
    if table is not None:
        tables[str(run["run_id"])] = table

st.header("Hops per question")
hops = [
    pd.DataFrame({"label": labels[rid], "hops": t["hops"]})
    for rid, t in tables.items()
    if "hops" in t.columns
]
if hops:
    st.plotly_chart(charts.hop_histogram(pd.concat(hops).dropna()), key="hop_hist")
else:
    st.info("No per-question hop counts for these runs.")

calibrated = {
    rid: t for rid, t in tables.items() if {"confidence", "context_recall"} <= set(t.columns)
}
if calibrated:
    st.header("Calibration (adaptive confidence)")
    st.caption("confidence bucket vs share of questions whose context held every gold passage")
    frames = []
    for rid, t in calibrated.items():
        ok = t[(t["status"] == "ok") & t["confidence"].notna() & t["context_recall"].notna()]
        table = reliability(ok["confidence"], (ok["context_recall"] == 1.0).astype(float))
        frames.append(table.assign(label=labels[rid]))
    st.plotly_chart(charts.calibration(pd.concat(frames)), key="calibration")

st.header("Per-question diff")
with_tables = [rid for rid in chosen if rid in tables]
if len(with_tables) < 2:
    st.info("The per-question diff needs two runs with a per-question table.")
    st.stop()
a_col, b_col = st.columns(2)
run_a = a_col.selectbox("Run A", with_tables, 0, format_func=labels.__getitem__, key="diff_a")
run_b = b_col.selectbox("Run B", with_tables, 1, format_func=labels.__getitem__, key="diff_b")
by_id = picked.set_index("run_id", drop=False)
render_significance(by_id.loc[run_a], by_id.loc[run_b], labels)

st.subheader("Questions")
k1, k2 = st.columns(2)
RIGHT: dict[Criterion, str] = {"all_gold": "all gold passages in context", "f1": "F1 ≥ threshold"}
criterion: Criterion = k1.radio(
    "Right means", list(RIGHT), format_func=RIGHT.__getitem__, horizontal=True, key="criterion"
)
threshold = k2.slider("F1 threshold", 0.0, 1.0, 0.5, 0.05, key="threshold")
diff = question_diff(tables[run_a], tables[run_b], criterion, threshold)
if diff.empty:
    st.warning("These tables have no `question_id` column (an older schema); cannot match them.")
    st.stop()
f1, f2, f3 = st.columns(3)
outcomes = f1.multiselect(
    "Outcome",
    sorted(diff["outcome"].unique()),
    default=[o for o in ("only A right", "only B right") if o in set(diff["outcome"])],
    key="outcome",
)
sets = f2.multiselect("Set", sorted(diff["set"].astype(str).unique()), key="diff_set")
types = f3.multiselect("Question type", sorted(diff["query_type"].astype(str).unique()), key="qt")
shown = diff[diff["outcome"].isin(outcomes or list(diff["outcome"].unique()))]
if sets:
    shown = shown[shown["set"].astype(str).isin(sets)]
if types:
    shown = shown[shown["query_type"].astype(str).isin(types)]
counts = diff["outcome"].value_counts()
st.caption(
    f"A = {labels[run_a]}, B = {labels[run_b]} · "
    + " · ".join(f"{name}: {n}" for name, n in counts.items())
)
order = ["question_id", "set", "query_type", "outcome", "right_a", "hops_a", "right_b", "hops_b"]
order += ["f1_a", "f1_b", "recall_a", "recall_b", "question"]
st.dataframe(
    shown.sort_values(["outcome", "set", "question_id"])[order],
    hide_index=True,
    key="diff_table",
    column_config={
        "right_a": st.column_config.CheckboxColumn("A right"),
        "right_b": st.column_config.CheckboxColumn("B right"),
        "hops_a": st.column_config.NumberColumn("A hops"),
        "hops_b": st.column_config.NumberColumn("B hops"),
        "question": st.column_config.TextColumn("question", width="large"),
    },
)
