"""Builders that Hydra's `_target_` points at: objects made from config, dependencies passed in."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from caprag.books import Book, load_books
from caprag.embeddings import get_embedder
from caprag.errors import ConfigError
from caprag.store import PassageIndex


def build_index(
    corpus: str | Path,
    store: str | Path,
    embedding: str = "minilm",
    chunk_chars: int = 420,
    ingest: bool = True,
    progress: bool = True,
    books: Sequence[Book] | None = None,
) -> PassageIndex:
    """Open the passage index and bring it up to date (unchanged books skipped).

    `books` (a benchmark's own corpus) replaces the books under `corpus`, which is then not read.
    """
    if books is not None and not all(isinstance(book, Book) for book in books):
        raise ConfigError(
            "build_index(books=...) needs Book objects; through hydra.utils.instantiate pass them "
            "as experiments.data.BookCorpus (a list of dataclasses is turned into configs)"
        )
    index = PassageIndex(store, get_embedder(embedding), child_chars=chunk_chars)
    if ingest:
        index.ingest(load_books(corpus) if books is None else books, progress=progress)
    return index
