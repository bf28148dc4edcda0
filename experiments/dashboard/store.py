"""MLflow reads for the dashboard, cached per tracking URI (st.cache_data with a TTL)."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import streamlit as st

from caprag.config import load_settings
from experiments.dashboard.data import POWER_PARAM, runs_frame
from experiments.results import tracking
from experiments.results.labels import Label, labels_of
from experiments.results.row import normalised
from experiments.results.tracking import mlflow
from experiments.scoring.failures import Corpus

TTL_S = 60
MLFLOW_UI = "http://127.0.0.1:5000"


def uri() -> str:
    """MLFLOW_TRACKING_URI, else the project's SQLite store."""
    return tracking.tracking_uri()


def ui_base() -> str:
    """Where the MLflow UI runs (CAPRAG_MLFLOW_UI, default http://127.0.0.1:5000)."""
    return os.environ.get("CAPRAG_MLFLOW_UI", MLFLOW_UI).rstrip("/")


def run_url(experiment_id: str, run_id: str, base: str | None = None) -> str:
    """The run's page in the MLflow UI."""
    return f"{(base or ui_base()).rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def trace_url(experiment_id: str, trace_id: str, base: str | None = None) -> str:
    """A trace's page in the MLflow UI: the experiment's trace list with that trace open."""
    return f"{(base or ui_base()).rstrip('/')}/{tracking.trace_route(experiment_id, trace_id)}"


def missing_store(store_uri: str) -> bool:
    """A SQLite store whose file does not exist (read nothing, create nothing)."""
    return (
        store_uri.startswith("sqlite:///")
        and not Path(store_uri.removeprefix("sqlite:///")).exists()
    )


@st.cache_data(ttl=TTL_S, show_spinner="Reading runs from MLflow…")
def runs(store_uri: str) -> pd.DataFrame:
    """Every run of every experiment in the store, one row each (sweep parents left out)."""
    if missing_store(store_uri):
        return runs_frame(pd.DataFrame())
    mlflow.set_tracking_uri(store_uri)
    experiments = [e.experiment_id for e in mlflow.MlflowClient().search_experiments()]
    if not experiments:
        return runs_frame(pd.DataFrame())
    raw = mlflow.search_runs(experiment_ids=experiments, output_format="pandas")
    assert isinstance(raw, pd.DataFrame)
    kept = {POWER_PARAM}  # the one param the pages read: which adaptive runs searched always deep
    raw = raw.drop(columns=[c for c in raw.columns if c.startswith("params.") and c not in kept])
    return runs_frame(raw)


@st.cache_data(ttl=TTL_S, max_entries=64, show_spinner="Loading the per-question table…")
def questions(store_uri: str, experiment_id: str, run_id: str) -> pd.DataFrame | None:
    """The run's per-question table (questions.json; one of schema 1 in the current form, once
    per cache entry), or None when the run has none."""
    mlflow.set_tracking_uri(store_uri)
    client = mlflow.MlflowClient()
    try:
        table = client.load_table(experiment_id, tracking.TABLE, run_ids=[run_id])
    except mlflow.exceptions.MlflowException:
        return None
    return normalised(table)


@st.cache_resource(show_spinner="Reading the books…")
def corpus() -> Corpus:
    """The books the dashboard's settings name (CAPRAG_CORPUS, default the bundled ones): where a
    gold passage no hop returned is (book, page, section, text), and which citations point at
    it. Empty when the folder is not a books folder (a benchmark's passages are not books)."""
    return Corpus.of_folder(load_settings().corpus)


@st.cache_data(ttl=TTL_S, max_entries=64, show_spinner=False)
def labels(
    store_uri: str, experiment_id: str, run_id: str, traces: tuple[tuple[str, str], ...]
) -> dict[str, Label]:
    """The human labels of a run's questions, by question id (`traces`: (case, question id)
    pairs); cleared when a label is saved."""
    mlflow.set_tracking_uri(store_uri)
    return labels_of(experiment_id, run_id, dict(traces))
