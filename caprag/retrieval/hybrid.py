"""Hybrid retrieval: reciprocal-rank fusion of a lexical (BM25) and a dense ranking."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from caprag.retrieval.base import Retriever
from caprag.retrieval.books import Book
from caprag.retrieval.catalog import Cataloged
from caprag.retrieval.lexical import BM25Index
from caprag.retrieval.store import IngestReport, PassageIndex
from caprag.schemas import Document

RRF_K = 60
"""The constant of reciprocal-rank fusion (Cormack et al. 2009): 1 / (RRF_K + rank)."""
MIN_DEPTH = 50
"""Each ranking contributes at least this many candidates (or 4k) to the fusion."""


def fuse(rankings: Sequence[Sequence[Document]], k: int, rrf_k: int = RRF_K) -> list[Document]:
    """The top k of the rankings by the sum of 1 / (rrf_k + rank) (ties: smaller passage id);
    each Document's score is its fused score."""
    fused: dict[str, float] = {}
    first: dict[str, Document] = {}
    for ranking in rankings:
        for rank, doc in enumerate(ranking, start=1):
            fused[doc.passage_id] = fused.get(doc.passage_id, 0.0) + 1.0 / (rrf_k + rank)
            first.setdefault(doc.passage_id, doc)
    ranked = sorted(fused.items(), key=lambda item: (-item[1], item[0]))[:k]
    return [first[pid].model_copy(update={"score": round(score, 6)}) for pid, score in ranked]


class FusedRetriever:
    """Searches every retriever a level deeper than asked and fuses their rankings."""

    def __init__(self, retrievers: Sequence[Retriever], rrf_k: int = RRF_K) -> None:
        self.retrievers = tuple(retrievers)
        self.rrf_k = rrf_k

    def search(self, query: str, k: int) -> list[Document]:
        """Top-k fused passages; each ranking is max(4k, MIN_DEPTH) deep."""
        depth = max(k * 4, MIN_DEPTH)
        return fuse([r.search(query, depth) for r in self.retrievers], k, self.rrf_k)

    def parents(self) -> dict[str, Document]:
        """Every passage the fused retrievers search (they search the same ones)."""
        first = self.retrievers[0]
        return dict(first.parents()) if isinstance(first, Cataloged) else {}


class HybridIndex(FusedRetriever):
    """BM25 and the dense index over the same parent passages, fused per query."""

    def __init__(self, dense: PassageIndex, lexical: BM25Index, rrf_k: int = RRF_K) -> None:
        super().__init__((lexical, dense), rrf_k)
        self.dense = dense
        self.lexical = lexical

    def ingest(
        self, books: Sequence[Book], *, prune: bool = False, progress: bool = True
    ) -> IngestReport:
        """Bring both indexes up to date; the report is the dense one's, with both times."""
        report = self.dense.ingest(books, prune=prune, progress=progress)
        report.seconds += self.lexical.ingest(books, prune=prune, progress=progress).seconds
        return report

    def restricted(self, passage_ids: Iterable[str]) -> FusedRetriever:
        """A retriever fusing the two indexes' searches within the given parent passages."""
        ids = tuple(passage_ids)
        return FusedRetriever(
            (self.lexical.restricted(ids), self.dense.restricted(ids)), self.rrf_k
        )

    def parents(self) -> dict[str, Document]:
        """Every indexed passage by id (the dense index's; BM25 holds the same)."""
        return self.dense.parents()

    def manifest(self) -> dict[str, Any]:
        """Books in the index (the dense index's manifest)."""
        return self.dense.manifest()

    def books(self) -> dict[str, dict[str, Any]]:
        """Metadata of each indexed book, keyed by book id."""
        return self.dense.books()

    def book_by_short(self, short: str) -> str | None:
        """Book id for a short name used in citations."""
        return self.dense.book_by_short(short)
