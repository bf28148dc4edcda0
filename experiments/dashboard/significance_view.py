"""The Compare page's Significance section: run B against run A, paired question by question."""

from __future__ import annotations

import pandas as pd
import streamlit as st
from pandas.io.formats.style import Styler

from experiments.dashboard import store
from experiments.scoring.significance import (
    ALPHA,
    MetricComparison,
    PairingError,
    compare_pairing,
    header,
    pair_runs,
    table_rows,
    verdict,
)

HIGHLIGHT = {"B": "background-color: #c8e6c9", "A": "background-color: #ffcdd2"}


@st.cache_data(ttl=store.TTL_S, max_entries=64, show_spinner="Resampling questions…")
def comparison(
    store_uri: str,
    experiment_a: str,
    run_a: str,
    experiment_b: str,
    run_b: str,
    only: tuple[str, ...] = (),
) -> tuple[str, list[MetricComparison]]:
    """How the questions were paired, and every default metric of run B against run A (on the
    questions whose ids are in `only`, when given)."""
    tables = []
    for experiment_id, run_id in ((experiment_a, run_a), (experiment_b, run_b)):
        table = store.questions(store_uri, experiment_id, run_id)
        if table is None or table.empty:
            raise PairingError(f"run {run_id} has no per-question table")
        if only:
            table = table[table["question_id"].astype(str).isin(only)]
        tables.append(table)
    pairing = pair_runs(tables[0], tables[1])
    return pairing.describe(), compare_pairing(pairing)


def significance_table(comparisons: list[MetricComparison]) -> Styler:
    """The comparison table, p < 0.05 highlighted (green where B is better, red where A is)."""
    rows = table_rows(comparisons)
    frame = pd.DataFrame([row[1:] for row in rows], columns=header()[1:])
    if not frame["note"].str.len().any():
        frame = frame.drop(columns="note")
    frame.index = pd.Index([row[0] for row in rows], name="metric")  # the metrics' headings
    better = {row[0]: c.better(ALPHA) for row, c in zip(rows, comparisons, strict=True)}

    def shade(row: pd.Series) -> list[str]:
        return [HIGHLIGHT.get(better[str(row.name)], "")] * len(row)

    return frame.style.apply(shade, axis=1, subset=["B − A", "p"])


def render_significance(
    run_a: pd.Series,
    run_b: pd.Series,
    labels: dict[str, str],
    only: tuple[str, ...] = (),
    scope: str = "",
) -> None:
    """B − A per metric with its 95% CI and p-value, or why the runs cannot be paired; on the
    questions in `only` (described by `scope`) when given."""
    st.subheader("Significance")
    if run_a["run_id"] == run_b["run_id"]:
        st.info("Pick two different runs as A and B to test their difference.")
        return
    try:
        paired, comparisons = comparison(
            store.uri(),
            str(run_a["experiment_id"]),
            str(run_a["run_id"]),
            str(run_b["experiment_id"]),
            str(run_b["run_id"]),
            only,
        )
    except PairingError as exc:
        st.warning(f"Cannot test these runs against each other: {exc}.")
        return
    st.caption(
        f"A = {labels[run_a['run_id']]}, B = {labels[run_b['run_id']]} · "
        + (f"{scope} · " if scope else "")
        + f"{paired}. "
        "B − A is the mean per-question difference; 95% CI from resampling questions (bootstrap); "
        f"p from a two-sided paired sign-flip permutation test; p < {ALPHA:g} highlighted "
        "(green: B better, red: A better)."
    )
    st.table(significance_table(comparisons))
    st.markdown(verdict(comparisons))
