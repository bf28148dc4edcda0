"""The Significance section (Regressions page) through AppTest: real harness runs and synthetic
ones."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from experiments.dashboard.significance_view import HIGHLIGHT
from experiments.results.tracking import TABLE, mlflow, use_experiment
from experiments.scoring.significance import compare_runs, table_rows
from tests.dashboard.conftest import Store
from tests.dashboard.test_app import open_page, texts
from tests.unit.test_significance import TAGS, synthetic_pair

REGRESSIONS = "views/regressions.py"
CI = re.compile(r"^\[-?\$?\d+\.\d+, -?\$?\d+\.\d+\]$")  # cost: "[-$0.012, $0.030]"


def significance_table(at: AppTest) -> pd.DataFrame:
    """The table under the Significance subheader (the only one with a CI column)."""
    return next(t.value for t in at.table if "95% CI" in t.value.columns)


def highlighted(at: AppTest) -> dict[str, str]:
    """Metric → 'A' or 'B' for the rows whose cells carry that side's highlight colour."""
    table = next(t for t in at.table if "95% CI" in t.value.columns)
    metrics = list(table.value.index)
    marked = {}
    for rule in table.proto.arrow_data.styler.styles.splitlines():  # "#T_x_row0_col2, … { css }"
        selectors, _, css = rule.partition("{")
        side = next(s for s, style in HIGHLIGHT.items() if style.split(": ")[1] in css)
        marked.update({metrics[int(r)]: side for r in re.findall(r"_row(\d+)_col", selectors)})
    return marked


def test_significance_of_two_harness_runs_matches_the_logged_tables(
    harness_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    hop, question = harness_store.runs["multi-hop"], harness_store.runs["multi-question"]
    at = open_page(REGRESSIONS, harness_store.uri, monkeypatch)
    at.selectbox(key="diff_a").set_value(hop).run()
    at.selectbox(key="diff_b").set_value(question).run()
    assert not at.exception
    assert "Significance" in [s.value for s in at.subheader]
    shown = significance_table(at)
    client = mlflow.MlflowClient(harness_store.uri)
    # load_table searches runs through the process-wide tracking URI, not the client's.
    monkeypatch.setattr(mlflow.tracking._tracking_service.utils, "_tracking_uri", harness_store.uri)
    a, b = (
        client.load_table(client.get_run(r).info.experiment_id, TABLE, run_ids=[r])
        for r in (hop, question)
    )
    expected = table_rows(compare_runs(a, b))
    assert list(shown.index) == [row[0] for row in expected]
    assert {"gold-passage recall@k", "token F1", "tokens", "hops"} <= set(shown.index)
    assert shown.reset_index().astype(str).values.tolist() == [
        row[: len(shown.columns) + 1] for row in expected
    ]
    assert all(CI.match(cell) or cell == "—" for cell in shown["95% CI"])
    caption = texts(at)
    assert f"{len(a)} questions paired; 0 only in A, 0 only in B" in caption
    assert "At p < 0.05" in caption

    # The test follows the set filter: paired on the cross_book questions only.
    at.multiselect(key="reg_set").set_value(["cross_book"]).run()
    cross = a[a["set"] == "cross_book"]
    on_cross = table_rows(compare_runs(cross, b[b["set"] == "cross_book"]))
    assert significance_table(at).reset_index().astype(str).values.tolist() == [
        row[: len(shown.columns) + 1] for row in on_cross
    ]
    caption = texts(at)
    assert f"on the {len(cross)} questions the set, type and tag filters keep" in caption
    assert f"{len(cross)} questions paired" in caption


@pytest.fixture(scope="module")
def synthetic_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """Three runs of the same 60 questions: a baseline, one clearly better, and a copy."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('significance') / 'mlruns.db'}"
    experiment = use_experiment(uri, "caprag")
    a, b = synthetic_pair(n=60, shift=0.1, repeats=2, seed=4)
    ids = {}
    for name, rows in (("baseline", a), ("better", b), ("copy", a)):
        with mlflow.start_run(experiment_id=experiment, run_name=name, tags=TAGS) as run:
            mlflow.log_metrics({"questions": 60.0, "f1": float(rows["f1"].mean())})
            mlflow.log_table(rows, artifact_file=TABLE)
            ids[name] = run.info.run_id
    return Store(uri, ids)


def test_significance_highlights_a_clear_gain_and_not_a_copy(
    synthetic_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = synthetic_store.runs
    at = open_page(REGRESSIONS, synthetic_store.uri, monkeypatch, selected_runs=list(runs.values()))
    at.selectbox(key="diff_a").set_value(runs["baseline"]).run()
    at.selectbox(key="diff_b").set_value(runs["better"]).run()
    table = significance_table(at)
    assert list(table.index) == ["gold-passage recall@k", "token F1", "tokens"]
    assert table.loc["token F1", "p"] == "<0.001" and table.loc["token F1", "n"] == "60"
    low, high = (float(x) for x in table.loc["token F1", "95% CI"].strip("[]").split(", "))
    assert 0.0 < low < 0.1 < high
    assert highlighted(at) == {"gold-passage recall@k": "B", "token F1": "B", "tokens": "A"}
    assert "B better on gold-passage recall@k, token F1; A better on tokens" in texts(at)

    at.selectbox(key="diff_b").set_value(runs["copy"]).run()
    table = significance_table(at)
    assert set(table["p"]) == {"1.000"} and set(table["B − A"]) == {"0.000", "0.0"}
    assert highlighted(at) == {}

    at.selectbox(key="diff_b").set_value(runs["baseline"]).run()
    assert not at.exception
    assert any("Pick two different runs" in i.value for i in at.info)
