"""`python -m caprag.ingest PATH`: parse the books under PATH and index the new or changed ones."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from caprag.books import load_books
from caprag.chroma_server import ServerPassageIndex, is_server_url
from caprag.config import Settings, load_settings
from caprag.embeddings import Embedder, get_embedder
from caprag.errors import CapragError, ConfigError
from caprag.hybrid import RRF_K, HybridIndex
from caprag.lexical import BM25Index
from caprag.store import CHILD_CHARS, IngestReport, PassageIndex

Index = PassageIndex | BM25Index | HybridIndex
"""The retrievers CAPRAG_RETRIEVER chooses between (one search/restricted/parents interface)."""


def open_index(settings: Settings) -> PassageIndex:
    """Open the dense passage index the settings point at (CAPRAG_EMBEDDING)."""
    return dense_index(settings.store, get_embedder(settings.embedding))


def dense_index(
    store: Path | str, embedder: Embedder, child_chars: int = CHILD_CHARS
) -> PassageIndex:
    """The dense index in a store folder (embedded Chroma) or on a Chroma server (http://...)."""
    if is_server_url(store):
        return ServerPassageIndex(str(store), embedder, child_chars=child_chars)
    return PassageIndex(store, embedder, child_chars=child_chars)


def make_index(
    kind: str,
    store: Path | str,
    embedding: str = "minilm",
    *,
    child_chars: int = CHILD_CHARS,
    rrf_k: int = RRF_K,
) -> Index:
    """The retriever of `kind` over a store folder: dense (embedded chunks in Chroma), bm25, or
    hybrid (both, fused by reciprocal rank with constant `rrf_k`). The API and the harness both
    open their index here. A store `http://HOST:PORT[/NAMESPACE]` is a Chroma server (dense only:
    BM25 keeps its index in a folder)."""
    if kind != "dense" and is_server_url(store):
        raise ConfigError(
            f"retriever kind={kind} keeps its BM25 index in a store folder, not on the Chroma "
            f"server {store}: use a folder store, or the dense retriever with the server"
        )
    if kind == "bm25":
        return BM25Index(store)
    dense = dense_index(store, get_embedder(embedding), child_chars=child_chars)
    return HybridIndex(dense, BM25Index(store), rrf_k=rrf_k) if kind == "hybrid" else dense


def open_retriever(settings: Settings) -> Index:
    """Open the index CAPRAG_RETRIEVER chooses: dense, bm25 or hybrid (both, fused)."""
    return make_index(settings.retriever, settings.store, settings.embedding)


def ingest_path(path: Path | str, settings: Settings, *, prune: bool = False) -> IngestReport:
    """Parse every book under path, then add what changed to the index CAPRAG_RETRIEVER uses.

    Raises BookFormatError (file:line) for any book that cannot be read or parsed, CapragError for
    a folder without books and FileNotFoundError for a missing path: no book is skipped.
    """
    books = load_books(path)
    return open_retriever(settings).ingest(books, prune=prune)


def main(argv: list[str] | None = None) -> int:
    """Ingest the rulebooks under PATH into the vector store."""
    parser = argparse.ArgumentParser(prog="python -m caprag.ingest", description=main.__doc__)
    parser.add_argument("path", type=Path, nargs="?", help="books folder (default: CAPRAG_CORPUS)")
    parser.add_argument("--prune", action="store_true", help="remove books no longer under PATH")
    args = parser.parse_args(argv)
    try:
        settings = load_settings()
        report = ingest_path(args.path or settings.corpus, settings, prune=args.prune)
    except (CapragError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
