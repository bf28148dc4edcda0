"""BM25 over the fixture books (no model, no Chroma) and reciprocal-rank fusion."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from caprag.config import load_settings
from caprag.errors import ConfigError
from caprag.retrieval.books import load_books
from caprag.retrieval.hybrid import MIN_DEPTH, FusedRetriever, fuse
from caprag.retrieval.lexical import BM25Index
from caprag.schemas import Document
from tests.conftest import FIXTURE_BOOKS


@pytest.fixture
def books_dir(tmp_path: Path) -> Path:
    """A copy of the fixture books that a test may change."""
    return Path(shutil.copytree(FIXTURE_BOOKS, tmp_path / "books"))


@pytest.fixture
def index(tmp_path: Path) -> BM25Index:
    built = BM25Index(tmp_path / "store")
    built.ingest(load_books(FIXTURE_BOOKS), progress=False)
    return built


def ids(docs: list[Document]) -> list[str]:
    return [d.passage_id for d in docs]


def test_exact_term_passage_ranks_first(index: BM25Index) -> None:
    found = index.search("shields against arrows", 3)
    assert ids(found)[0] == "fighting/shield-wall"
    assert found[0].score == 1.0 and all(d.score <= 1.0 for d in found)
    # Stemming: "dodges" finds the section that says "dodge".
    assert ids(index.search("who dodges?", 1)) == ["fighting/dodging"]


def test_unknown_or_stop_word_query_returns_nothing(index: BM25Index) -> None:
    assert index.search("xylophone quasar", 5) == []
    assert index.search("the of and", 5) == []
    assert index.search("", 5) == []


def test_index_reloads_without_tokenising_and_rebuilds_when_a_book_changes(
    books_dir: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    first = BM25Index(store)
    first.ingest(load_books(books_dir), progress=False)
    assert first.tokenised == 12

    again = BM25Index(store)
    report = again.ingest(load_books(books_dir), progress=False)
    assert report.skipped == ["basics", "fighting", "gifts"] and not report.added
    assert ids(again.search("torches", 1)) == ["basics/torches"]
    assert again.tokenised == 0  # the saved index was loaded, not rebuilt
    assert ids(BM25Index(store).search("torches", 1)) == ["basics/torches"]

    gifts = books_dir / "gifts.md"
    gifts.write_text(
        gifts.read_text().replace("persuade a merchant", "persuade a zeppelin captain")
    )
    changed = BM25Index(store)
    report = changed.ingest(load_books(books_dir), progress=False)
    assert report.added == ["gifts"]
    assert changed.tokenised == 12  # bm25s has no incremental add: the whole corpus is rebuilt
    assert ids(changed.search("zeppelin", 3)) == ["gifts/silver-tongue"]
    assert ids(BM25Index(store).search("zeppelin", 3)) == ["gifts/silver-tongue"]

    gifts.unlink()
    pruned = BM25Index(store)
    report = pruned.ingest(load_books(books_dir), prune=True, progress=False)
    assert report.removed == ["gifts"]
    assert pruned.search("zeppelin", 3) == []
    assert not any(pid.startswith("gifts/") for pid in pruned.parents())
    assert pruned.book_by_short("Gifts") is None


def test_citation_narrows_to_the_book_and_boosts_the_page(index: BM25Index) -> None:
    # "gift points" appear only in Gifts; the citation keeps the search inside that book.
    cited = index.search("Costs gift points (Gifts, p. 9)", 3)
    assert {d.book_id for d in cited} == {"gifts"}
    assert cited[0].passage_id == "gifts/silver-tongue" and cited[0].page == 9
    assert cited[0].score > 1.0  # the page boost on top of the best BM25 match
    # Without a citation the same words are not held to one book.
    assert {d.book_id for d in index.search("turn attack", 5)} == {"fighting", "gifts"}
    # A citation naming an unknown book is searched as plain text.
    assert ids(index.search("economy of motion (Nowhere, p. 3)", 1)) == ["gifts/old-soldier"]


def test_restricted_returns_the_best_of_the_allowed_passages_only(index: BM25Index) -> None:
    everywhere = ids(index.search("attack turn penalty", 12))
    allowed = everywhere[-2:]  # the two weakest matches overall
    scoped = index.restricted([*allowed, "no/such-passage"])
    found = scoped.search("attack turn penalty", 1)
    assert ids(found) == [allowed[0]] and found[0].score == 1.0
    assert set(ids(scoped.search("attack turn penalty", 10))) == set(allowed)
    assert index.restricted([]).search("attack", 3) == []


def test_parents_and_books_match_the_corpus(index: BM25Index) -> None:
    assert len(index.parents()) == 12
    assert set(index.books()) == {"basics", "fighting", "gifts"}
    assert index.book_by_short("fighting") == "fighting"


def doc(pid: str) -> Document:
    return Document(
        passage_id=pid,
        book_id="b",
        book_short="B",
        book_title="Book",
        section=pid,
        page=1,
        edition=1,
        published="2024-01-01",
        text=pid,
    )


class Ranked:
    """A retriever with a fixed ranking that records the depth it was asked for."""

    def __init__(self, *pids: str) -> None:
        self.ranking = [doc(p) for p in pids]
        self.asked: list[int] = []

    def search(self, query: str, k: int) -> list[Document]:
        self.asked.append(k)
        return self.ranking[:k]


def test_fusion_keeps_what_only_one_ranking_found() -> None:
    lexical = Ranked("shared", "only-bm25")
    dense = Ranked("only-dense", "shared")
    fused = FusedRetriever([lexical, dense]).search("q", 3)
    assert ids(fused) == ["shared", "only-dense", "only-bm25"]  # rank 1 beats rank 2
    assert fused[0].score == pytest.approx(1 / 61 + 1 / 62, abs=1e-6)
    assert lexical.asked == dense.asked == [MIN_DEPTH]
    FusedRetriever([lexical, dense]).search("q", 20)
    assert lexical.asked[-1] == 80


def test_fuse_ties_break_by_passage_id_and_rrf_k_matters() -> None:
    a, b = [doc("x"), doc("y")], [doc("y"), doc("x")]
    assert ids(fuse([a, b], 2)) == ["x", "y"]
    top_heavy = fuse([[doc("p"), doc("q")], [doc("q")]], 2, rrf_k=1)
    assert ids(top_heavy) == ["q", "p"] and top_heavy[0].score == pytest.approx(1 / 2 + 1 / 3)


def test_retriever_setting_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().retriever == "dense"
    monkeypatch.setenv("CAPRAG_RETRIEVER", "hybrid")
    assert load_settings().retriever == "hybrid"
    monkeypatch.setenv("CAPRAG_RETRIEVER", "tfidf")
    with pytest.raises(ConfigError, match="CAPRAG_RETRIEVER='tfidf'"):
        load_settings()
