"""Ingestion: incremental by content hash, clear errors for bad input."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from caprag.errors import BookFormatError, VectorStoreError
from caprag.retrieval.books import load_books
from caprag.retrieval.embeddings import get_embedder
from caprag.retrieval.store import PassageIndex
from tests.conftest import FIXTURE_BOOKS


@pytest.fixture
def books_dir(tmp_path: Path) -> Path:
    target = tmp_path / "books"
    shutil.copytree(FIXTURE_BOOKS, target)
    return target


def test_second_ingest_of_unchanged_corpus_adds_nothing(tmp_path: Path, books_dir: Path) -> None:
    index = PassageIndex(tmp_path / "store", get_embedder("minilm"))
    first = index.ingest(load_books(books_dir), progress=False)
    assert sorted(first.added) == ["basics", "fighting", "gifts"]
    children = index._collection.count()
    again = PassageIndex(tmp_path / "store", get_embedder("minilm"))
    second = again.ingest(load_books(books_dir), progress=False)
    assert second.added == [] and sorted(second.skipped) == ["basics", "fighting", "gifts"]
    assert again._collection.count() == children
    assert len(again.parents()) == 12


def test_changed_book_is_reingested_alone(tmp_path: Path, books_dir: Path) -> None:
    index = PassageIndex(tmp_path / "store", get_embedder("minilm"))
    index.ingest(load_books(books_dir), progress=False)
    gifts = books_dir / "gifts.md"
    gifts.write_text(gifts.read_text().replace("Costs 3 gift points.", "Costs 5 gift points."))
    report = index.ingest(load_books(books_dir), progress=False)
    assert report.added == ["gifts"]
    assert "Costs 5 gift points." in index.parents()["gifts/silver-tongue"].text
    assert index.search("persuade a merchant", 1)[0].passage_id == "gifts/silver-tongue"


def test_prune_removes_books_no_longer_present(tmp_path: Path, books_dir: Path) -> None:
    index = PassageIndex(tmp_path / "store", get_embedder("minilm"))
    index.ingest(load_books(books_dir), progress=False)
    (books_dir / "basics.md").unlink()
    report = index.ingest(load_books(books_dir), prune=True, progress=False)
    assert report.removed == ["basics"]
    assert all(not d.passage_id.startswith("basics/") for d in index.search("torch", 5))


def test_store_path_that_is_a_file_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(VectorStoreError, match="is a file, not a folder"):
        PassageIndex(blocker, get_embedder("minilm"))
    with pytest.raises(VectorStoreError, match="cannot use vector store folder"):
        PassageIndex(blocker / "below", get_embedder("minilm"))


def test_book_without_metadata_names_file_and_line(books_dir: Path) -> None:
    bad = books_dir / "broken.md"
    bad.write_text("---\ntitle: No id\n---\n<!-- page 1 -->\n## A\ntext\n")
    with pytest.raises(BookFormatError, match=r"broken\.md:3: front matter lacks required key"):
        load_books(books_dir)


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", **env},
        timeout=600,
    )


def test_cli_errors_are_one_line_not_tracebacks(tmp_path: Path, books_dir: Path) -> None:
    (books_dir / "broken.md").write_text("---\ntitle: No id\n---\n")
    store = str(tmp_path / "store")
    bad_book = run_cli("caprag.retrieval.ingest", str(books_dir), env={"CAPRAG_CHROMA_DIR": store})
    assert bad_book.returncode == 2
    assert "broken.md:3: front matter lacks required key(s) book_id" in bad_book.stderr
    (books_dir / "broken.md").unlink()
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    bad_store = run_cli(
        "caprag.retrieval.ingest", str(books_dir), env={"CAPRAG_CHROMA_DIR": str(blocker)}
    )
    assert bad_store.returncode == 2 and "is a file, not a folder" in bad_store.stderr
    empty = run_cli(
        "caprag", "ask", "   ", env={"CAPRAG_CHROMA_DIR": store, "CAPRAG_CORPUS": str(books_dir)}
    )
    assert empty.returncode == 2 and "error: the question is empty" in empty.stderr
    for done in (bad_book, bad_store, empty):
        assert "Traceback" not in done.stderr


def test_cli_ask_prints_answer_sources_hops_tokens(tmp_path: Path, books_dir: Path) -> None:
    env = {
        "CAPRAG_CHROMA_DIR": str(tmp_path / "store"),
        "CAPRAG_CORPUS": str(books_dir),
        "CAPRAG_K": "2",
    }
    done = run_cli(
        "caprag", "ask", "What penalty does the second attack of a Flurry suffer?", env=env
    )
    assert done.returncode == 0, done.stderr
    assert "penalty of 4" in done.stdout
    assert "Pebble Saga Gifts, p. 7 — Old Soldier [gifts/old-soldier]" in done.stdout
    assert "Strategy multi-hop: 2 hop(s)" in done.stdout
    assert "tokens" in done.stdout and "$" in done.stdout
