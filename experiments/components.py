"""Builders that Hydra's `_target_` points at: objects made from config, dependencies passed in."""

from __future__ import annotations

from pathlib import Path

from caprag.books import load_books
from caprag.embeddings import get_embedder
from caprag.store import PassageIndex


def build_index(
    corpus: str | Path,
    store: str | Path,
    embedding: str = "minilm",
    chunk_chars: int = 420,
    ingest: bool = True,
    progress: bool = True,
) -> PassageIndex:
    """Open the passage index and bring it up to date with the corpus (unchanged books skipped)."""
    index = PassageIndex(store, get_embedder(embedding), child_chars=chunk_chars)
    if ingest:
        index.ingest(load_books(corpus), progress=progress)
    return index
