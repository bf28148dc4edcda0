"""A damaged index file is named in one warning line and the index rebuilt from the corpus.

Probe: a corrupt `current.json`, `passages.json`, `*.npy`, `vocab.tokenizer.json`,
`parents/*.json` or `manifest.json` under the store gave a 27-43-line traceback on every run with
no rebuild; a `passages.json` listing ids the corpus lacks made `retriever=bm25` answer nothing
and `hybrid` silently dense-only.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from caprag.retrieval.books import Book, load_books
from caprag.retrieval.embeddings import get_embedder
from caprag.retrieval.hybrid import HybridIndex
from caprag.retrieval.lexical import BM25Index
from caprag.retrieval.store import PassageIndex
from tests.conftest import FIXTURE_BOOKS

QUERY = "How long does a torch burn?"
GARBAGE = b"\x93NUMPY damaged \x00\xff{"


@pytest.fixture(scope="module")
def books() -> list[Book]:
    return load_books(FIXTURE_BOOKS)


def bm25_files(store: Path) -> list[str]:
    """Every file of a built BM25 index, relative to the store (locks left out)."""
    return sorted(
        str(path.relative_to(store))
        for path in (store / "bm25").rglob("*")
        if path.is_file() and not path.name.endswith(".lock")
    )


def damage_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]


def top(index: BM25Index | PassageIndex | HybridIndex) -> list[str]:
    return [d.passage_id for d in index.search(QUERY, 3)]


def test_each_damaged_bm25_file_is_named_and_rebuilt(
    books: list[Book], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reference = tmp_path / "reference"
    clean = BM25Index(reference)
    clean.ingest(books, progress=False)
    expected = top(clean)
    assert expected
    files = bm25_files(reference)
    assert any(f.endswith(".npy") for f in files) and any("parents" in f for f in files)
    for name in files:
        store = tmp_path / name.replace("/", "_")
        BM25Index(store).ingest(books, progress=False)
        (store / name).write_bytes(GARBAGE)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            index = BM25Index(store)
            index.ingest(books, progress=False)
        (warning,) = damage_warnings(caplog)
        assert str(store / name) in warning or str((store / name).parent) in warning, warning
        assert top(index) == expected, name
        caplog.clear()
        with caplog.at_level(logging.WARNING):  # healed: the next open is quiet
            again = BM25Index(store)
            again.ingest(books, progress=False)
        assert damage_warnings(caplog) == [], name
        assert top(again) == expected


def test_passage_ids_the_corpus_lacks_are_damage(
    books: list[Book], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    BM25Index(tmp_path).ingest(books, progress=False)
    expected = top(BM25Index(tmp_path))
    (listing,) = (tmp_path / "bm25").rglob("passages.json")
    ids = json.loads(listing.read_text())
    listing.write_text(json.dumps([*ids[1:], "no-such-passage"]))
    with caplog.at_level(logging.WARNING):
        index = BM25Index(tmp_path)
        index.ingest(books, progress=False)
    (warning,) = damage_warnings(caplog)
    assert str(listing) in warning and "the corpus lacks" in warning
    assert top(index) == expected

    parents = sorted((tmp_path / "bm25").rglob("parents/*.json"))[0]
    rows = json.loads(parents.read_text())
    rows.append({**rows[0], "passage_id": "stranger#1"})
    parents.write_text(json.dumps(rows))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        index = BM25Index(tmp_path)
        index.ingest(books, progress=False)
    warnings = damage_warnings(caplog)
    assert warnings and str(parents) in warnings[0] and "the corpus lacks" in warnings[0]
    assert "stranger#1" not in index.parents()
    assert top(index) == expected


@pytest.mark.parametrize("damaged", ["manifest", "parents"])
def test_damaged_dense_manifest_and_parents_are_rebuilt(
    damaged: str, books: list[Book], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    embedder = get_embedder("minilm")
    clean = PassageIndex(tmp_path, embedder)
    clean.ingest(books, progress=False)
    expected = top(clean)
    if damaged == "manifest":
        (file,) = tmp_path.glob("manifest-*.json")
    else:
        file = sorted((tmp_path / "parents").rglob("*.json"))[0]
    file.write_bytes(GARBAGE)
    with caplog.at_level(logging.WARNING):
        index = PassageIndex(tmp_path, embedder)
        index.ingest(books, progress=False)
    (warning,) = damage_warnings(caplog)
    assert str(file) in warning
    assert top(index) == expected
    hybrid = HybridIndex(index, BM25Index(tmp_path))
    hybrid.ingest(books, progress=False)
    assert top(hybrid)
