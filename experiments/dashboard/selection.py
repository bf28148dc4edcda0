"""Which runs the user is looking at: loaded once per page, shared across pages in the session."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from experiments.dashboard import store

SELECTED = "selected_runs"
EMPTY_STORE = (
    "No runs in this MLflow store yet (`{uri}`). Log some with "
    "`uv run python -m experiments.run -m experiment=compare` (or `make run`), or point "
    "MLFLOW_TRACKING_URI at another store."
)


def require_runs() -> pd.DataFrame:
    """All runs of the store; explains and stops the page when there are none or it fails."""
    uri = store.uri()
    try:
        runs = store.runs(uri)
    except Exception as exc:  # shown, not raised: a dashboard must explain a bad store
        st.error(f"Cannot read the MLflow store `{uri}`: {type(exc).__name__}: {exc}")
        st.stop()
    if runs.empty:
        st.info(EMPTY_STORE.format(uri=uri))
        st.stop()
    return runs


def selected(runs: pd.DataFrame) -> list[str]:
    """Run ids chosen earlier in the session that still exist."""
    chosen = st.session_state.get(SELECTED, [])
    return [r for r in chosen if r in set(runs["run_id"])]


def remember(run_ids: list[str]) -> None:
    """Keep the runs chosen on one page for the others."""
    st.session_state[SELECTED] = list(run_ids)


def pick_run(runs: pd.DataFrame, key: str, label: str = "Run") -> pd.Series:
    """One run from a select box (default: the first one selected in this session)."""
    ids = list(runs["run_id"])
    chosen = selected(runs)
    index = ids.index(chosen[0]) if chosen else 0
    labels = dict(zip(runs["run_id"], runs["label"], strict=True))
    run_id = st.selectbox(label, ids, index=index, format_func=labels.__getitem__, key=key)
    return runs[runs["run_id"] == run_id].iloc[0]


def load_questions(run: pd.Series) -> pd.DataFrame | None:
    """The run's per-question table; explains when it has none."""
    table = store.questions(store.uri(), str(run["experiment_id"]), str(run["run_id"]))
    if table is None or table.empty:
        st.info(
            f"Run {run['run_id']} has no per-question table (`questions.json`): it failed before "
            "any question finished or was logged without traces. Its metrics are on the Runs and "
            "Compare pages."
        )
        return None
    return table
