"""The Regressions page and shareable links in Debian's chromium: a link opens the same view,
a row's trace link opens the Trace viewer on that question, the export loads as a question set."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pandas as pd
import pytest
from playwright.sync_api import Browser, Page

from experiments.results.questions import load_questions
from experiments.results.tracking import TABLE, mlflow
from experiments.scoring import regressions as reg
from tests.dashboard.conftest import Store
from tests.dashboard.test_browser import (
    SHOTS,
    TEXT_TIMEOUT_MS,
    dashboard_server,
    settle,
    shown,
    visit,
)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(harness_store: Store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The dashboard on the harness store (a multi-hop and a multi-question run)."""
    with dashboard_server(harness_store.uri, tmp_path_factory.mktemp("regress")) as base:
        yield base


def logged(uri: str, run_id: str) -> pd.DataFrame:
    """A run's per-question table as MLflow returns it."""
    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient(uri)
    return client.load_table(client.get_run(run_id).info.experiment_id, TABLE, run_ids=[run_id])


def shown_counts(page: Page) -> dict[str, int]:
    """The better/picked/same/not scored counts the page shows."""
    metrics = page.locator("[data-testid='stMetric']")
    found = {}
    for i in range(metrics.count()):
        label = metrics.nth(i).locator("[data-testid='stMetricLabel']").inner_text().strip()
        found[label] = int(metrics.nth(i).locator("[data-testid='stMetricValue']").inner_text())
    return found


def shoot(page: Page, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"regress-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def test_a_link_opens_the_regressions_view_and_the_traces(
    server: str,
    browser: Browser,
    harness_store: Store,
    tmp_path: Path,
) -> None:
    a, b = harness_store.runs["multi-hop"], harness_store.runs["multi-question"]
    frame = reg.compare(logged(harness_store.uri, a), logged(harness_store.uri, b), "recall_at_k")
    cross = reg.filtered(frame, sets=["cross_book"])
    assert 0 < len(cross) < len(frame)
    url = f"{server}/regressions?a={a}&b={b}&metric=recall_at_k&set=cross_book"
    page = visit(browser, url, "Run A (before)", height=2400)
    # the server's first visit is this link: the page still runs inside the app's navigation
    shown(page.get_by_role("link", name="Trace viewer"))
    assert shown_counts(page) == reg.counts(cross)
    shown(page.get_by_text(f"{len(cross)} of the {len(frame)} questions"))
    assert shoot(page, "regressions-cross_book").stat().st_size > 10_000

    # the page keeps its state in the URL: a reload shows the same view
    page.reload()
    page.get_by_text("Run A (before)").wait_for(timeout=TEXT_TIMEOUT_MS)
    settle(page)
    assert shown_counts(page) == reg.counts(cross)

    # a filter changed on the page lands in the URL; the copied link opens that view
    page.locator("[data-testid='stMultiSelect']").nth(3).click()
    wanted = next(change for change, n in reg.counts(cross).items() if n)
    page.get_by_role("option", name=wanted, exact=True).click()
    page.keyboard.press("Escape")
    settle(page)
    copied = page.url
    assert parse_qs(urlparse(copied).query)["change"] == [wanted]
    again = visit(browser, copied, "Run A (before)", height=2400)
    assert shown_counts(again) == reg.counts(cross)
    picked = reg.filtered(cross, changes=[wanted])
    shown(again.get_by_text(f"{len(picked)} shown"))

    # export the questions shown and load them with the project's loader
    with again.expect_download() as download:
        again.get_by_role("button", name="Export these questions as a dataset").click()
    saved = tmp_path / "export.jsonl"
    download.value.save_as(saved)
    exported = load_questions(saved)
    assert sorted(q.id for q in exported) == sorted(reg.single_questions(picked)["question_id"])
    assert {q.set for q in exported} <= {"cross_book"}

    # the row's trace link opens the Trace viewer on that run and question
    first = str(reg.ordered(picked).iloc[0]["question_id"])
    with again.context.expect_page() as opened:
        again.get_by_role("link", name="Trace in B").click()
    trace = opened.value
    trace.get_by_text("Hop 1").first.wait_for(timeout=TEXT_TIMEOUT_MS)
    settle(trace)
    query = parse_qs(urlparse(trace.url).query)
    assert query["run"] == [b] and query["question"] == [first]
    shown(trace.get_by_text(b).first)
    text = str(picked.set_index("question_id").loc[first, "question"])
    shown(trace.get_by_text(text[:40], exact=False).first)
    assert shoot(trace, "trace-from-link").stat().st_size > 10_000


def test_runs_and_compare_read_their_runs_from_the_url(
    server: str,
    browser: Browser,
    harness_store: Store,
) -> None:
    hop = harness_store.runs["multi-hop"]
    page = visit(browser, f"{server}/?runs={hop}", "Selected: ")
    shown(page.get_by_text("Selected: default:multi-hop:", exact=False))
    assert parse_qs(urlparse(page.url).query)["runs"] == [hop]
    page = visit(browser, f"{server}/compare?runs={hop}", "Choose two or more runs")
    chosen = page.locator("[data-testid='stMultiSelect'] [data-tag]:visible")
    assert chosen.count() == 1 and ":multi-hop:" in chosen.first.inner_text()
