"""`python -m caprag.ingest PATH`: parse the books under PATH and index the new or changed ones."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from caprag.config import Settings, load_settings
from caprag.errors import CapragError
from caprag.retrieval.books import load_books
from caprag.retrieval.embeddings import get_embedder
from caprag.retrieval.retrievers import Index, dense_index, make_index
from caprag.retrieval.store import IngestReport, PassageIndex


def open_index(settings: Settings) -> PassageIndex:
    """Open the dense passage index the settings point at (CAPRAG_EMBEDDING)."""
    return dense_index(settings.store, get_embedder(settings.embedding))


def open_retriever(settings: Settings) -> Index:
    """Open the index CAPRAG_RETRIEVER chooses (a kind of `retrievers.RETRIEVERS`)."""
    return make_index(settings.retriever, settings.store, settings.embedding)


def ingest_path(
    path: Path | str, settings: Settings, *, prune: bool = False, index: Index | None = None
) -> IngestReport:
    """Parse every book under path, then add what changed to the index CAPRAG_RETRIEVER uses
    (`index`: that index, already open; an in-memory one is only filled in the object given).

    Raises BookFormatError (file:line) for any book that cannot be read or parsed, CapragError for
    a folder without books and FileNotFoundError for a missing path: no book is skipped.
    """
    books = load_books(path)
    return (index or open_retriever(settings)).ingest(books, prune=prune)


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
