"""Which runs the user is looking at: loaded once per page, shared across pages in the session."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlencode

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


# Shareable state: what a page shows lives in its URL (st.query_params), so a copied link opens
# the same view. A page seeds its widgets from the URL, then writes their values back.
SEEN = "url_seen"


def seed(
    key: str,
    param: str,
    options: Sequence[Any],
    many: bool = False,
    text: Callable[[Any], str] = str,
) -> None:
    """Set widget `key` from URL parameter `param` when the URL holds a value this session has
    not applied yet (a link just opened); values that are not among `options` are ignored.
    An option is matched by `text(option)`, what `share` wrote for it."""
    values = st.query_params.get_all(param)
    seen: dict[str, list[str]] = st.session_state.setdefault(SEEN, {})
    if not values or seen.get(key) == values:
        return
    seen[key] = values
    by_text = {text(option): option for option in options}
    valid = [by_text[v] for v in values if v in by_text]
    if many:
        st.session_state[key] = valid
    elif valid:
        st.session_state[key] = valid[0]


def share(key: str, param: str, value: Any) -> None:
    """Write a widget's value to URL parameter `param` (a list as repeated parameters; None or
    an empty list removes it)."""
    if value is None:
        values: list[str] = []
    else:
        values = [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]
    if values:
        st.query_params[param] = values
    else:
        st.query_params.pop(param, None)
    st.session_state.setdefault(SEEN, {})[key] = values


def link(page: str, **params: Any) -> str:
    """A relative link to a dashboard page (its url path) with parameters (lists repeated)."""
    pairs = [
        (name, str(v))
        for name, value in params.items()
        for v in (value if isinstance(value, list | tuple) else [value])
        if v is not None
    ]
    return f"{page}?{urlencode(pairs)}" if pairs else page


def runs_from_url(runs: pd.DataFrame) -> None:
    """Adopt the runs a link names (URL parameter `runs`) as the session's selection."""
    seed(SELECTED, "runs", list(runs["run_id"]), many=True)
