"""The failure path in Debian's chromium: Compare sliced to cross_book lists each run's worst
questions beside the metrics; one click opens a question's trace in the same tab, with its
failure tags and the gold passages it never retrieved; Back returns to the same slice and runs.
From the trace: a human label stored as MLflow human feedback, shown on Regressions and exported
with the question; the question asked again with another strategy, beside the original."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from playwright.sync_api import Browser, Page

from caprag.retrieval.books import load_books
from experiments.results.questions import load_questions
from experiments.results.row import rows_of
from experiments.results.tracking import TABLE, mlflow
from experiments.scoring.failures import Corpus, cited_not_followed
from tests.conftest import FIXTURE_BOOKS
from tests.dashboard.conftest import Store
from tests.dashboard.test_browser import (
    SHOTS,
    TEXT_TIMEOUT_MS,
    choose,
    dashboard_server,
    press_until_shown,
    settle,
    shown,
)
from tests.dashboard.test_slices_browser import headers, wide

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
    verdict = page.get_by_text("Verdict ·", exact=False).first  # on the first screen
    shown(verdict)
    said = verdict.inner_text()
    assert "cross_book (" in said and " vs " in said and "cost ×" in said, said
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
    shown(page.get_by_text("Where the gold passages went", exact=False).first)
    shoot(page, "trace-from-worst")
    page.go_back()
    page.get_by_text("Worst questions · question set cross_book").wait_for(timeout=TEXT_TIMEOUT_MS)
    settle(page)
    back = parse_qs(urlparse(page.url).query)
    assert back["runs"] == runs and back["by"] == ["set"] and back["slice"] == ["cross_book"]
    assert urlparse(page.url).path.endswith("/compare")
    page.close()


def test_trace_missing_gold_human_label_export_and_ask_again(
    app: str, browser: Browser, harness_store: Store, tmp_path: Path
) -> None:
    run_id = harness_store.runs["multi-question"]
    mlflow.set_tracking_uri(harness_store.uri)
    client = mlflow.MlflowClient(harness_store.uri)
    experiment = client.get_run(run_id).info.experiment_id
    table = client.load_table(experiment, TABLE, run_ids=[run_id])
    (row,) = [r for r in rows_of(table) if r.question_id == "t-cb-1"]
    corpus = Corpus.of(load_books(FIXTURE_BOOKS))
    missing = [g for g in row.gold_ids if g not in row.retrieved_ids()]
    assert missing and cited_not_followed(row, corpus) == missing  # what the page must show

    page = wide(browser, f"{app}/trace?run={run_id}&question=t-cb-1", "Failure tags", height=2600)
    tags = page.locator("[data-testid='stAlert']").filter(has_text="Failure tags").first
    shown(tags.get_by_text("gold not retrieved, cited but not followed", exact=False))
    shown(page.get_by_text(f"Gold passages never retrieved ({len(missing)})"))
    gold = corpus.passages[missing[0]]
    opened = page.locator("details.passage[open]", has_text=missing[0]).first
    title = f"{missing[0]} · {gold.book_id} p. {gold.page} · {gold.section}"
    assert (opened.locator("summary").text_content() or "").strip() == title
    shown(opened.get_by_text(gold.text[:40], exact=False))

    # a human label (its form folded under the trace until opened): a reason from the tag list
    # and a note, stored as MLflow human feedback
    page.get_by_text("Label this question (why it failed)").click()
    choose(page, "Reason", "cited but not")
    page.get_by_label("Note (or the reason, in your words)").fill("hop 2 never searched it")
    page.get_by_label("Your name").fill("tester")
    page.get_by_role("button", name="Save label").click()
    label = "cited but not followed: hop 2 never searched it"
    page.get_by_text(f"Human label: {label}").wait_for(timeout=TEXT_TIMEOUT_MS)
    settle(page)
    traces = mlflow.search_traces(locations=[experiment], run_id=run_id, return_type="list")
    feedback = [a for t in traces for a in t.info.assessments or [] if a.name == "human_label"]
    assert [(f.value, f.rationale, f.source.source_type, f.source.source_id) for f in feedback] == [
        ("cited but not followed", "hop 2 never searched it", "HUMAN", "tester")
    ]
    with page.expect_download() as download:
        page.get_by_role("button", name="Export this question with its label").click()
    path = tmp_path / "labelled.jsonl"
    download.value.save_as(path)
    (item,) = load_questions(path, "cross_book")
    assert (item.id, item.label, item.gold_passages) == ("t-cb-1", label, row.gold_ids)
    shoot(page, "trace-missing-gold-label")

    # ask again with another strategy: the new trace beside the original
    page.get_by_text("Ask again with other settings").click()
    choose(page, "Strategy", "multi-hop")
    form = page.locator("[data-testid='stExpander']").filter(has_text="Ask again with other")
    press_until_shown(
        page, page.get_by_role("button", name="Ask again"), "Asked again · multi-hop", form
    )
    settle(page)
    shown(page.get_by_text("Original · multi-question", exact=False))
    columns = page.locator("[data-testid='stColumn']").filter(has_text="Asked again")
    shown(columns.last.get_by_text("Hop 1", exact=True))
    shoot(page, "trace-ask-again")
    page.close()

    # the label on the Regressions page, and in its export
    mh = harness_store.runs["multi-hop"]
    page = browser.new_page(viewport={"width": 2600, "height": 1400})
    page.goto(f"{app}/regressions?a={mh}&b={run_id}&set=cross_book")
    page.get_by_text("Export these questions as a dataset").first.wait_for(timeout=TEXT_TIMEOUT_MS)
    settle(page)
    index = headers(page).index("B human label") + 1
    cells = page.locator(f"[data-testid='stDataFrame'] [role='gridcell'][aria-colindex='{index}']")
    assert label in [(c or "").strip() for c in cells.all_text_contents()]
    with page.expect_download() as download:
        page.get_by_role("button", name="Export these questions as a dataset").click()
    download.value.save_as(path)
    labelled = {q.id: q.label for q in load_questions(path)}
    assert labelled["t-cb-1"] == label
    assert all(v == "" for q, v in labelled.items() if q != "t-cb-1")
    shoot(page, "regressions-label")
    page.close()
