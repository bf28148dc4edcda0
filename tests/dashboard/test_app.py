"""Every dashboard page through Streamlit's AppTest, against stores filled by real harness runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from caprag.config import PROJECT_ROOT
from caprag.steps import ROLES
from experiments.harness.run import run
from experiments.results.row import QuestionRow
from experiments.results.tracking import mlflow
from experiments.scoring.failures import ANSWER_F1
from tests.conftest import FIXTURE_BOOKS
from tests.dashboard.conftest import REPLY, SYSTEM_PROMPT, USER_PROMPT, Store

APP = str(PROJECT_ROOT / "experiments" / "dashboard" / "app.py")
HANG_S = 600  # only catches a hang: the machine is shared
PAGES = ["views/runs.py", "views/compare.py", "views/trace.py", "views/ask.py"]


def open_page(page: str, uri: str, monkeypatch: pytest.MonkeyPatch, **state: object) -> AppTest:
    """The app pointed at a store, on one page, after its first script pass."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    at = AppTest.from_file(APP, default_timeout=HANG_S)
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    if page != PAGES[0]:
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest) -> str:
    """Everything the page wrote as text, for assertions on what a user reads."""
    parts = [
        e.value
        for kind in ("markdown", "caption", "subheader", "header", "title")
        for e in getattr(at, kind)
    ]
    parts += [str(e.value) for kind in ("info", "warning", "error") for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts)


def select_question(at: AppTest, question_id: str) -> AppTest:
    """Choose a question of the trace viewer by its id."""
    box = at.selectbox(key="trace_question")
    position = next(i for i, o in enumerate(box.options) if o.startswith(f"{question_id} "))
    return box.select_index(position).run()


def test_runs_page_lists_and_filters_runs(harness_store: Store, monkeypatch) -> None:
    at = open_page(PAGES[0], harness_store.uri, monkeypatch)
    assert "2 of 2 runs" in texts(at)
    table = at.dataframe(key="runs_table").value
    assert set(table["run_id"]) == set(harness_store.runs.values())  # the sweep parent is left out
    assert set(table["strategy"]) == {"multi-hop", "multi-question"}
    at.multiselect(key="f_strategy").set_value(["multi-hop"]).run()
    assert "1 of 2 runs" in texts(at)
    assert list(at.dataframe(key="runs_table").value["run_id"]) == [harness_store.runs["multi-hop"]]
    at.multiselect(key="f_strategy").set_value([]).run()
    at.text_input(key="f_tag").set_value("caprag.llm=openai").run()
    assert "0 of 2 runs" in texts(at)
    at.text_input(key="f_tag").set_value("caprag.dataset_hash").run()
    assert "2 of 2 runs" in texts(at)


def test_runs_page_hands_the_selection_to_compare(harness_store: Store, monkeypatch) -> None:
    chosen = list(harness_store.runs.values())
    at = open_page(PAGES[0], harness_store.uri, monkeypatch, selected_runs=chosen)
    assert "Selected: " in texts(at)
    at.main.button[0].click().run()
    assert at.title[0].value == "Compare runs" and not at.exception
    assert at.multiselect(key="compare_runs").value == chosen


def test_compare_page_shows_metrics_plots_and_diff(harness_store: Store, monkeypatch) -> None:
    at = open_page(PAGES[1], harness_store.uri, monkeypatch)
    hop, question = harness_store.runs["multi-hop"], harness_store.runs["multi-question"]
    assert set(at.multiselect(key="compare_runs").value) == {hop, question}  # the latest sweep
    metrics = at.table[0].value
    mlflow.set_tracking_uri(harness_store.uri)
    recall = mlflow.get_run(hop).data.metrics["recall_at_k"]
    hop_column = next(c for c in metrics.columns if hop[:8] in c)
    assert metrics.loc["gold-passage recall@k", hop_column].startswith(f"{recall:.3f} (")
    assert metrics.loc["hops", hop_column] != "—"
    charts = {e.key for e in at.get("plotly_chart")}
    assert {"scatter", "recall_curve", "hop_hist"} <= charts
    assert [h.value for h in at.header] == [
        "Metrics", "Cost vs quality", "Cumulative gold-passage recall per hop",
        "Hops per question", "Oracle routing ceiling", "Per-question diff",
    ]  # fmt: skip
    link = next(e for e in at.get("page_link") if "Regressions" in e.proto.label)
    assert link.proto.page.endswith("regressions")
    assert not at.exception


FROM_TRACE = ["Label this question ", "Ask again with other settings"]
"""The Trace viewer's expanders above the trace: a human label, the question asked again."""


def test_trace_viewer_shows_hops_answer_and_gold(harness_store: Store, monkeypatch) -> None:
    hop_run = harness_store.runs["multi-hop"]
    at = open_page(PAGES[2], harness_store.uri, monkeypatch, selected_runs=[hop_run])
    assert at.selectbox(key="trace_run").value == hop_run
    at = select_question(at, "t-cb-1")
    shown = texts(at)
    assert "What penalty does the second attack of a Flurry suffer?" in shown
    subheaders = [s.value for s in at.subheader]
    assert "Hop 1" in subheaders and "Hop 2" in subheaders and "Answer" in subheaders
    assert "Analyzer decision" in shown and "New queries" in shown
    first_hop = at.table[0].value
    assert {"book", "page", "score", "seen", "gold"} <= set(first_hop.columns)
    assert "fighting" in set(first_hop["book"])
    assert "★ gold" in set(first_hop["gold"])
    assert "4, halved for an Old Soldier" in shown  # the gold answer
    scores = next(m.value for m in at.markdown if m.value.startswith("**Scores:**"))
    assert "gold-passage recall@k **1.000**" in scores  # multi-hop found both gold passages
    # retrieval went right (its hop-2 query "Old Soldier" follows a passage hop 1 retrieved, no
    # drift); the offline extractive reader's answer misses the gold answer's words
    mlflow.set_tracking_uri(harness_store.uri)
    table = mlflow.load_table("questions.json", run_ids=[hop_run])
    f1 = float(table.set_index("question_id").at["t-cb-1", "f1"])
    expected = ["**Failure tags:** answer missed"] if f1 < ANSWER_F1 else []
    assert [w.value for w in at.warning] == expected
    gold = at.table[-1].value
    assert set(gold["passage"]) == {"fighting/flurry", "gifts/old-soldier"}
    link = at.get("link_button")[0]
    assert link.proto.url.endswith(f"/runs/{hop_run}") and "#/experiments/" in link.proto.url
    opened = [e.label.split("(")[0] for e in at.expander]
    assert opened == [*FROM_TRACE, "LLM calls "]  # no call to open
    assert "rule: no call sent" in texts(at) and "by gpt" not in texts(at)  # offline: all rule
    at = select_question(at, "t-fu-1-2")  # a follow-up: its rewrite is shown
    assert "Rewritten as:" in texts(at)


def test_trace_viewer_shows_a_questions_failure_tags(harness_store: Store, monkeypatch) -> None:
    from experiments.dashboard import trace_view

    seen: list[str] = []

    def tags(row: QuestionRow, **_: object) -> list[str]:
        seen.append(row.question_id)
        return ["analyzer stopped early", "timeout"]

    monkeypatch.setattr(trace_view, "failure_tags", tags)
    at = open_page(PAGES[2], harness_store.uri, monkeypatch)
    at = select_question(at, "t-cb-2")
    assert seen[-1] == "t-cb-2"  # computed from the row shown
    assert [w.value for w in at.warning] == ["**Failure tags:** analyzer stopped early, timeout"]


def test_ask_page_answers_live_with_the_same_trace(
    harness_store: Store, monkeypatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CAPRAG_CORPUS", str(FIXTURE_BOOKS))
    monkeypatch.setenv("CAPRAG_CHROMA_DIR", str(tmp_path / "chroma"))
    monkeypatch.setenv("CAPRAG_K", "2")  # as in the harness runs: the cross-reference needs hop 2
    at = open_page(PAGES[3], harness_store.uri, monkeypatch)
    assert at.selectbox(key="ask_llm").options == ["offline"]  # no OPENAI_API_KEY here
    at.selectbox(key="ask_strategy").set_value("multi-hop")
    at.text_area(key="ask_question").set_value(
        "What penalty does the second attack of a Flurry suffer?"
    )
    at.button(key="ask_go").click().run(timeout=HANG_S)
    assert not at.exception and not at.error, [e.value for e in at.error]
    subheaders = [s.value for s in at.subheader]
    assert subheaders[:4] == ["Conversation · 1 turn(s)", "Trace of turn 1", "Hop 1", "Hop 2"]
    assert "Answer" in subheaders
    assert "multi-hop · 2 hop(s)" in texts(at) or "multi-hop · 3 hop(s)" in texts(at)
    assert "fighting" in set(at.table[0].value["book"])
    sources = at.table[-1].value
    assert "section" in sources.columns and sources["section"].str.len().gt(0).all()


def test_trace_viewer_shows_the_llm_calls_on_demand(calls_store: Store, monkeypatch) -> None:
    run_id = calls_store.runs["calls"]
    at = open_page(PAGES[2], calls_store.uri, monkeypatch, selected_runs=[run_id])
    at = select_question(at, "t-cb-1")
    assert not at.exception
    outer = at.expander[len(FROM_TRACE)]
    assert outer.label == "LLM calls (2)" and not outer.proto.expanded  # collapsed
    shown = texts(at)
    assert "**Steps:** analyze by gpt-4o-mini · generate by rule" in shown
    lines = [m.value for m in outer.markdown if m.value[:3] in ("1. ", "2. ")]
    assert lines[0].startswith("1. **analyze** · model `gpt-4o-mini` · 412 + 37 tokens")
    assert "2 attempts" in lines[0] and "dropped 1 query longer than 300 characters" in lines[0]
    assert lines[1].startswith("2. **generate** · rule: no call sent")
    inner = at.expander[len(FROM_TRACE) + 1]
    assert inner.label == "1. analyze · gpt-4o-mini: messages and reply"
    assert [c.value for c in inner.code] == [
        SYSTEM_PROMPT,
        USER_PROMPT + "[fighting/flurry] Flurry: two attacks.",
        REPLY,
    ]  # verbatim: newlines, *, $ and backticks untouched
    assert [m.value for m in inner.markdown] == ["**system**", "**user**", "**reply**"]
    assert len(at.expander) == len(FROM_TRACE) + 2  # the rule call has nothing to open
    assert at.subheader[0].value == "Hop 1" and "Flurry" in set(at.table[0].value["section"])


def test_a_run_logged_before_whole_rows_opens_in_the_trace_viewer(
    legacy_store: Store, monkeypatch
) -> None:
    run_id = legacy_store.runs["legacy"]
    at = open_page(PAGES[2], legacy_store.uri, monkeypatch, selected_runs=[run_id])
    # schema 1: read through the adapter, no warning but the question's own failure tags
    assert all(w.value.startswith("**Failure tags:**") for w in at.warning), at.warning
    assert at.selectbox(key="trace_question").index == 0  # cb-a-001, multi-hop with a model
    shown = texts(at)
    assert [h.value for h in at.subheader[:3]] == ["Hop 1", "Hop 2", "Hop 3"]
    assert "**Steps:** analyze by rule · generate by stub-model" in shown
    first = at.table[0].value.set_index("passage")
    assert first.loc["talents/trained-by-a-veteran", ["section", "gold"]].tolist() == [
        "Trained by a Veteran",
        "★ gold",
    ]
    assert "Steel and Sinew" in shown  # a passage's text, kept in the table's trace
    follow_up = select_question(at, "fu-001-2")
    assert "**Steps:** rewrite by stub-model · analyze by rule" in texts(follow_up)
    adaptive = at.selectbox(key="trace_question").select_index(3).run()  # adaptive's cb-a-001
    assert "**Adaptive:** depth 1/3" in texts(adaptive)
    failed = select_question(at, "sb-core-001")
    assert "This question failed: timed out after 0.001s" in texts(failed)


def test_ask_page_chooses_rule_or_model_per_step(
    harness_store: Store, monkeypatch, tmp_path
) -> None:
    monkeypatch.setenv("CAPRAG_CORPUS", str(FIXTURE_BOOKS))
    monkeypatch.setenv("CAPRAG_CHROMA_DIR", str(tmp_path / "chroma"))
    at = open_page(PAGES[3], harness_store.uri, monkeypatch)
    assert "adaptive" in at.selectbox(key="ask_strategy").options
    for role in ROLES:
        box = at.selectbox(key=f"ask_step_{role}")
        assert box.label == role and box.value == "auto"
        assert box.options == ["auto", "rule", "llm (needs openai)"]
    at.selectbox(key="ask_strategy").set_value("adaptive")
    at.selectbox(key="ask_step_generator").set_value("rule")
    at.text_area(key="ask_question").set_value(
        "What penalty does the second attack of a Flurry suffer?"
    )
    at.button(key="ask_go").click().run(timeout=HANG_S)
    assert not at.exception and not at.error, [e.value for e in at.error]
    shown = texts(at)
    assert "steps chosen: " + " ".join(f"{role}=rule" for role in ROLES) in shown
    steps = next(m.value for m in at.markdown if m.value.startswith("**Steps:** "))
    ran = steps.removeprefix("**Steps:** ").split(" · ")
    assert ran and all(s.endswith(" by rule") for s in ran), steps
    assert {"classify by rule", "generate by rule"} <= set(ran)  # adaptive classifies first
    calls = next(e for e in at.expander if e.label.startswith("LLM calls ("))
    lines = [m.value for m in calls.markdown]
    assert calls.label == f"LLM calls ({len(lines)})"
    assert all("rule: no call sent" in line for line in lines) and not at.code
    at.selectbox(key="ask_step_analyzer").set_value("llm").run()
    assert not at.exception
    assert [e.value for e in at.error] == [
        "ConfigError: CAPRAG_ANALYZER=llm needs a language model: set CAPRAG_LLM=openai"
    ]
    assert "choose the openai LLM backend" in texts(at) and at.button(key="ask_go").disabled


def test_ask_page_rejects_an_empty_question(harness_store: Store, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("CAPRAG_CORPUS", str(FIXTURE_BOOKS))
    monkeypatch.setenv("CAPRAG_CHROMA_DIR", str(tmp_path / "chroma"))
    at = open_page(PAGES[3], harness_store.uri, monkeypatch)
    at.button(key="ask_go").click().run(timeout=HANG_S)
    assert not at.exception
    assert "the question is empty" in at.error[0].value
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    assert open_page(PAGES[3], harness_store.uri, monkeypatch).selectbox(key="ask_llm").options == [
        "offline",
        "openai",
    ]


@pytest.mark.parametrize("page", PAGES[:3])
def test_empty_store_says_so_on_every_page(page: str, empty_store: str, monkeypatch) -> None:
    at = open_page(page, empty_store, monkeypatch)
    assert "No runs in this MLflow store yet" in at.info[0].value


def test_missing_store_file_says_so_and_creates_nothing(tmp_path: Path, monkeypatch) -> None:
    at = open_page(PAGES[0], f"sqlite:///{tmp_path / 'absent.db'}", monkeypatch)
    assert "No runs in this MLflow store yet" in at.info[0].value
    assert not (tmp_path / "absent.db").exists()


def test_run_without_questions_table_is_explained(odd_store: Store, monkeypatch) -> None:
    run_id = odd_store.runs["no-table"]
    at = open_page(PAGES[2], odd_store.uri, monkeypatch, selected_runs=[run_id])
    assert any(f"Run {run_id} has no per-question table" in i.value for i in at.info)
    at = open_page(
        PAGES[1], odd_store.uri, monkeypatch, selected_runs=list(odd_store.runs.values())
    )
    assert any("has no per-question table" in i.value for i in at.info)
    at = open_page(
        "views/regressions.py", odd_store.uri, monkeypatch,
        selected_runs=list(odd_store.runs.values()),
    )  # fmt: skip
    assert any(f"Run {run_id} has no per-question table" in i.value for i in at.info)


def test_older_schema_run_is_flagged_not_crashed(odd_store: Store, monkeypatch) -> None:
    run_id = odd_store.runs["old"]
    at = open_page(PAGES[2], odd_store.uri, monkeypatch, selected_runs=[run_id])
    warnings = " ".join(w.value for w in at.warning)
    assert f"Run {run_id} has no `caprag.schema` tag" in warnings
    assert "lacks gold_hops" in warnings
    assert "Old question one?" in texts(at) and "No hop trace was recorded" in texts(at)
    assert "LLM calls: not recorded" in texts(at)  # no `calls` column in an older table
    at = open_page(PAGES[0], odd_store.uri, monkeypatch)
    table = at.dataframe(key="runs_table").value
    assert table.set_index("run_id").loc[run_id, "dataset"] == "?"
    at = open_page(
        PAGES[1], odd_store.uri, monkeypatch, selected_runs=list(odd_store.runs.values())
    )
    assert any("no `caprag.schema` tag" in w.value for w in at.warning)
    assert at.table[0].value.loc["gold-passage recall@k"].tolist().count("—") == 1


@pytest.fixture(scope="module")
def adaptive_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """A real adaptive run (confidence, depth, decisions in its trace)."""
    from tests.integration.test_harness import make_cfg

    tmp = tmp_path_factory.mktemp("adaptive")
    ids = {}
    for power in ("auto", "3"):
        cfg = make_cfg(
            tmp,
            "dataset=all",
            "strategy=adaptive",
            f"strategy.power={power}",
            "tracking.traces=false",
        )
        result = run(cfg)
        assert result.run_id is not None
        ids[power] = result.run_id
    return Store(f"sqlite:///{tmp / 'mlruns.db'}", ids)


def test_adaptive_run_shows_calibration_and_decision_log(
    adaptive_store: Store, monkeypatch
) -> None:
    run_id = adaptive_store.runs["auto"]
    both = list(adaptive_store.runs.values())
    at = open_page(PAGES[1], adaptive_store.uri, monkeypatch, selected_runs=both)
    assert "calibration" in {e.key for e in at.get("plotly_chart")}
    assert "Calibration (adaptive confidence)" in [h.value for h in at.header]
    at = open_page(PAGES[2], adaptive_store.uri, monkeypatch, selected_runs=[run_id])
    at = select_question(at, "t-sb-1")
    shown = texts(at)
    assert "**Adaptive:** depth 1/3" in shown and "confidence" in shown and "threshold" in shown
