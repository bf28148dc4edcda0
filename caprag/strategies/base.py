"""The strategy contract, and the de-duplicating document pool every strategy merges hops into."""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from caprag.options import StrategyOptions
from caprag.retrieval.base import Retriever
from caprag.schemas import CallUsage, Document, Question, RetrievedRef
from caprag.state import GraphState
from caprag.steps import Steps

RRF_K = 60


class DocumentPool:
    """Documents gathered across hops, de-duplicated by hash of content + book, fused by RRF."""

    def __init__(self) -> None:
        self._docs: dict[str, Document] = {}
        self._fused: dict[str, float] = {}
        self._first_seen: dict[str, int] = {}

    def add(self, ranked: Sequence[Document], query: int = 0) -> list[RetrievedRef]:
        """Merge one query's ranked results (`query`: its index in the hop); report each as new
        or duplicate."""
        refs: list[RetrievedRef] = []
        for rank, doc in enumerate(ranked, start=1):
            key = doc.content_hash
            new = key not in self._docs
            if new:
                self._docs[key] = doc
                self._first_seen[key] = len(self._first_seen)
            elif doc.score > self._docs[key].score:
                self._docs[key] = doc
            self._fused[key] = self._fused.get(key, 0.0) + 1.0 / (RRF_K + rank)
            refs.append(
                RetrievedRef(
                    passage_id=doc.passage_id,
                    book_id=doc.book_id,
                    page=doc.page,
                    score=doc.score,
                    new=new,
                    query=query,
                )
            )
        return refs

    def __len__(self) -> int:
        return len(self._docs)

    def top(self, k: int) -> list[Document]:
        """The k best documents by fused rank (ties: first found first)."""
        keys = sorted(self._docs, key=lambda key: (-self._fused[key], self._first_seen[key]))
        return [self._docs[key] for key in keys[:k]]


class FollowedContext:
    """The passages handed to generation: the first hop's ranking first, as it was, then what the
    follow-up queries found, in the order they found it.

    A follow-up result never pushes one of the question's own best passages down (the first
    hop's ranking is what the question itself asked for: MRR stays that of a single search); it
    takes the place of the first hop's lowest-ranked passages, at most `max_followed` of them.
    """

    def __init__(self, k: int, max_followed: int) -> None:
        self.k = k
        self.max_followed = max_followed
        self.first = DocumentPool()
        self.followed: list[Document] = []
        self._seen: set[str] = set()
        self.read: set[str] = set()
        """Ids of every passage read so far (handed on or not)."""

    def add_first(self, ranked: list[Document], query: int = 0) -> list[RetrievedRef]:
        """Merge one first-hop query's ranking (the question, its expansion: fused by RRF)."""
        refs = self.first.add(ranked, query)
        self._seen.update(doc.content_hash for doc in ranked)
        self.read.update(doc.passage_id for doc in ranked)
        return refs

    def add_follow_up(
        self, ranked: list[Document], keep: int, query: int = 0
    ) -> list[RetrievedRef]:
        """Read a follow-up query's ranking down to its `keep` best passages not seen yet; those
        join the context (while there is room). The refs are what was read: the passages seen
        before (duplicates) and the new ones kept."""
        refs: list[RetrievedRef] = []
        kept = 0
        for doc in ranked:
            if kept == keep:
                break
            new = doc.content_hash not in self._seen
            self.read.add(doc.passage_id)
            refs.append(
                RetrievedRef(
                    passage_id=doc.passage_id,
                    book_id=doc.book_id,
                    page=doc.page,
                    score=doc.score,
                    new=new,
                    query=query,
                )
            )
            if new:
                self._seen.add(doc.content_hash)
                kept += 1
                if len(self.followed) < self.max_followed:
                    self.followed.append(doc)
        return refs

    def top(self) -> list[Document]:
        """The k passages handed on: the first hop's best, then the followed ones."""
        followed = self.followed[: self.k]
        return self.first.top(self.k - len(followed)) + followed


class RetrievalStrategy(ABC):
    """How the `retrieve` node gathers passages. Subclasses must implement `execute`."""

    name: ClassVar[str]
    served_retrieval_s: ClassVar[float | None] = None
    """The served limit of this strategy's retrieval, in seconds (None: derived from its LLM-call
    bound, `max_llm_calls`, at a hosted model's p95; see `caprag.serve.deadline.served_limit_s`)."""

    Options: ClassVar[type[StrategyOptions]] = StrategyOptions
    """The strategy's options, declared once (`caprag.options`): the constructor checks the
    keywords it gets against them, Hydra's group, the harness, the API and the docs read them."""

    def __init__(self, retriever: Retriever, steps: Steps, k: int = 8, **options: Any) -> None:
        self.retriever = retriever
        self.steps = steps
        """The LLM steps (each by its rule or by a model) the strategy calls."""
        self.k = k
        self.options = self.Options.check(options, self.name, strategy=self.name)
        """The checked options (ConfigError of one line for a bad one)."""

    @classmethod
    def served_options(cls, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The options the API and the CLI serve with: each `CAPRAG_<STRATEGY>_<OPTION>` the
        environment sets, the rest at their defaults (the harness gets them from Hydra)."""
        options = cls.Options.from_env(environ, cls.name)
        return {name: getattr(options, name) for name in type(options).model_fields}

    @abstractmethod
    async def execute(self, state: GraphState) -> GraphState:
        """Fill `questions`, `context` and `hops` for `state.main_question`."""

    def max_llm_calls(self) -> dict[str, int] | None:
        """The most LLM calls one `execute` can make, by step (a cost dry run's worst case);
        None when the strategy has no bound (a strategy that does not say)."""
        return None

    async def expanded(self, question: str, n: int) -> tuple[list[str], list[CallUsage]]:
        """The question and its expansion (the `expand` step, at most n sub-questions, the
        question itself not repeated), and the call that made it."""
        expansion = await self.steps.expand(question, n)
        asked = question.strip().lower()
        queries = [question, *(q for q in expansion.value if q.strip().lower() != asked)]
        return queries, [u for u in (expansion.usage,) if u]

    async def search_many(self, queries: Sequence[str], k: int | None = None) -> list[Question]:
        """Run the queries concurrently (k each, default self.k); one Question per query."""
        depth = k or self.k
        results = await asyncio.gather(
            *(asyncio.to_thread(self.retriever.search, query, depth) for query in queries)
        )
        return [Question(text=q, context=docs) for q, docs in zip(queries, results, strict=True)]


def elapsed(start: float) -> float:
    """Seconds since start, rounded for traces."""
    return round(time.perf_counter() - start, 6)
