"""The chat page in headless Chromium: ask, see answer and sources, follow up on the same thread."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from caprag.config import PROJECT_ROOT
from experiments.loadtest import serve
from tests.browsers import launch_chromium
from tests.conftest import FIXTURE_BOOKS

pytestmark = pytest.mark.browser
SHOTS = PROJECT_ROOT / "reports" / "screenshots"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    return path


def test_ask_and_follow_up_in_the_browser(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    env = {
        "CAPRAG_CORPUS": str(FIXTURE_BOOKS),
        "CAPRAG_CHROMA_DIR": str(tmp_path / "store"),
        "CAPRAG_K": "2",
    }
    with serve(env) as base, sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1000, "height": 800})
        page.goto(base + "/")
        thread = page.locator("#thread_id").input_value()
        assert len(thread) == 36 and thread.count("-") == 4
        page.fill("input[name=question]", "What does Old Soldier cost?")
        page.click("button[type=submit]")
        first = page.locator(".turn").nth(0)
        expect(first).to_contain_text("6 gift points", timeout=60_000)
        expect(first).to_contain_text("Pebble Saga Gifts, p. 7 — Old Soldier")
        expect(first).to_contain_text("hop(s)")
        page.fill("input[name=question]", "What penalty does it halve?")
        page.click("button[type=submit]")
        second = page.locator(".turn").nth(1)
        expect(second).to_contain_text(
            "searched as: What penalty does Old Soldier halve?", timeout=60_000
        )
        expect(second).to_contain_text("second blow")
        assert page.locator("#thread_id").input_value() == thread
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "chat.png"), full_page=True)
        page.fill("input[name=question]", "\u200b\u200c\ufeff")  # only invisible characters
        page.click("button[type=submit]")
        expect(page.locator(".turn.error")).to_have_text(
            "error 422: the question is empty", timeout=60_000
        )
        browser.close()
