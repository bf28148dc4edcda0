"""The Trace viewer in Debian's chromium: a passage's text opens on a click, an LLM call's messages
and reply are there verbatim, and "Open in MLflow" points at the question's own trace."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest
from playwright.sync_api import Browser

from caprag.schemas import RetrievedRef
from caprag.trace import HopTrace
from experiments.dashboard.store import trace_url
from experiments.results import traces
from experiments.results.row import SCHEMA, PassageInfo, QuestionRow
from experiments.results.tracking import TABLE, mlflow, use_experiment
from tests.dashboard.conftest import (
    REPLY,
    SYSTEM_PROMPT,
    USER_PROMPT,
    Store,
    model_call,
    rule_call,
)
from tests.dashboard.test_browser import SHOTS, TEXT_TIMEOUT_MS, dashboard_server, settle, visit

pytestmark = pytest.mark.browser
FLURRY = "Flurry: two attacks in one turn, the second at -4 ($5 *or* `x`).\n\n  Indented."
OLD_SOLDIER = "Old Soldier halves the penalty of a Flurry's second attack."


def document(pid: str, new: bool = True) -> RetrievedRef:
    return RetrievedRef(passage_id=pid, book_id=pid.split("/")[0], page=41, score=0.8, new=new)


def passage(pid: str, text: str) -> PassageInfo:
    section = pid.split("/")[1].replace("-", " ").title()
    return PassageInfo(book_id=pid.split("/")[0], page=41, section=section, text=text)


@pytest.fixture(scope="module")
def content_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """One run of one two-hop question with passage texts and a model call, and its trace."""
    tmp = tmp_path_factory.mktemp("content")
    uri = f"sqlite:///{tmp / 'mlruns.db'}"
    experiment = use_experiment(uri, "caprag")
    tags = {"caprag.strategy": "multi-hop", "caprag.dataset": "cross_book", "caprag.llm": "openai"}
    tags |= {"caprag.schema": SCHEMA}  # what the harness logs today: no old-schema warning
    calls = [model_call(), rule_call()]
    usage = calls[0].model_copy(update={"messages": None, "reply": None})
    hops = [
        HopTrace(hop=1, queries=["Flurry second attack"], usage=[usage], new_documents=1,
                 documents=[document("fighting/flurry")]),
        HopTrace(hop=2, queries=["Old Soldier"], new_documents=1, duplicate_documents=1,
                 documents=[document("fighting/flurry", new=False),
                            document("gifts/old-soldier")]),
    ]  # fmt: skip
    row = QuestionRow(
        case_id="t-cb-1",
        question_id="t-cb-1",
        set="cross_book",
        query_type="factual",
        turn=1,
        question="What penalty does the second attack of a Flurry suffer?",
        gold_answer="-4, halved for an Old Soldier",
        answer="-4, halved for an Old Soldier.",
        context_ids=["fighting/flurry", "gifts/old-soldier"],
        gold_ids=["fighting/flurry", "gifts/old-soldier"],
        values={"recall_at_k": 1.0},
        hops=hops,
        passages={
            "fighting/flurry": passage("fighting/flurry", FLURRY),
            "gifts/old-soldier": passage("gifts/old-soldier", OLD_SOLDIER),
        },
        calls=calls,
        started_ns=time.time_ns(),
        timings={"total": 1.5},
    )
    with mlflow.start_run(experiment_id=experiment, run_name="content", tags=tags) as logged:
        mlflow.log_metrics({"questions": 1.0})
        mlflow.log_table(pd.DataFrame([row.record()]), artifact_file=TABLE)
    run_id = logged.info.run_id
    traces.write_traces([row], traces.Target(uri, experiment, run_id, "multi-hop"))
    return Store(uri, {"content": run_id, "experiment": experiment})


def test_trace_viewer_opens_passage_texts_and_llm_messages(
    content_store: Store, browser: Browser, tmp_path: Path
) -> None:
    with dashboard_server(content_store.uri, tmp_path) as base:
        page = visit(browser, f"{base}/trace", "Hop 2", height=2400)
        passage = page.locator("details.passage", has_text="gifts/old-soldier").first
        text = passage.get_by_text("Old Soldier halves the penalty", exact=False)
        assert not text.is_visible()  # collapsed until clicked
        passage.locator("summary").click()
        text.wait_for(timeout=TEXT_TIMEOUT_MS)
        # Hop 2 returned the Flurry passage again: its text (kept once, in the row) is shown
        # there too, whitespace as written.
        again = page.locator("details.passage", has_text="fighting/flurry").nth(1)
        again.locator("summary").click()
        shown = again.locator("div").first.inner_text(timeout=TEXT_TIMEOUT_MS)
        assert shown.replace("\xa0", " ") == FLURRY

        page.get_by_text("LLM calls (2)").click()
        page.get_by_text("1. analyze · gpt-4o-mini: messages and reply").click()
        page.get_by_text("needs Old Soldier", exact=False).first.wait_for(timeout=TEXT_TIMEOUT_MS)
        codes = page.locator("[data-testid='stCode']").all_inner_texts()
        assert [c.strip() for c in codes] == [
            SYSTEM_PROMPT,
            USER_PROMPT + "[fighting/flurry] Flurry: two attacks.",
            REPLY,
        ]
        settle(page)

        link = page.get_by_role("link", name="Open this question's trace in the MLflow UI")
        mlflow.set_tracking_uri(content_store.uri)
        (trace,) = mlflow.search_traces(
            locations=[content_store.runs["experiment"]], return_type="list"
        )
        assert link.get_attribute("href") == trace_url(
            content_store.runs["experiment"], trace.info.trace_id
        )
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "tracescores-trace-passage.png"), full_page=True)
