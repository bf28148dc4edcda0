"""Slices and the Runs table in a real browser: the metric picker and rounding of the Runs page at
1440 px, and the Compare page sliced to one question set."""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
import pytest
from playwright.sync_api import Browser, Page

from experiments.results.tracking import TABLE, mlflow
from tests.dashboard.conftest import Store
from tests.dashboard.test_browser import (
    SHOTS,
    TEXT_TIMEOUT_MS,
    dashboard_server,
    settle,
)

pytestmark = pytest.mark.browser
WIDE = 1440
RECALL, TOKENS, COST = "gold-passage recall@k", "tokens", "cost (USD per 1,000 questions)"
DEFAULT_HEADERS = ["run", RECALL, "all gold passages in k", "token F1", "hops", TOKENS, COST]
CROSS_BOOK = f"{RECALL} · cross_book"


@pytest.fixture(scope="module")
def app(routing_store: Store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The dashboard against four real runs (adaptive auto and always deep, multi-hop, single)."""
    with dashboard_server(routing_store.uri, tmp_path_factory.mktemp("browser-slices")) as base:
        yield base


def wide(browser: Browser, url: str, wait_for: str, height: int = 1000) -> Page:
    """A fresh 1440 px wide page at url, once `wait_for` shows and the script has finished."""
    page = browser.new_page(viewport={"width": WIDE, "height": height})
    page.goto(url)
    page.get_by_text(wait_for, exact=False).first.wait_for(timeout=TEXT_TIMEOUT_MS)
    settle(page)
    return page


def headers(page: Page) -> list[str]:
    """The column titles the data grid has drawn (it draws only the columns in view)."""
    cells = page.locator("[data-testid='stDataFrame'] [role='columnheader']")
    return [(cells.nth(i).text_content() or "").strip() for i in range(cells.count())]


def column_cells(page: Page, title: str) -> list[str]:
    """The drawn cells of one column of the Runs table, top to bottom."""
    index = headers(page).index(title) + 1
    grid = page.locator("[data-testid='stDataFrame']")
    cells = grid.locator(f"[role='gridcell'][aria-colindex='{index}']")
    return [(cells.nth(i).text_content() or "").strip() for i in range(cells.count())]


def logged(store: Store) -> pd.DataFrame:
    """The store's runs as MLflow returns them (metrics by name), by run label prefix."""
    mlflow.set_tracking_uri(store.uri)
    frame = mlflow.search_runs(search_all_experiments=True, output_format="pandas")
    assert isinstance(frame, pd.DataFrame)
    return frame[frame["tags.caprag.role"] != "sweep"]


def test_runs_page_shows_picked_metrics_rounded_at_1440(
    app: str,
    browser: Browser,
    routing_store: Store,
) -> None:
    page = wide(browser, app, "4 of 4 runs")
    grid = page.locator("[data-testid='stDataFrame'] [role='columnheader']")
    grid.first.wait_for(state="attached")  # the grid's accessible copy is hidden
    assert headers(page)[: len(DEFAULT_HEADERS)] == DEFAULT_HEADERS
    runs = logged(routing_store)
    labels = column_cells(page, "run")
    by_label = runs.set_index(runs["tags.mlflow.runName"] + " [" + runs["run_id"].str[:8] + "]")
    recall, tokens, cost = (column_cells(page, t) for t in (RECALL, TOKENS, COST))
    for label, r, t, c in zip(labels, recall, tokens, cost, strict=True):
        metrics = by_label.loc[label]
        assert float(r) == round(metrics["metrics.recall_at_k"], 3) and len(r.split(".")[-1]) <= 3
        assert float(t) == round(metrics["metrics.tokens"], 1)
        assert float(c) == round(metrics["metrics.cost_usd"] * 1000, 3)
    shoot(page, "runs-1440")

    picker = page.locator("[data-testid='stMultiSelect']").filter(has_text="Metrics shown")
    for typed in ("MRR", CROSS_BOOK):
        picker.locator("input").click()
        page.keyboard.type(typed)
        page.get_by_role("option", name=typed, exact=True).click()
        settle(page)
    page.keyboard.press("Escape")
    settle(page)
    drawn = headers(page)
    assert drawn[: len(DEFAULT_HEADERS) + 2] == [*DEFAULT_HEADERS, "MRR", CROSS_BOOK]
    cross = column_cells(page, CROSS_BOOK)
    for label, value in zip(column_cells(page, "run"), cross, strict=True):
        assert float(value) == round(by_label.loc[label, "metrics.recall_at_k/cross_book"], 3)


def test_compare_sliced_to_cross_book(
    app: str,
    browser: Browser,
    routing_store: Store,
) -> None:
    page = wide(browser, f"{app}/compare", "Cost vs quality", height=3000)
    table = page.locator("[data-testid='stTable']").first
    assert table.get_by_text("correct refusal (unanswerable)").is_visible()
    page.get_by_text("By question set").click()
    page.get_by_text("question set cross_book", exact=False).first.wait_for()
    settle(page)
    table = page.locator("[data-testid='stTable']").first
    assert table.get_by_text("gold-passage recall@k").is_visible()
    # no unanswerable question is in cross_book: the refusal row is gone
    assert table.get_by_text("correct refusal (unanswerable)").count() == 0
    run_id = routing_store.runs["single"]
    mlflow.set_tracking_uri(routing_store.uri)
    rows = mlflow.load_table(TABLE, run_ids=[run_id])
    cross = rows[(rows["set"] == "cross_book") & (rows["status"] == "ok")]
    expected = f"{cross['prompt_tokens'].mean():.1f}"
    header = [c.strip() for c in table.locator("thead th").all_inner_texts()]
    column = next(i for i, h in enumerate(header) if run_id[:8] in h)
    prompt = table.locator("tbody tr").filter(has_text="prompt tokens").first
    assert prompt.locator("th, td").nth(column).inner_text().strip() == expected
    assert page.locator(".js-plotly-plot").first.is_visible()
    shoot(page, "compare-cross_book")
    # the slice is in the address: a copied link opens the same slice
    assert "by=set" in page.url and "slice=cross_book" in page.url, page.url
    copied = wide(browser, page.url, "Cost vs quality", height=3000)
    copied.get_by_text("question set cross_book", exact=False).first.wait_for()
    copied.close()
    page.get_by_text(COST, exact=True).click()
    settle(page)
    scatter = page.locator(".js-plotly-plot").first
    scatter.locator(".xtick text", has_text="$").first.wait_for(state="attached")
    ticks = scatter.locator(".xtick text").all_text_contents()  # dollars per 1,000 questions
    assert ticks and all(t.startswith("$0.") or t == "$0" for t in ticks), ticks
    scatter.screenshot(path=str(SHOTS / "slices-cost-usd-axis.png"))


def shoot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"slices-{name}.png"), full_page=True)
