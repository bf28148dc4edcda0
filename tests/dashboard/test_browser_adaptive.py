"""The dashboard's adaptive views and oracle router in a real browser: the Ask page with the
adaptive strategy and each power, the savings vs always deep and the questions that needed deeper
search, and the oracle-routing ceiling on the Compare page."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from tests.dashboard.conftest import Store
from tests.dashboard.test_adaptive_pages import IMPOSSIBLE
from tests.dashboard.test_browser import (
    SHOTS,
    TEXT_TIMEOUT_MS,
    choose,
    dashboard_server,
    settle,
    shown,
    visit,
)

pytestmark = pytest.mark.browser
ANSWER_TIMEOUT_MS = 600_000


@pytest.fixture(scope="module")
def server(routing_store: Store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The dashboard on a free port against four real runs (adaptive auto and always deep,
    multi-hop, single) of one sweep; always stopped."""
    with dashboard_server(routing_store.uri, tmp_path_factory.mktemp("browser-adaptive")) as base:
        yield base


@pytest.fixture(scope="module")
def app(server: str, browser: Browser) -> str:
    """The server once its main script has run: until then Streamlit serves a page opened by its
    URL on its own (its file name in the sidebar, none of app.py's navigation or layout)."""
    page = visit(browser, server, "Reload runs")
    page.close()
    return server


def open_page(browser: Browser, url: str, wait_for: str) -> Page:
    """A page of the app (shown inside app.py's navigation, whose sidebar has 'Reload runs')."""
    page = visit(browser, url, wait_for, height=2400)
    shown(page.get_by_role("button", name="Reload runs"))
    return page


def section(page: Page, start: str, end: str, name: str) -> Path:
    """Screenshot the page from header `start` down to header `end` (full width)."""
    top = page.get_by_role("heading", name=start).first
    bottom = page.get_by_role("heading", name=end).first
    top.scroll_into_view_if_needed()
    first, last = top.bounding_box(), bottom.bounding_box()
    assert first is not None and last is not None
    scroll = page.evaluate("() => window.scrollY")
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"dashboard-{name}.png"
    height = last["y"] - first["y"]
    page.screenshot(
        path=str(path),
        full_page=True,
        clip={"x": 0, "y": first["y"] + scroll - 10, "width": 1400, "height": height},
    )
    return path


def decision_log(page: Page) -> Locator:
    """The table under the Ask page's 'Decision log' heading (the first table of the page)."""
    page.get_by_role("heading", name="Decision log").wait_for(timeout=ANSWER_TIMEOUT_MS)
    return page.locator("[data-testid='stTable']").first


def ask(page: Page, power: str) -> Locator:
    """Ask the impossible question afresh at that power; the decision log shown."""
    page.get_by_role("button", name="New conversation").click()
    settle(page)
    page.locator("[data-testid='stRadio']").get_by_text(power, exact=True).click()
    settle(page)
    page.get_by_label("Question").fill(IMPOSSIBLE)
    page.get_by_role("button", name="Ask", exact=True).click()
    said = "power auto" if power == "auto" else f"power {power}: forced depth"
    page.get_by_text(f"adaptive ({said})").wait_for(timeout=ANSWER_TIMEOUT_MS)
    settle(page)
    return decision_log(page)


def rows(table: Locator) -> list[list[str]]:
    """A Streamlit table's body cells, row by row."""
    body = table.locator("tbody tr")
    return [
        [c.strip() for c in body.nth(i).locator("td").all_inner_texts()]
        for i in range(body.count())
    ]


def test_ask_page_runs_adaptive_at_each_power(app: str, browser: Browser) -> None:
    page = open_page(browser, f"{app}/ask", "Type a question and press Ask")
    power = page.locator("[data-testid='stRadio']")
    assert power.locator("input").first.is_disabled()  # multi-hop: nothing to force
    choose(page, "Strategy", "adaptive")
    # enabled by the script run the pick starts (a busy machine may not have begun it yet)
    expect(power.locator("input").first).to_be_enabled(timeout=TEXT_TIMEOUT_MS)
    logs = {p: rows(ask(page, p)) for p in ("1", "3")}
    for forced in ("1", "3"):
        assert len(logs[forced]) == 1, logs[forced]
        round_, depth, *_rest, decision = logs[forced][0]
        assert (round_, depth, decision) == ("1", forced, "forced_depth")
    assert int(logs["1"][0][2]) < int(logs["3"][0][2])  # the power reached the pipeline
    auto = rows(ask(page, "auto"))
    depths = [int(r[1]) for r in auto]  # round, depth, chunks, confidence, threshold, decision
    assert len(auto) >= 2 and depths == sorted(depths) and depths[-1] > depths[0], auto
    assert [r[0] for r in auto] == [str(n) for n in range(1, len(auto) + 1)]  # the rounds
    assert all(r[-1] != "forced_depth" for r in auto) and re.fullmatch(r"\d+%", auto[0][3])
    shown(page.get_by_text("below the").first)
    page.screenshot(path=str(SHOTS / "dashboard-ask-adaptive.png"), full_page=True)


def test_savings_and_deeper_questions_open_their_trace(
    app: str,
    browser: Browser,
    routing_store: Store,
) -> None:
    page = open_page(browser, f"{app}/compare", "Queries that needed deeper search")
    saved = page.locator("[data-testid='stMetric']").filter(has_text="Prompt tokens saved")
    assert re.search(r"-?\d+\.\d%", saved.first.inner_text())
    deep = routing_store.runs["deep"][:8]
    shown(page.get_by_text(f"[{deep}] (adaptive, power 3; selected)"))
    totals = r"\d+\.\d% (fewer|more) prompt tokens · totals: adaptive [\d,]+, always deep [\d,]+"
    shown(page.get_by_text(re.compile(totals)))
    grid = page.locator("[data-testid='stDataFrame']").first
    shown(grid)
    choose(page, "Trace of", "t-ua-1")
    page.get_by_text("Rounds of t-ua-1").wait_for(timeout=TEXT_TIMEOUT_MS)
    rounds = rows(page.locator("[data-testid='stTable']").filter(has_text="increase_depth").first)
    assert len(rounds) >= 2 and int(rounds[-1][1]) > int(rounds[0][1]), rounds
    section(
        page,
        "Adaptive depth: savings vs always deep",
        "Oracle routing ceiling",
        "adaptive-savings-deeper-search",
    )
    page.get_by_role("button", name="Open in the Trace viewer").click()
    page.get_by_role("heading", name="Trace viewer").wait_for(timeout=TEXT_TIMEOUT_MS)
    settle(page)
    shown(page.get_by_text(routing_store.runs["auto"]).first)
    shown(page.get_by_text(f"Question: {IMPOSSIBLE}").first)
    shown(page.get_by_text("Hop 2").first)


def test_oracle_router_beside_each_strategy(
    app: str,
    browser: Browser,
    routing_store: Store,
) -> None:
    page = open_page(browser, f"{app}/compare", "Perfect router:")
    router = page.locator("p").filter(has_text="Perfect router:").first
    assert re.search(r"[\d,]+ tokens at gold-passage recall@k \d\.\d{3}", router.inner_text())
    table = page.locator("[data-testid='stDataFrame']").filter(has_text="oracle").first
    table.scroll_into_view_if_needed()
    shown(table)
    chart = page.locator(".js-plotly-plot").last
    shown(chart.get_by_text("total tokens").first)
    page.locator("[data-testid='stRadio']").filter(has_text="Cost counted").get_by_text(
        "cost", exact=True
    ).click()
    settle(page)
    page.get_by_text(re.compile(r"Perfect router:.*USD at gold-passage recall@k")).wait_for(
        timeout=TEXT_TIMEOUT_MS
    )
    page.locator("[data-testid='stRadio']").filter(has_text="Cost counted").get_by_text(
        "tokens"
    ).click()
    settle(page)
    section(page, "Oracle routing ceiling", "Per-question diff", "oracle-routing")
