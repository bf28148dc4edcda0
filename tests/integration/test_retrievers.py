"""BM25 and hybrid retrievers end to end: fusion over the real indexes, every strategy through
Hydra's run(cfg), and the API built from CAPRAG_RETRIEVER."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from caprag.config import load_settings
from caprag.retrieval.books import load_books
from caprag.retrieval.hybrid import HybridIndex
from caprag.retrieval.lexical import BM25Index
from caprag.retrieval.store import PassageIndex
from caprag.schemas import Document
from caprag.serve.api import create_app
from caprag.serve.deadline import TimedRetriever
from caprag.serve.services import build_pipeline
from caprag.strategies import STRATEGIES
from experiments.harness.run import run
from tests.conftest import FIXTURE_BOOKS
from tests.integration.test_harness import make_cfg

RETRIEVERS = ("bm25", "hybrid")


@pytest.fixture(scope="module")
def hybrid(fixture_index: PassageIndex) -> HybridIndex:
    """The session's MiniLM index fused with BM25 built beside it."""
    lexical = BM25Index(fixture_index.path)
    lexical.ingest(load_books(FIXTURE_BOOKS), progress=False)
    return HybridIndex(fixture_index, lexical)


def ids(docs: list[Document]) -> list[str]:
    return [d.passage_id for d in docs]


def test_hybrid_keeps_the_top_of_each_ranking(hybrid: HybridIndex) -> None:
    query = "how far can I run when attacking"
    lexical_top = ids(hybrid.lexical.search(query, 1))
    dense_top = ids(hybrid.dense.search(query, 1))
    assert lexical_top != dense_top  # the two rankings disagree on this question
    fused = ids(hybrid.search(query, 3))
    assert set(lexical_top + dense_top) <= set(fused)
    # A question BM25 has no word for still gets the dense ranking's answer.
    assert hybrid.lexical.search("protection from archers", 3) == []
    assert ids(hybrid.search("protection from archers", 1)) == ["fighting/shield-wall"]


def test_hybrid_restricted_and_citations(hybrid: HybridIndex) -> None:
    allowed = ["basics/resting", "gifts/silver-tongue"]
    found = ids(hybrid.restricted(allowed).search("how far can I run when attacking", 5))
    assert found and set(found) <= set(allowed)
    cited = hybrid.search("Costs gift points (Gifts, p. 9)", 3)
    assert {d.book_id for d in cited} == {"gifts"} and cited[0].passage_id == "gifts/silver-tongue"
    assert hybrid.parents() == hybrid.dense.parents()
    assert hybrid.book_by_short("Fighting") == "fighting"


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store for every harness run here, so each retriever ingests the books once."""
    return tmp_path_factory.mktemp("retriever-store")


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("retriever", RETRIEVERS)
def test_every_strategy_runs_through_hydra(
    retriever: str, strategy: str, tmp_path: Path, shared_store: Path
) -> None:
    cfg = make_cfg(
        tmp_path,
        f"retriever={retriever}",
        f"strategy={strategy}",
        f"paths.store={shared_store}",
        "tracking.enabled=false",
        "experiment.ragas=false",
        "experiment.resume=never",
        "experiment.limit=2",
    )
    result = run(cfg)
    assert [r.status for r in result.rows] == ["ok", "ok"]
    first = next(r for r in result.rows if r.question_id == "t-cb-1")
    assert "fighting/flurry" in first.context_ids
    assert (shared_store / "bm25" / "english" / "current.json").exists()


@pytest.mark.parametrize("retriever", RETRIEVERS)
def test_api_answers_with_the_retriever_from_the_environment(
    retriever: str, fixture_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAPRAG_RETRIEVER", retriever)
    monkeypatch.setenv("RETRIEVAL_STRATEGY", "single")
    monkeypatch.setenv("CAPRAG_EMBEDDING", "wordllama")
    with TestClient(create_app(), base_url="http://127.0.0.1") as client:
        reply = client.post("/api/ask", json={"question": "What does a Flurry let a fighter do?"})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["strategy"] == "single"
    assert body["hops"][0]["documents"][0]["passage_id"] == "fighting/flurry"
    assert (fixture_env / "chroma" / "bm25" / "english" / "current.json").exists()


def test_bm25_pipeline_needs_no_embedding(fixture_env: Path) -> None:
    settings = load_settings(retriever="bm25", embedding="minilm")
    pipeline = build_pipeline(settings)
    retriever = pipeline.strategy.retriever
    assert isinstance(retriever, TimedRetriever)  # served: each search timed for the limit
    assert isinstance(retriever.inner, BM25Index)
    assert not list((fixture_env / "chroma").glob("manifest-*.json"))  # no dense index was built
