"""A human label on a logged question: why it failed (a failure tag or free text), stored with
the run as MLflow human feedback on the question's trace, and the question exported with it."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from experiments.dashboard import store
from experiments.dashboard.trace_view import trace_id
from experiments.results.labels import log_label
from experiments.results.row import QuestionRow, rows_of
from experiments.results.traces import case_of
from experiments.scoring import regressions as reg
from experiments.scoring.failures import TAGS

OWN_WORDS = "other (in my words)"


def trace_pairs(table: pd.DataFrame) -> tuple[tuple[str, str], ...]:
    """(case, question id) of every row of a run's table: the case its trace is tagged with."""
    return tuple((case_of(row), row.question_id) for row in rows_of(table))


def render_label(run: pd.Series, row: QuestionRow, table: pd.DataFrame) -> None:
    """The question's human label, a form to give one, and the question with it as a dataset."""
    run_id, experiment = str(run["run_id"]), str(run["experiment_id"])
    known = store.labels(store.uri(), experiment, run_id, trace_pairs(table))
    label = known.get(row.question_id)
    with st.expander(
        f"Human label: {label.text()}" if label else "Label this question (why it failed)",
        expanded=False,  # the trace and its missing gold passages come first
    ):
        if label:
            st.caption(f"by {label.by or '?'} · stored on this question's trace in MLflow")
        with st.form(key="label_form", clear_on_submit=True):
            reason = st.selectbox("Reason", [*TAGS, OWN_WORDS], key="label_reason")
            note = st.text_input("Note (or the reason, in your words)", key="label_note")
            by = st.text_input("Your name", key="label_by")
            saved = st.form_submit_button("Save label")
        if saved:
            words = note.strip()
            chosen = words if reason == OWN_WORDS else reason
            if not chosen:
                st.error("Write the reason in the note, or pick one from the list.")
            else:
                question_trace = trace_id(store.uri(), experiment, run_id, row)
                try:
                    if question_trace is None:
                        raise LookupError("this question has no trace (run logged with traces off)")
                    log_label(
                        question_trace,
                        run_id,
                        chosen,
                        note="" if reason == OWN_WORDS else words,
                        by=by,
                    )
                except Exception as exc:  # shown: e.g. the run was logged without traces
                    st.error(f"Could not store the label: {type(exc).__name__}: {exc}")
                else:
                    store.labels.clear()
                    st.rerun()
    if label:
        frame = table[table["question_id"].astype(str) == row.question_id].copy()
        frame["gold_ids"] = pd.Series([r.gold_ids for r in rows_of(frame)], index=frame.index)
        item = reg.as_dataset(frame, {row.question_id: label.text()})
        st.download_button(
            "Export this question with its label",
            reg.to_jsonl(item),
            file_name=f"{row.question_id}.jsonl",
            mime="application/jsonl",
            key="label_export",
            disabled=not item,
        )
