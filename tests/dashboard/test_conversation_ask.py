"""The dashboard's Ask page in chromium shows the whole conversation: every turn with what it was
searched as and its sources, above the latest turn's trace; New conversation starts empty."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.browsers import launch_chromium
from tests.dashboard.test_browser import SHOTS, choose, dashboard_server, settle

pytestmark = pytest.mark.browser
WAIT_MS = 600_000  # only catches a hang: the machine is shared


def ask(page: Page, question: str, turns: int) -> None:
    page.get_by_label("Question").fill(question)
    page.get_by_role("button", name="Ask", exact=True).click()
    page.get_by_text(f"Conversation · {turns} turn(s)").wait_for(timeout=WAIT_MS)
    settle(page)


def test_follow_ups_show_the_earlier_turns_with_what_they_searched_as(
    empty_store: str, tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    with (
        dashboard_server(empty_store, tmp_path, CAPRAG_RETRIEVER="bm25") as base,
        sync_playwright() as p,
    ):
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1400, "height": 2000})
        page.goto(f"{base}/ask")
        page.get_by_text("Type a question and press Ask").wait_for(timeout=WAIT_MS)
        ask(page, "What does Old Soldier cost?", 1)
        ask(page, "What penalty does it halve?", 2)
        body = page.locator("body")
        expect(body).to_contain_text("Turn 1: What does Old Soldier cost?")
        expect(body).to_contain_text("searched as: What does Old Soldier cost?")
        expect(body).to_contain_text("Turn 2: What penalty does it halve?")
        expect(body).to_contain_text("searched as: What penalty does Old Soldier halve?")
        expect(body).to_contain_text("Pebble Saga Gifts, p. 7 — Old Soldier")
        expect(body).to_contain_text("Trace of turn 2")
        choose(page, 0, "single")  # another strategy: the thread's memory goes on
        ask(page, "And what does it cost?", 3)
        expect(body).to_contain_text("Turn 1: What does Old Soldier cost?")
        expect(body).to_contain_text("searched as: What penalty does Old Soldier halve?")
        expect(body).to_contain_text("Turn 3: And what does it cost?")
        expect(body).to_contain_text("searched as: And what does Old Soldier cost?")
        expect(body).to_contain_text("single · 1 hop(s)")
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "convo-ask.png"), full_page=True)

        page.get_by_role("button", name="New conversation").click()
        page.get_by_text("Type a question and press Ask").wait_for(timeout=WAIT_MS)
        expect(body).not_to_contain_text("Turn 1:")
        ask(page, "What penalty does it halve?", 1)  # nothing to follow up: searched as asked
        expect(body).to_contain_text("searched as: What penalty does it halve?")
        browser.close()
