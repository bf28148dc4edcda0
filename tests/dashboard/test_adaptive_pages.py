"""The Ask page's adaptive strategy and power, and the Compare page's adaptive savings, deeper
questions and oracle router, through Streamlit's AppTest against real harness runs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from caprag.strategies import STRATEGIES
from experiments.dashboard import data
from experiments.results.tracking import TABLE, mlflow
from experiments.scoring.oracle import oracle_routing
from tests.conftest import FIXTURE_BOOKS
from tests.dashboard.conftest import Store
from tests.dashboard.test_app import PAGES, open_page, texts

IMPOSSIBLE = "How much does a dragon saddle cost in the Pebble Saga?"
"""No passage answers it: in auto mode adaptive goes deeper after its first round."""


def frame_with(at: AppTest, column: str) -> pd.DataFrame:
    """The first dataframe shown with that column."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def table_of(store: Store, run: str) -> pd.DataFrame:
    """A run's per-question table read straight from MLflow (not through the dashboard)."""
    mlflow.set_tracking_uri(store.uri)
    run_id = store.runs[run]
    experiment = mlflow.MlflowClient().get_run(run_id).info.experiment_id
    return mlflow.MlflowClient().load_table(experiment, TABLE, run_ids=[run_id])


@pytest.fixture
def ask_page(harness_store: Store, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> AppTest:
    monkeypatch.setenv("CAPRAG_CORPUS", str(FIXTURE_BOOKS))
    monkeypatch.setenv("CAPRAG_CHROMA_DIR", str(tmp_path / "chroma"))
    monkeypatch.setenv("CAPRAG_K", "2")
    return open_page(PAGES[3], harness_store.uri, monkeypatch)


def ask(at: AppTest, power: str, question: str = IMPOSSIBLE) -> pd.DataFrame:
    """Ask on a new conversation with the power given; the decision log shown."""
    at.button(key="ask_new").click().run()
    at.radio(key="ask_power").set_value(power)
    at.text_area(key="ask_question").set_value(question)
    at.button(key="ask_go").click().run(timeout=180)
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "Decision log" in [s.value for s in at.subheader]
    return at.table[0].value


def test_ask_page_offers_every_strategy_and_its_power_reaches_the_pipeline(
    ask_page: AppTest,
) -> None:
    at = ask_page
    assert set(at.selectbox(key="ask_strategy").options) == set(STRATEGIES)
    assert at.radio(key="ask_power").disabled  # multi-hop: no depth to force
    at.selectbox(key="ask_strategy").set_value("adaptive").run()
    assert not at.radio(key="ask_power").disabled
    assert at.radio(key="ask_power").options == ["auto", "1", "2", "3"]
    assert at.radio(key="ask_power").value == "2"  # the serving default (CAPRAG_POWER)
    logs = {}
    for power in ("1", "3", "auto"):
        logs[power] = ask(at, power)
        said = "power auto" if power == "auto" else f"power {power}: forced depth"
        assert f"adaptive ({said}) · " in texts(at)
    for power in ("1", "3"):
        log = logs[power]
        assert list(log["depth"]) == [int(power)] and list(log["decision"]) == ["forced_depth"]
    assert logs["1"]["chunks"].iloc[0] < logs["3"]["chunks"].iloc[0]  # the power changed it
    auto = logs["auto"]
    assert len(auto) >= 2 and list(auto["depth"]) == sorted(auto["depth"])
    assert auto["depth"].iloc[-1] > auto["depth"].iloc[0]  # it went deeper by itself
    assert "forced_depth" not in set(auto["decision"])
    assert list(auto["decision"])[:-1] == ["increase_depth"] * (len(auto) - 1)
    assert list(auto.columns) == ["round", "depth", "chunks", "confidence", "threshold", "decision"]
    assert auto["confidence"].str.endswith("%").all()
    assert any("below the" in c.value and "threshold" in c.value for c in at.caption)


def test_compare_page_shows_savings_vs_always_deep_and_the_deeper_questions(
    routing_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = routing_store.runs
    at = open_page(
        PAGES[1], routing_store.uri, monkeypatch, selected_runs=[ids["auto"], ids["single"]]
    )
    assert "Adaptive depth: savings vs always deep" in [h.value for h in at.header]
    expected = data.savings_vs_deep(
        table_of(routing_store, "auto"), table_of(routing_store, "deep")
    )
    metrics = {m.label: m.value for m in at.metric}
    assert expected.token_saving is not None and expected.cost_saving is not None
    assert metrics["Prompt tokens saved vs always deep"] == f"{expected.token_saving:.1%}"
    assert metrics["Cost saved vs always deep"] == f"{expected.cost_saving:.1%}"
    shown = texts(at)
    assert ids["deep"][:8] in shown and "not selected, found in the store" in shown
    adaptive, deep = expected.prompt_tokens
    tokens = data.saving_text(expected.token_saving, "prompt tokens")
    assert f"{tokens} · totals: adaptive {adaptive:,.0f}, always deep {deep:,.0f}" in shown
    assert f"over the {expected.questions} questions both answered" in shown

    deeper = data.deeper_questions(table_of(routing_store, "auto"))
    assert not deeper.empty
    listed = at.dataframe(key="deeper_table").value
    assert list(listed["question_id"]) == list(deeper["question_id"])
    assert f"{len(deeper)} of " in shown
    box = at.selectbox(key="deeper_question")
    box.select_index(len(box.options) - 1).run()
    qid = deeper["question_id"].iloc[-1]
    assert f"**Rounds of {qid}**" in texts(at)
    rounds = next(t.value for t in at.table if "decision" in t.value.columns)
    assert len(rounds) == deeper["rounds"].iloc[-1] >= 2
    assert any(s.value == "Hop 2" for s in at.subheader)  # its trace, below
    at.button(key="deeper_open").click().run()
    assert not at.exception
    assert at.title[0].value == "Trace viewer"
    assert at.selectbox(key="trace_run").value == ids["auto"]
    assert any(m.value == f"**Question:** {deeper['question'].iloc[-1]}" for m in at.markdown)


def test_compare_page_says_when_there_is_no_always_deep_run(
    lone_adaptive_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = open_page(
        PAGES[1], lone_adaptive_store.uri, monkeypatch,
        selected_runs=list(lone_adaptive_store.runs.values()),
    )  # fmt: skip
    assert any("No fixed depth-3 run of dataset `cross_book`" in i.value for i in at.info)
    assert not at.metric
    assert list(at.dataframe(key="deeper_table").value["question_id"]) == ["t-2"]
    assert "1 of 2 questions went past their first depth" in texts(at)


def test_compare_page_shows_the_oracle_router_over_the_selected_runs(
    routing_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = routing_store.runs
    at = open_page(PAGES[1], routing_store.uri, monkeypatch, selected_runs=list(ids.values()))
    assert "Oracle routing ceiling" in [h.value for h in at.header]
    shown = frame_with(at, "routed")
    names = {name: next(r for r in shown["run"] if rid[:8] in r) for name, rid in ids.items()}
    tables = {names[name]: table_of(routing_store, name) for name in ids}
    result = oracle_routing(tables, cost="tokens", quality="recall_at_k")
    expected = data.oracle_summary(result)
    assert set(shown["run"]) == set(expected["run"]) and shown["run"].iloc[-1] == "oracle"
    merged = shown.set_index("run").join(expected.set_index("run"), rsuffix="_expected")
    assert (merged["total"] == merged["total_expected"]).all()
    assert (merged["routed"] == merged["routed_expected"]).all()
    assert list(shown["saves"]) == list(data.oracle_display(expected, "tokens")["saves"])
    assert shown["saves"].iloc[-1] == "—"
    assert "oracle_chart" in {e.key for e in at.get("plotly_chart")}
    router = next(m.value for m in at.markdown if m.value.startswith("**Perfect router:**"))
    assert data.oracle_cell(expected["total"].iloc[-1], "tokens", total=True) in router
    at.radio(key="oracle_cost").set_value("cost_usd").run()
    usd = frame_with(at, "routed")
    in_usd = oracle_routing(tables, cost="cost_usd").totals()[-1].total_cost
    assert usd["total"].iloc[-1] == pytest.approx(in_usd)


def test_ask_page_preselects_the_configured_default_power(
    harness_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAPRAG_POWER", "auto")
    monkeypatch.setenv("CAPRAG_CORPUS", str(FIXTURE_BOOKS))
    monkeypatch.setenv("CAPRAG_CHROMA_DIR", str(tmp_path / "chroma"))
    at = open_page(PAGES[3], harness_store.uri, monkeypatch)
    assert at.radio(key="ask_power").value == "auto"
