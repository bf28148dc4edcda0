"""Builders that Hydra's `_target_` points at: objects made from config, dependencies passed in."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from caprag.books import Book, load_books
from caprag.errors import ConfigError
from caprag.hybrid import RRF_K
from caprag.ingest import Index, make_index

KINDS = ("dense", "bm25", "hybrid")
"""What build_index(kind=...) accepts."""


def build_index(
    corpus: str | Path,
    store: str | Path,
    embedding: str = "minilm",
    chunk_chars: int = 420,
    ingest: bool = True,
    progress: bool = True,
    books: Sequence[Book] | None = None,
    kind: str = "dense",
    rrf_k: int = RRF_K,
) -> Index:
    """Open the passage index and bring it up to date (unchanged books skipped).

    `kind`: dense (embedded chunks in Chroma), bm25 (lexical, in `<store>/bm25/`) or hybrid (both,
    fused by reciprocal rank with constant `rrf_k`). `books` (a benchmark's own corpus) replaces
    the books under `corpus`, which is then not read.
    """
    if books is not None and not all(isinstance(book, Book) for book in books):
        raise ConfigError(
            "build_index(books=...) needs Book objects; through hydra.utils.instantiate pass them "
            "as experiments.data.BookCorpus (a list of dataclasses is turned into configs)"
        )
    if kind not in KINDS:
        raise ConfigError(f"retriever kind={kind!r} is not allowed: expected {' | '.join(KINDS)}")
    if isinstance(rrf_k, bool) or not isinstance(rrf_k, int) or rrf_k < 1:
        raise ConfigError(f"retriever rrf_k={rrf_k!r} is not allowed: expected a whole number >= 1")
    index = make_index(kind, store, embedding, child_chars=chunk_chars, rrf_k=rrf_k)
    if ingest:
        index.ingest(load_books(corpus) if books is None else books, progress=progress)
    return index
