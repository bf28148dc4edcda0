"""The chat page in headless Chromium: ask, see answer and sources, follow up on the same thread."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from caprag.config import PROJECT_ROOT
from experiments.perf.loadtest import serve
from tests.browsers import launch_chromium
from tests.conftest import FIXTURE_BOOKS

pytestmark = pytest.mark.browser
SHOTS = PROJECT_ROOT / "reports" / "screenshots"
WAIT_MS = 600_000  # only catches a hang: the machine is shared
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
        expect(first).to_contain_text("6 gift points", timeout=WAIT_MS)
        expect(first).to_contain_text("Pebble Saga Gifts, p. 7 — Old Soldier")
        expect(first).to_contain_text("hop(s)")
        page.fill("input[name=question]", "What penalty does it halve?")
        page.click("button[type=submit]")
        second = page.locator(".turn").nth(1)
        expect(second).to_contain_text(
            "searched as: What penalty does Old Soldier halve?", timeout=WAIT_MS
        )
        expect(second).to_contain_text("second blow")
        assert page.locator("#thread_id").input_value() == thread
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "chat.png"), full_page=True)
        page.fill("input[name=question]", "\u200b\u200c\ufeff")  # only invisible characters
        page.click("button[type=submit]")
        expect(page.locator(".turn.error")).to_have_text(
            "error 422: the question is empty", timeout=WAIT_MS
        )
        browser.close()


def test_adaptive_rounds_and_answer_feedback_in_the_browser(tmp_path: Path) -> None:
    """The chat page shows the configured ladder and each round, and its enough / not enough
    control stores the verdict with the request's decision record."""
    from playwright.sync_api import expect, sync_playwright

    from caprag.serve.decision_log import DecisionLog

    log = tmp_path / "decisions.db"
    env = {
        "CAPRAG_CORPUS": str(FIXTURE_BOOKS),
        "CAPRAG_CHROMA_DIR": str(tmp_path / "store"),
        "RETRIEVAL_STRATEGY": "adaptive",
        "CAPRAG_DEPTH_CHUNKS": "2,4,8",
        "CAPRAG_DECISION_LOG": str(log),
        "CAPRAG_REQUEST_TIMEOUT_S": "600",  # a loaded machine must not cut these turns short
    }
    with serve(env) as base, sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1000, "height": 900})
        page.goto(base + "/")
        expect(page.locator("#ladder")).to_have_text("depth 1: 2 / depth 2: 4 / depth 3: 8 chunks")
        expect(page.locator("select[name=power]")).to_have_value("2")  # the default, preselected
        page.select_option("select[name=power]", "auto")
        page.fill("input[name=question]", "What penalty does the second attack of a Flurry suffer?")
        page.click("button[type=submit]")
        first = page.locator(".turn").nth(0)
        expect(first.locator(".rounds li").first).to_contain_text(
            "round 1: depth 1/3, 2 chunks", timeout=WAIT_MS
        )
        expect(first).to_contain_text("power auto")
        first.locator("input[name=comment]").fill("no example with both attacks")
        first.locator("input[name=comment]").press("Enter")  # no verdict chosen: nothing sent
        page.wait_for_timeout(500)
        expect(first.locator(".recorded")).to_have_count(0)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "chat-feedback-control.png"), full_page=True)
        first.get_by_role("button", name="not enough").click()
        expect(first.locator(".recorded")).to_have_text(
            "Feedback recorded: not enough — “no example with both attacks”", timeout=WAIT_MS
        )
        page.select_option("select[name=power]", "2")
        page.fill("input[name=question]", "How long does a torch burn?")
        page.click("button[type=submit]")
        second = page.locator(".turn").nth(1)
        expect(second).to_contain_text("depth used 2/3", timeout=WAIT_MS)
        expect(second.locator(".rounds li")).to_have_count(1)
        second.get_by_role("button", name="enough", exact=True).click()
        expect(second.locator(".recorded")).to_have_text("Feedback recorded: enough")
        page.screenshot(path=str(SHOTS / "chat-adaptive-rounds-feedback.png"), full_page=True)
        browser.close()
    stored = DecisionLog(log).records()
    assert [r.question for r in stored] == [
        "How long does a torch burn?",
        "What penalty does the second attack of a Flurry suffer?",
    ]
    verdicts = [(r.feedback.enough, r.feedback.comment) for r in stored if r.feedback]
    assert verdicts == [(True, ""), (False, "no example with both attacks")]
    assert stored[1].power == "auto" and len(stored[1].rounds) >= 1
