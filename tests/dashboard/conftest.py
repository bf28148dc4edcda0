"""MLflow stores for the dashboard tests: real harness runs, odd runs, a run with recorded LLM
calls, and an empty store."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pytest

from caprag.schemas import CallUsage, RetrievedRef
from caprag.trace import HopTrace
from experiments.harness.run import run
from experiments.results.row import SCHEMA, PassageInfo, QuestionRow
from experiments.results.tracking import TABLE, mlflow, use_experiment
from tests.browsers import launch_chromium
from tests.integration.test_harness import make_cfg

if TYPE_CHECKING:
    from playwright.sync_api import Browser


@dataclass(frozen=True)
class Store:
    """A tracking URI and the ids of the runs logged into it."""

    uri: str
    runs: dict[str, str]


@pytest.fixture(scope="session")
def harness_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """Two real harness runs (multi-hop, multi-question) of one sweep on the fixture corpus."""
    tmp = tmp_path_factory.mktemp("harness")
    uri = f"sqlite:///{tmp / 'mlruns.db'}"
    ids = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        for strategy in ("multi-hop", "multi-question"):
            cfg = make_cfg(tmp, "dataset=all", f"strategy={strategy}", "retriever.k=2")
            result = run(cfg, sweep_id="dashboard-test")
            assert result.run_id is not None
            ids[strategy] = result.run_id
    return Store(uri, ids)


@pytest.fixture(scope="session")
def odd_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """A run without a questions table and a run of an older schema (few tags and columns)."""
    tmp = tmp_path_factory.mktemp("odd")
    uri = f"sqlite:///{tmp / 'mlruns.db'}"
    experiment = use_experiment(uri, "caprag")
    tags = {"caprag.strategy": "single", "caprag.dataset": "cross_book", "caprag.llm": "offline"}
    with mlflow.start_run(
        experiment_id=experiment, run_name="no-table", tags={**tags, "caprag.schema": "1"}
    ) as no_table:
        mlflow.log_metrics({"questions": 3.0, "failed": 3.0})
    with mlflow.start_run(
        experiment_id=experiment, run_name="old-schema", tags={"caprag.strategy": "multi-hop"}
    ) as old:
        mlflow.log_metrics({"recall_at_k": 0.5, "questions": 2.0})
        rows = [
            {
                "question_id": "q1",
                "question": "Old question one?",
                "answer": "a",
                "recall_at_k": 1.0,
            },
            {
                "question_id": "q2",
                "question": "Old question two?",
                "answer": "b",
                "recall_at_k": 0.0,
            },
        ]
        mlflow.log_table(pd.DataFrame(rows), artifact_file="questions.json")
    return Store(uri, {"no-table": no_table.info.run_id, "old": old.info.run_id})


SYSTEM_PROMPT = (
    "Decide whether the passages answer the question.\nIf not, give *new* queries (at most 3) "
    "for what is missing: costs in $ and `code` stay as written."
)
USER_PROMPT = "Question: What penalty does the second attack of a Flurry suffer?\n\nPassages:\n"
REPLY = '{"sufficient": false, "reasoning": "needs Old Soldier", "new_queries": ["Old Soldier"]}'


def model_call() -> CallUsage:
    """An analyze call sent to a model: its messages as sent, the raw reply, a retry and a note."""
    return CallUsage(
        step="analyze",
        model="gpt-4o-mini",
        prompt_tokens=412,
        completion_tokens=37,
        cost_usd=0.0000840,
        latency_s=1.25,
        counted="reported",
        prompt_version="analyze-v1",
        messages=[
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": USER_PROMPT + "[fighting/flurry] Flurry: two attacks."},
        ],
        reply=REPLY,
        attempts=2,
        notes=["dropped 1 query longer than 300 characters"],
    )


def rule_call() -> CallUsage:
    """A generate step answered by its rule: costed as if sent, nothing sent."""
    return CallUsage(
        step="generate", model="offline", prompt_tokens=297, completion_tokens=83, cost_usd=9e-05
    )


@pytest.fixture(scope="session")
def calls_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """One run whose questions table has a `calls` column: a model call and a rule call."""
    tmp = tmp_path_factory.mktemp("calls")
    uri = f"sqlite:///{tmp / 'mlruns.db'}"
    experiment = use_experiment(uri, "caprag")
    tags = {
        "caprag.strategy": "multi-hop",
        "caprag.dataset": "cross_book",
        "caprag.llm": "openai",
        "caprag.schema": SCHEMA,
    }
    calls = [model_call(), rule_call()]
    hop = HopTrace(
        hop=1,
        queries=["Flurry second attack penalty"],
        documents=[
            RetrievedRef(
                passage_id="fighting/flurry", book_id="fighting", page=41, score=0.8, new=True
            )
        ],
        new_documents=1,
        usage=[calls[0].model_copy(update={"messages": None, "reply": None})],
    )
    row = QuestionRow(
        case_id="t-cb-1",
        question_id="t-cb-1",
        set="cross_book",
        query_type="factual",
        turn=1,
        question="What penalty does the second attack of a Flurry suffer?",
        gold_answer="-4, halved for an Old Soldier",
        answer="-4.",
        context_ids=["fighting/flurry"],
        gold_ids=["fighting/flurry"],
        hops=[hop],
        passages={"fighting/flurry": PassageInfo(book_id="fighting", page=41, section="Flurry")},
        calls=calls,
    )
    with mlflow.start_run(experiment_id=experiment, run_name="with-calls", tags=tags) as logged:
        mlflow.log_metrics({"questions": 1.0})
        mlflow.log_table(pd.DataFrame([row.record()]), artifact_file=TABLE)
    return Store(uri, {"calls": logged.info.run_id})


LEGACY_TABLE = Path(__file__).resolve().parents[1] / "fixtures" / "legacy" / "questions.json"
"""A real per-question table of schema 1 (JSON text in cells): see its README."""


@pytest.fixture(scope="session")
def legacy_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """One run logged before rows were kept whole: its table is the legacy fixture's."""
    tmp = tmp_path_factory.mktemp("legacy")
    uri = f"sqlite:///{tmp / 'mlruns.db'}"
    experiment = use_experiment(uri, "caprag")
    tags = {
        "caprag.strategy": "multi-hop",
        "caprag.dataset": "all",
        "caprag.llm": "openai",
        "caprag.schema": "1",
    }
    table = pd.read_json(LEGACY_TABLE, orient="split")
    with mlflow.start_run(experiment_id=experiment, run_name="schema-1", tags=tags) as logged:
        mlflow.log_metrics({"questions": float(len(table))})
        mlflow.log_table(table, artifact_file=TABLE)
    return Store(uri, {"legacy": logged.info.run_id})


@pytest.fixture
def empty_store(tmp_path: Path) -> str:
    """A store that exists (its experiment created) but holds no run."""
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    use_experiment(uri, "caprag")
    return uri


@pytest.fixture(scope="session")
def routing_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """One sweep of four real harness runs on the fixture corpus: adaptive in auto mode, adaptive
    always at depth 3 (power 3), multi-hop and single, so the Compare page shows the savings of
    adaptive against always deep and the oracle router over four strategies."""
    tmp = tmp_path_factory.mktemp("routing")
    uri = f"sqlite:///{tmp / 'mlruns.db'}"
    runs = {
        "auto": ("strategy=adaptive", "strategy.power=auto"),
        "deep": ("strategy=adaptive", "strategy.power=3"),
        "multi-hop": ("strategy=multi-hop",),
        "single": ("strategy=single",),
    }
    ids = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        for name, overrides in runs.items():
            cfg = make_cfg(tmp, "dataset=all", *overrides, "retriever.k=2", "tracking.traces=false")
            result = run(cfg, sweep_id="routing-test")
            assert result.run_id is not None
            ids[name] = result.run_id
    return Store(uri, ids)


def adaptive_hop(number: int, depth: int, confidence: float, decision: str) -> HopTrace:
    """One round of an adaptive trace as the harness logs it."""
    return HopTrace(
        hop=number, queries=["How long does a torch burn?"], depth=depth, chunks=5 * depth,
        confidence=confidence, threshold=0.9, query_type="factual", adaptive_decision=decision,
    )  # fmt: skip


@pytest.fixture(scope="session")
def lone_adaptive_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """An adaptive (auto) run known only by its name, with no always-deep run beside it, and a
    multi-hop run: one question went deeper, one stopped at its first depth."""
    tmp = tmp_path_factory.mktemp("lone")
    uri = f"sqlite:///{tmp / 'mlruns.db'}"
    experiment = use_experiment(uri, "caprag")
    ids = {}
    base = {"caprag.dataset": "cross_book", "caprag.llm": "offline", "caprag.schema": SCHEMA}
    rounds = {
        "t-1": [adaptive_hop(1, 1, 0.95, "sufficient")],
        "t-2": [adaptive_hop(1, 1, 0.6, "increase_depth"), adaptive_hop(2, 2, 0.93, "sufficient")],
    }
    for strategy, name in (("adaptive", "x:adaptive power=auto:cross_book:offline"),
                           ("multi-hop", "x:multi-hop:cross_book:offline")):  # fmt: skip
        tags = {**base, "caprag.strategy": strategy}
        rows = [
            QuestionRow(
                case_id=qid, question_id=qid, set="cross_book", query_type="factual", turn=1,
                question=f"Question {qid}?", gold_answer="", hops=rounds[qid],
                values={"prompt_tokens": 100.0, "tokens": 120.0, "cost_usd": 1e-4,
                        "recall_at_k": 1.0},
            ).record()
            for qid in rounds
        ]  # fmt: skip
        with mlflow.start_run(experiment_id=experiment, run_name=name, tags=tags) as logged:
            mlflow.log_metrics({"questions": 2.0})
            mlflow.log_table(pd.DataFrame(rows), artifact_file=TABLE)
        ids[strategy] = logged.info.run_id
    return Store(uri, ids)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's chromium driven by Playwright (skipped only where chromium is not installed)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = launch_chromium(playwright)
        try:
            yield launched
        finally:
            launched.close()
