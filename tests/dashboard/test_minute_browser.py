"""The failure path in Debian's chromium: Compare sliced to cross_book lists each run's worst
questions beside the metrics; one click opens a question's trace in the same tab, with its
failure tags and the gold passages it never retrieved; Back returns to the same slice and runs."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import parse_qs, urlparse

import pytest
from playwright.sync_api import Browser, Page

from tests.dashboard.conftest import Store
from tests.dashboard.test_browser import SHOTS, TEXT_TIMEOUT_MS, dashboard_server, settle, shown
from tests.dashboard.test_slices_browser import wide

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def app(harness_store: Store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The dashboard against two real harness runs (multi-hop, multi-question)."""
    with dashboard_server(harness_store.uri, tmp_path_factory.mktemp("browser-minute")) as base:
        yield base


def shoot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"minute-{name}.png"), full_page=True)


def test_worst_question_opens_its_trace_in_the_same_tab_and_back_returns(
    app: str, browser: Browser, harness_store: Store
) -> None:
    runs = [harness_store.runs["multi-hop"], harness_store.runs["multi-question"]]
    address = f"{app}/compare?runs={runs[0]}&runs={runs[1]}&by=set&slice=cross_book"
    page = wide(browser, address, "Worst questions · question set cross_book", height=1600)
    worst = page.locator("table.worst a.worst")
    shown(worst.first)
    first = (worst.first.text_content() or "").strip()
    assert first.startswith("t-cb-"), first  # only the slice's questions
    assert all((a or "").startswith("t-cb-") for a in worst.all_text_contents())
    shoot(page, "compare-worst")
    opened = len(page.context.pages)
    worst.first.click()  # one click
    page.wait_for_url("**/trace?**", timeout=TEXT_TIMEOUT_MS)
    page.get_by_text("Failure tags", exact=False).first.wait_for(timeout=TEXT_TIMEOUT_MS)
    settle(page)
    assert len(page.context.pages) == opened  # the same tab, no new one
    query = parse_qs(urlparse(page.url).query)
    assert query["question"] == [first] and query["run"][0] in runs, page.url
    shown(page.get_by_text("Gold passages", exact=True).first)
    shoot(page, "trace-from-worst")
    page.go_back()
    page.get_by_text("Worst questions · question set cross_book").wait_for(
        timeout=TEXT_TIMEOUT_MS
    )
    settle(page)
    back = parse_qs(urlparse(page.url).query)
    assert back["runs"] == runs and back["by"] == ["set"] and back["slice"] == ["cross_book"]
    assert urlparse(page.url).path.endswith("/compare")
    page.close()
