"""The dashboard's Decision log page (issue 19, point 5): the live requests a served pipeline
logged, with feedback, filtered by strategy and feedback, through AppTest and in chromium."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from caprag.config import PROJECT_ROOT
from caprag.retrieval.store import PassageIndex
from caprag.serve.decision_log import DecisionLog
from caprag.serve.services import Pipeline
from caprag.steps import StepResult, rule_steps
from caprag.steps.assess import ConfidenceAssessment
from caprag.strategies import AdaptiveDepthStrategy, MultiHopStrategy
from tests.browsers import launch_chromium
from tests.dashboard.test_browser import choose, dashboard_server

APP = str(PROJECT_ROOT / "experiments" / "dashboard" / "app.py")
PAGE = "views/decisions.py"
HANG_S = 600  # only catches a hang: the machine is shared
SHOTS = PROJECT_ROOT / "reports" / "screenshots"
CROSS_REF = "What penalty does the second attack of a Flurry suffer?"
SIMPLE = "How long does a torch burn?"
OTHER = "What does Old Soldier cost?"


class Unsure:
    """Never confident: adaptive goes through every depth (three rounds to show)."""

    kind = "rule"
    model = "offline"

    async def __call__(
        self, question: str, documents: Any, **_: Any
    ) -> StepResult[ConfidenceAssessment]:
        return StepResult(value=ConfidenceAssessment(confidence=0.4), usage=None)


@dataclasses.dataclass
class Logged:
    path: Path
    ids: dict[str, str]


@pytest.fixture(scope="module")
def logged(fixture_index: PassageIndex, tmp_path_factory: pytest.TempPathFactory) -> Logged:
    """A decision log filled by real turns: adaptive (auto, default) and multi-hop, and feedback
    on two of them."""
    path = tmp_path_factory.mktemp("decisions") / "decisions.db"
    ids: dict[str, str] = {}

    async def fill() -> None:
        steps = dataclasses.replace(rule_steps(), assess=Unsure())
        adaptive = Pipeline(
            AdaptiveDepthStrategy(fixture_index, steps, depth_chunks=(2, 4, 8)),
            steps,
            decision_log=DecisionLog(path),
        )
        ids["auto"] = (await adaptive.ask(CROSS_REF, power=None)).request_id
        ids["forced"] = (await adaptive.ask(SIMPLE, power=2, power_source="default")).request_id
        rules = rule_steps()
        hops = Pipeline(
            MultiHopStrategy(fixture_index, rules, k=2), rules, decision_log=DecisionLog(path)
        )
        ids["multi-hop"] = (await hops.ask(OTHER)).request_id
        await adaptive.feedback(ids["auto"], False, "missed the Old Soldier halving")
        await hops.feedback(ids["multi-hop"], True)

    asyncio.run(fill())
    return Logged(path, ids)


def open_page(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, log: Path | str) -> AppTest:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns.db'}")
    monkeypatch.setenv("CAPRAG_DECISION_LOG", str(log))
    at = AppTest.from_file(APP, default_timeout=HANG_S)
    at.run()
    at.switch_page(PAGE).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def rounds_shown(at: AppTest) -> Any:
    """The detail table of the chosen request's rounds (the one with a `round` column)."""
    return next(d.value for d in at.dataframe if "round" in d.value.columns)


def texts(at: AppTest) -> str:
    parts = [
        e.value for kind in ("markdown", "caption", "subheader", "title") for e in getattr(at, kind)
    ]
    parts += [str(e.value) for kind in ("info", "warning", "error") for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts)


def test_the_page_lists_the_log_with_feedback(
    logged: Logged, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    at = open_page(monkeypatch, tmp_path, logged.path)
    table = at.dataframe(key="decisions_table").value
    assert list(table["request_id"]) == [logged.ids[k] for k in ("multi-hop", "forced", "auto")]
    by_id = table.set_index("request_id")
    auto = by_id.loc[logged.ids["auto"]]
    kept = DecisionLog(logged.path).get(logged.ids["auto"])
    assert kept is not None and kept.final is not None and len(kept.rounds) >= 2
    assert (auto["strategy"], auto["power"], auto["rounds"], auto["depth"]) == (
        "adaptive",
        "auto",
        len(kept.rounds),
        f"{kept.final.depth}/3",
    )
    assert auto["stop"] == kept.stop_reason and auto["feedback"] == "not enough"
    assert auto["comment"] == "missed the Old Soldier halving"
    assert by_id.loc[logged.ids["forced"], "depth"] == "2/3"
    assert by_id.loc[logged.ids["multi-hop"], "feedback"] == "enough"
    assert [m.value for m in at.metric] == ["3", "2", "50%", "0"]
    # the newest request is shown in detail: its rounds
    rounds = rounds_shown(at)
    assert list(rounds["round"]) == [1] and rounds["queries"].iloc[0] >= 1


def test_the_page_filters_by_strategy_and_feedback(
    logged: Logged, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    at = open_page(monkeypatch, tmp_path, logged.path)
    at.selectbox(key="d_strategy").set_value("adaptive").run()
    table = at.dataframe(key="decisions_table").value
    assert set(table["request_id"]) == {logged.ids["auto"], logged.ids["forced"]}
    at.selectbox(key="d_feedback").set_value("not enough").run()
    table = at.dataframe(key="decisions_table").value
    assert list(table["request_id"]) == [logged.ids["auto"]]
    rounds = rounds_shown(at)
    deepened = len(rounds)
    assert deepened >= 2  # never confident: it went deeper
    assert list(rounds["depth"]) == list(range(1, deepened + 1))
    chunks = list(
        rounds["chunks"]
    )  # at most the ladder's; a round that found nothing new adds none
    assert chunks[0] == 2 and chunks == sorted(chunks)
    assert all(c <= n for c, n in zip(chunks, [2, 4, 8], strict=False))
    assert "missed the Old Soldier halving" in texts(at)
    at.selectbox(key="d_feedback").set_value("no feedback").run()
    assert list(at.dataframe(key="decisions_table").value["request_id"]) == [logged.ids["forced"]]
    at.selectbox(key="d_strategy").set_value("multi-hop").run()
    assert "No request matches these filters." in texts(at)


def test_a_missing_log_file_is_a_message(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    at = open_page(monkeypatch, tmp_path, tmp_path / "none" / "decisions.db")
    assert "No request has been logged yet" in texts(at)
    assert not (tmp_path / "none").exists()  # reading never creates the file


@pytest.fixture(scope="module")
def dashboard(logged: Logged, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("decisions-browser")
    store = f"sqlite:///{tmp / 'mlruns.db'}"
    with dashboard_server(store, tmp, CAPRAG_DECISION_LOG=str(logged.path)) as base:
        yield base


@pytest.mark.browser
def test_the_decisions_page_in_chromium(dashboard: str, logged: Logged) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1500})
            page.goto(dashboard)  # the app first: its navigation names the pages
            page.get_by_role("link", name="Decision log").click(timeout=HANG_S * 1000)
            page.get_by_text(f"Request {logged.ids['multi-hop']}").wait_for(timeout=HANG_S * 1000)
            choose(page, 1, "not enough")
            page.get_by_text(f"Request {logged.ids['auto']}").wait_for(timeout=HANG_S * 1000)
            page.get_by_text("missed the Old Soldier halving").first.wait_for(timeout=HANG_S * 1000)
            page.wait_for_function(
                "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')",
                timeout=HANG_S * 1000,
            )
            page.wait_for_timeout(1000)
            kept = DecisionLog(logged.path).get(logged.ids["auto"])
            assert kept is not None
            assert page.get_by_text(f"stopped: {kept.stop_reason}").is_visible()
            SHOTS.mkdir(parents=True, exist_ok=True)
            shot = SHOTS / "dashboard-decisions-not-enough.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
        finally:
            browser.close()
