"""The chat page in headless Chromium keeps the whole conversation: every turn with what it was
searched as, the thread in the address so a reload shows it again, and a new-conversation link."""

from __future__ import annotations

from pathlib import Path

import pytest

from caprag.config import PROJECT_ROOT
from experiments.perf.loadtest import serve
from tests.browsers import launch_chromium
from tests.conftest import FIXTURE_BOOKS

pytestmark = pytest.mark.browser
SHOTS = PROJECT_ROOT / "reports" / "screenshots"
WAIT_MS = 600_000  # only catches a hang: the machine is shared


def test_three_turns_survive_a_reload_and_a_new_conversation_starts_empty(
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect, sync_playwright

    env = {
        "CAPRAG_CORPUS": str(FIXTURE_BOOKS),
        "CAPRAG_CHROMA_DIR": str(tmp_path / "store"),
        "CAPRAG_K": "2",
        "CAPRAG_DECISION_LOG": "off",
    }
    asked = [
        ("What does Old Soldier cost?", "searched as: What does Old Soldier cost?"),
        ("What penalty does it halve?", "searched as: What penalty does Old Soldier halve?"),
        ("What does Night Eyes cost?", "searched as: What does Night Eyes cost?"),
    ]
    with serve(env) as base, sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1000, "height": 1100})
        page.goto(base + "/")
        thread = page.locator("#thread_id").input_value()
        assert page.url == f"{base}/?thread_id={thread}"  # the thread is in the address
        for n, (question, expected) in enumerate(asked):
            page.fill("input[name=question]", question)
            page.click("button[type=submit]")
            expect(page.locator(".turn")).to_have_count(n + 1, timeout=WAIT_MS)
            expect(page.locator(".turn").nth(n)).to_contain_text(expected, timeout=WAIT_MS)
        turns = page.locator(".turn")
        expect(turns.nth(0)).to_contain_text("6 gift points")
        expect(turns.nth(1)).to_contain_text("second blow")
        expect(turns.nth(0)).to_contain_text("searched as: What does Old Soldier cost?")
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "convo-chat.png"), full_page=True)

        page.reload()
        kept = page.locator(".turn.past")
        expect(kept).to_have_count(3, timeout=WAIT_MS)
        assert page.locator("#thread_id").input_value() == thread
        expect(kept.nth(0)).to_contain_text("What does Old Soldier cost?")
        expect(kept.nth(0)).to_contain_text("Pebble Saga Gifts, p. 7 — Old Soldier")
        expect(kept.nth(1)).to_contain_text("searched as: What penalty does Old Soldier halve?")
        expect(kept.nth(1)).to_contain_text("second blow")
        expect(kept.nth(2)).to_contain_text("4 gift points")
        page.fill("input[name=question]", "What does it cost?")  # follows up the kept thread
        page.click("button[type=submit]")
        expect(page.locator(".turn")).to_have_count(4, timeout=WAIT_MS)
        expect(page.locator(".turn").nth(3)).to_contain_text("searched as: ", timeout=WAIT_MS)
        page.screenshot(path=str(SHOTS / "convo-chat-reloaded.png"), full_page=True)

        page.click("#new-conversation")
        expect(page.locator("#thread_id")).not_to_have_value(thread, timeout=WAIT_MS)
        assert page.locator(".turn").count() == 0
        fresh = page.locator("#thread_id").input_value()
        assert page.url == f"{base}/?thread_id={fresh}"
        browser.close()
