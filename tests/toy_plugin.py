"""A retriever and a strategy of one's own, each added by one registration call in this one
module: what `CAPRAG_PLUGINS=tests.toy_plugin` (or importing it) makes choosable as
CAPRAG_RETRIEVER=toy / RETRIEVAL_STRATEGY=toy-keywords, `retriever=toy strategy=toy-keywords` in the
harness, and on the dashboard's Ask page."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence

from caprag.retrieval.books import Book
from caprag.retrieval.retrievers import RetrieverKind, register_retriever
from caprag.retrieval.store import IngestReport, passage_to_document
from caprag.schemas import Document
from caprag.state import GraphState
from caprag.strategies import SingleQueryStrategy, register_strategy

WORD = re.compile(r"[a-z]{3,}")


def words(text: str) -> set[str]:
    """The lower-case words of three letters or more."""
    return set(WORD.findall(text.lower()))


class KeywordIndex:
    """The books' passages in memory, ranked by how many of the query's words each contains."""

    def __init__(self, passages: dict[str, Document] | None = None, only: Iterable[str] = ()):
        self.passages = {} if passages is None else passages
        self.only = set(only)

    def ingest(
        self, books: Sequence[Book], *, prune: bool = False, progress: bool = True
    ) -> IngestReport:
        if prune:
            self.passages.clear()
        found = {p.passage_id: passage_to_document(p) for b in books for p in b.passages}
        self.passages.update(found)
        return IngestReport(added=[b.meta.book_id for b in books], passages=len(found))

    def search(self, query: str, k: int) -> list[Document]:
        wanted = words(query)
        scored = [
            (len(wanted & words(f"{doc.section} {doc.text}")), pid)
            for pid, doc in self.passages.items()
            if not self.only or pid in self.only
        ]
        best = sorted((-score, pid) for score, pid in scored if score > 0)[:k]
        return [
            self.passages[pid].model_copy(update={"score": float(-score)}) for score, pid in best
        ]

    def restricted(self, passage_ids: Iterable[str]) -> KeywordIndex:
        return KeywordIndex(self.passages, passage_ids)

    def parents(self) -> dict[str, Document]:
        return dict(self.passages)


register_retriever(
    RetrieverKind(
        "toy", lambda _options: KeywordIndex(), "keywords", "query words a passage has, in memory"
    )
)


@register_strategy
class KeywordQueryStrategy(SingleQueryStrategy):
    """Search once with the question's three longest words only."""

    name = "toy-keywords"

    async def execute(self, state: GraphState) -> GraphState:
        longest = sorted(words(state.main_question), key=lambda w: (-len(w), w))[:3]
        done = await super().execute(dataclasses.replace(state, main_question=" ".join(longest)))
        return dataclasses.replace(done, main_question=state.main_question)
