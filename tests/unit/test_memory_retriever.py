"""The in-memory retriever the unit tests stand on: ranking by term overlap, citations, scopes,
and the catalogue the harness reads (parents, books, manifest)."""

from __future__ import annotations

from caprag.retrieval.books import load_books
from tests.conftest import FIXTURE_BOOKS
from tests.fakes import MemoryRetriever


def test_the_passage_holding_the_query_words_ranks_first_and_k_is_kept(
    books: MemoryRetriever,
) -> None:
    found = books.search("How long does a torch burn?", 4)
    assert [d.passage_id for d in found][:1] == ["basics/torches"]
    assert len(found) == 4 and found[0].score > found[1].score
    assert books.search("How long does a torch burn?", 4) == found  # deterministic
    assert books.searches == [("How long does a torch burn?", 4)] * 2


def test_a_citation_narrows_to_its_book_and_lifts_its_page(books: MemoryRetriever) -> None:
    found = books.search("Old Soldier (Gifts, p. 7)", 3)
    assert [d.book_id for d in found] == ["gifts"] * 3
    assert found[0].passage_id == "gifts/old-soldier" and found[0].page == 7
    assert found[0].score > 1.0  # the whole query matched, and the cited page


def test_a_restricted_view_returns_only_its_passages(books: MemoryRetriever) -> None:
    scoped = books.restricted(["basics/resting", "gifts/night-eyes"])
    found = scoped.search("How long does a torch burn?", 5)
    assert sorted(d.passage_id for d in found) == ["basics/resting", "gifts/night-eyes"]


def test_the_catalogue_matches_the_parsed_books(books: MemoryRetriever) -> None:
    parsed = load_books(FIXTURE_BOOKS)
    assert set(books.parents()) == {p.passage_id for b in parsed for p in b.passages}
    assert books.book_by_short("Gifts") == "gifts"
    manifest = books.manifest()
    assert sorted(manifest) == ["basics", "fighting", "gifts"]
    assert manifest["gifts"]["meta"]["title"] == "Pebble Saga Gifts"
    fewer = MemoryRetriever(d for d in books.documents if d.passage_id != "gifts/night-eyes")
    assert fewer.manifest()["gifts"]["hash"] != manifest["gifts"]["hash"]  # a changed book
    assert fewer.manifest()["basics"]["hash"] == manifest["basics"]["hash"]
