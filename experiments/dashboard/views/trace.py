"""Trace viewer: one question of one run, hop by hop, with the answer next to the gold."""

from __future__ import annotations

import streamlit as st

from experiments.dashboard import selection, store
from experiments.dashboard.ask_again import render_ask_again, render_beside
from experiments.dashboard.data import schema_warning
from experiments.dashboard.label_view import render_label
from experiments.dashboard.trace_view import render_scores, render_trace, trace_id
from experiments.results.row import GOLD_HOPS, rows_of

st.title("Trace viewer")
runs = selection.require_runs()
selection.seed("trace_run", "run", list(runs["run_id"]))
run = selection.pick_run(runs, key="trace_run")
selection.share("trace_run", "run", run["run_id"])
st.link_button(
    "Open this run in the MLflow UI", store.run_url(str(run["experiment_id"]), str(run["run_id"]))
)
st.caption(
    f"run `{run['run_id']}` · {run['strategy']} · {run['dataset']} · {run['llm']} "
    f"· MLflow UI at {store.ui_base()} (set CAPRAG_MLFLOW_UI to change)"
)
warning = schema_warning(run)
if warning:
    st.warning(warning)
table = selection.load_questions(run)
if table is None:
    st.stop()
missing = [c for c in ("question_id", "question", GOLD_HOPS) if c not in table.columns]
if missing:
    st.warning(
        f"This run's per-question table lacks {', '.join(missing)} (an older schema): "
        "what it has is shown, the rest is left empty."
    )
    table = table.assign(**{c: "" for c in missing if c != "question_id"})
    table["question_id"] = table.get("question_id", table.index.astype(str))
sets = sorted(table["set"].astype(str).unique()) if "set" in table.columns else []
only = st.multiselect("Question set", sets, key="trace_set") if sets else []
rows = table[table["set"].astype(str).isin(only)] if only else table
ids = list(rows.index)
selection.seed("trace_question", "question", ids, text=lambda i: str(rows.at[i, "question_id"]))
question = st.selectbox(
    "Question",
    ids,
    format_func=lambda i: f"{rows.at[i, 'question_id']!s} — {str(rows.at[i, 'question'])[:90]}",
    key="trace_question",
)
if question is None:
    st.info("No question matches the filter.")
    st.stop()
selection.share("trace_question", "question", rows.at[question, "question_id"])
row = rows_of(rows.loc[[question]])[0]
question_trace = trace_id(store.uri(), str(run["experiment_id"]), str(run["run_id"]), row)
if question_trace is not None:
    st.link_button(
        "Open this question's trace in the MLflow UI",
        store.trace_url(str(run["experiment_id"]), question_trace),
    )
else:
    st.caption("This question has no trace in MLflow (the run was logged with traces off).")
corpus = store.corpus()
render_scores(row, corpus)
render_label(run, row, rows)
again = render_ask_again(run, row)
if again is None:
    render_trace(row, corpus)
else:
    render_beside(run, row, again, corpus)
