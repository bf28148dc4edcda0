"""The dashboard in a real browser: `streamlit run` as a subprocess, driven in Debian's chromium."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from caprag.config import PROJECT_ROOT
from experiments.support.servers import free_port, running
from tests.conftest import FIXTURE_BOOKS
from tests.dashboard.conftest import Store

pytestmark = pytest.mark.browser
APP = PROJECT_ROOT / "experiments" / "dashboard" / "app.py"
SHOTS = PROJECT_ROOT / "reports" / "screenshots"
START_TIMEOUT_S = 600
TEXT_TIMEOUT_MS = 600_000  # only catches a hang: the machine is shared
PICK_WAIT_MS = 5_000  # how long a pick may take to show before it is made again


@contextlib.contextmanager
def dashboard_server(store_uri: str, tmp: Path, **settings: str) -> Iterator[str]:
    """`streamlit run` of the dashboard on a free port against an MLflow store, the Ask page on
    the fixture books (no OpenAI key), with any other settings; yields its URL; always stopped."""
    port = free_port()
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": store_uri,
        "CAPRAG_CORPUS": str(FIXTURE_BOOKS),
        "CAPRAG_CHROMA_DIR": str(tmp / "chroma"),
        "CAPRAG_K": "2",
        **settings,
    }
    env.pop("OPENAI_API_KEY", None)
    command = [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.headless", "true", "--server.address", "127.0.0.1",
        "--server.port", str(port), "--browser.gatherUsageStats", "false",
    ]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    with running(command, f"{base}/_stcore/health", env, tmp / "streamlit.log", START_TIMEOUT_S):
        yield base


@pytest.fixture(scope="module")
def server(harness_store: Store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The dashboard served on a free port against the harness store; always stopped."""
    with dashboard_server(harness_store.uri, tmp_path_factory.mktemp("browser")) as base:
        yield base


def visit(browser: Browser, url: str, wait_for: str, height: int = 1400) -> Page:
    """A fresh page at url, once `wait_for` is visible and Streamlit has finished running."""
    page = browser.new_page(viewport={"width": 1400, "height": height})
    page.goto(url)
    page.get_by_text(wait_for, exact=False).first.wait_for(timeout=TEXT_TIMEOUT_MS)
    settle(page)
    return page


def shown(locator: Locator) -> None:
    """Wait until the locator is visible: a page fills in as its script runs."""
    expect(locator).to_be_visible(timeout=TEXT_TIMEOUT_MS)


def settle(page: Page) -> None:
    """Wait until the script run is over (no running indicator), then a moment for charts."""
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')",
        timeout=TEXT_TIMEOUT_MS,
    )
    page.wait_for_timeout(1000)


def choose(page: Page, box: int | str, typed: str) -> None:
    """Pick the option that matches what is typed in a select box (the box-th on the page, or
    the one with that label), then wait until the box is closed holding it and the script run the
    pick started is over.

    On a busy machine the keys can reach the box before its list is open, and the pick is lost;
    a pick the box does not hold is made again (picking the held option again changes nothing).

    What the box holds is read after it loses focus: while it has focus, its input shows what was
    typed, not the option picked. In Streamlit 1.67 an Enter can close the list without picking
    (seen while a script run re-renders the box, e.g. the one a download button starts): the
    input then still reads the typed text, list closed, while the option held, and sent with the
    next button press, is the old one; on blur the box puts the held option's text back.
    """
    boxes = page.locator("[data-testid='stSelectbox']")
    found = boxes.nth(box) if isinstance(box, int) else boxes.filter(has_text=box).first
    wanted = re.compile(re.escape(typed), re.IGNORECASE)
    deadline = time.monotonic() + TEXT_TIMEOUT_MS / 1000  # a hang guard, not a deadline
    while True:
        found.click()
        page.keyboard.type(typed)
        page.keyboard.press("Enter")
        try:
            held = found.get_by_role("combobox")  # unfocused, its value is the option held
            expect(held).to_have_attribute("aria-expanded", "false", timeout=PICK_WAIT_MS)
            held.blur()
            expect(held).to_have_value(wanted, timeout=PICK_WAIT_MS)
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            page.keyboard.press("Escape")
    settle(page)


def press_until_shown(page: Page, button: Locator, text: str, errors_in: Locator) -> None:
    """Press a button until `text` shows; fail with the error it shows in `errors_in` (where
    the button's own errors go) when it shows one instead.

    On a busy machine a press that lands while a script run is ending can be dropped (Streamlit
    keeps a button's trigger for one run only): when, a moment after the press, no script is
    running and neither the text nor an error shows, it is pressed again. A run in progress is
    waited for (a hang guard only).
    """
    wanted = page.get_by_text(text, exact=False).first
    error = errors_in.locator("[data-testid='stAlert'], [data-testid='stException']")
    running = page.locator("[data-testid='stStatusWidget']")
    deadline = time.monotonic() + TEXT_TIMEOUT_MS / 1000  # a hang guard, not a deadline
    while True:
        button.click()
        try:
            expect(wanted.or_(error.first).or_(running)).to_be_visible(timeout=PICK_WAIT_MS)
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            continue  # nothing started: the press was dropped
        expect(wanted.or_(error.first)).to_be_visible(timeout=TEXT_TIMEOUT_MS)
        if error.count() and not wanted.is_visible():
            raise AssertionError(f"the page shows an error: {error.first.inner_text()}")
        return


def shoot(page: Page, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"dashboard-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def test_runs_page(server: str, browser: Browser, harness_store: Store) -> None:
    page = visit(browser, server, "2 of 2 runs")
    shown(page.get_by_text("Started between"))
    shown(page.locator("[data-testid='stDataFrame']"))
    assert shoot(page, "runs").stat().st_size > 10_000


def test_compare_page(server: str, browser: Browser, harness_store: Store) -> None:
    page = visit(browser, f"{server}/compare", "Per-question diff", height=3600)
    page.locator(".js-plotly-plot").nth(3).wait_for(timeout=TEXT_TIMEOUT_MS)
    assert page.locator(".js-plotly-plot").count() == 4  # with the oracle router's
    table = page.locator("[data-testid='stTable']").first
    shown(table.get_by_text("gold-passage recall@k"))
    shown(table.get_by_text(harness_store.runs["multi-hop"][:8], exact=False))
    shoot(page, "compare")


def test_trace_page(server: str, browser: Browser, harness_store: Store) -> None:
    run_id = harness_store.runs["multi-hop"]
    page = visit(browser, f"{server}/trace", "Hop 1", height=2600)
    choose(page, 0, ":multi-hop:")
    page.get_by_text(run_id).first.wait_for(timeout=TEXT_TIMEOUT_MS)
    settle(page)
    choose(page, 1, "t-cb-1")
    page.get_by_text("What penalty does the second attack of a Flurry suffer?").first.wait_for()
    page.get_by_text("Hop 2", exact=True).wait_for(timeout=TEXT_TIMEOUT_MS)
    settle(page)
    tables = page.locator("[data-testid='stTable']")
    shown(tables.filter(has_text="fighting/flurry").first)
    shown(tables.first.get_by_text("fighting", exact=True).first)
    shown(page.get_by_text("★ gold").first)
    link = page.get_by_role("link", name="Open this run in the MLflow UI")
    assert link.get_attribute("href", timeout=TEXT_TIMEOUT_MS).endswith(f"/runs/{run_id}")
    shoot(page, "trace")


def test_ask_page(server: str, browser: Browser) -> None:
    page = visit(browser, f"{server}/ask", "Type a question and press Ask", height=2200)
    page.get_by_label("Question").fill("What penalty does the second attack of a Flurry suffer?")
    page.get_by_role("button", name="Ask", exact=True).click()
    page.get_by_text("Hop 2", exact=True).wait_for(timeout=TEXT_TIMEOUT_MS)
    settle(page)
    shown(page.get_by_text("Analyzer decision").first)
    shown(page.locator("[data-testid='stTable']").first.get_by_text("fighting").first)
    shoot(page, "ask")


@pytest.mark.parametrize(
    ("path", "wait_for"),
    [("ask", "Type a question and press Ask"), ("decisions", "Decision log"), ("trace", "Hop 1")],
)
def test_a_page_opened_by_its_url_keeps_the_apps_navigation(
    server: str, browser: Browser, path: str, wait_for: str
) -> None:
    """A new session whose first request is a page's URL (a shared link) gets the app's sidebar:
    titled pages and the store caption, not Streamlit's file-name list of a `pages/` folder."""
    page = visit(browser, f"{server}/{path}", wait_for)
    nav = page.locator("[data-testid='stSidebarNav']")
    shown(nav.get_by_role("link", name="Trace viewer"))
    shown(nav.get_by_role("link", name="Decision log"))
    assert not nav.get_by_role("link", name="app", exact=True).count()
    shown(page.get_by_text("MLflow store:"))
