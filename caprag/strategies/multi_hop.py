"""Multi-hop: search, let the analyzer decide what is missing, search again (at most max_hops)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from caprag.options import MultiHopOptions
from caprag.retrieval.catalog import Catalog
from caprag.schemas import CallUsage, Question, RetrievedRef
from caprag.state import GraphState
from caprag.steps import Steps
from caprag.strategies.base import (
    FollowedContext,
    RetrievalStrategy,
    Retriever,
    elapsed,
)
from caprag.text import searchable
from caprag.trace import HopTrace


class MultiHopStrategy(RetrievalStrategy):
    """Follow cross-references and bridge names until the analyzer is satisfied or hops run out."""

    name = "multi-hop"

    Options = MultiHopOptions
    options: MultiHopOptions

    def __init__(self, retriever: Retriever, steps: Steps, k: int = 8, **options: Any) -> None:
        super().__init__(retriever, steps, k, **options)
        self.max_hops = self.options.max_hops
        self.follow_k = self.options.follow_k
        """New passages kept per follow-up query: a targeted query is after one passage, and
        fewer per query leaves more of the fixed budget k to the question's own results."""
        self.analyze_k = self.options.analyze_k
        """Passages the analyzer reads (the best of those handed on): what it costs per hop."""
        self.expand_first_hop = self.options.expand_first_hop
        """Search the question's expansion (the `expand` step) beside it on the first hop."""
        self.n_subquestions = self.options.n_subquestions
        self._catalog: Catalog | None = None

    def max_llm_calls(self) -> dict[str, int]:
        """An analysis after every hop but the last (and one expansion when enabled)."""
        calls = {"analyze": self.max_hops - 1}
        if self.expand_first_hop:
            calls["expand"] = 1
        return calls

    def catalog(self) -> Catalog | None:
        """The titles of the passages the retriever searches (read once): what a bridge name
        must be for the rule analyzer to follow it."""
        if self._catalog is None:
            self._catalog = Catalog.of(self.retriever)
        return self._catalog

    async def execute(self, state: GraphState) -> GraphState:
        """1. Search the question (and its expansion). 2. Analyze the passages handed on.
        3. Search the new queries, keeping each one's best new passages. Repeat."""
        context = FollowedContext(self.k, max_followed=max(1, self.k // 2))
        questions: list[Question] = []
        hops: list[HopTrace] = []
        queries = [state.main_question]
        usage: list[CallUsage] = []
        if self.expand_first_hop:
            queries, usage = await self.expanded(state.main_question, self.n_subquestions)
        searched: list[str] = []
        for number in range(1, self.max_hops + 1):
            start = time.perf_counter()
            # A follow-up reads past what it has already seen: its own best is often a passage
            # the first hop found (the question's subject), so it searches as deep as the first.
            found = await self.search_many(queries, self.k)
            searched += queries
            questions += found
            refs: list[RetrievedRef] = []
            for index, question in enumerate(found):
                if number == 1:
                    refs += context.add_first(question.context, index)
                else:
                    refs += context.add_follow_up(question.context, self.follow_k, index)
            hop = HopTrace(
                hop=number,
                queries=queries,
                documents=refs,
                new_documents=sum(r.new for r in refs),
                duplicate_documents=sum(not r.new for r in refs),
                usage=usage,
            )
            usage = []
            hops.append(hop)
            if number == self.max_hops:
                hop.latency_s = elapsed(start)
                break
            catalog = self.catalog()
            analysis = await self.steps.analyze(
                state.main_question,
                context.top()[: self.analyze_k],
                searched,
                catalog=catalog.unread(context.read) if catalog is not None else None,
            )
            hop.decision = analysis.value
            if analysis.usage:
                hop.usage.append(analysis.usage)
            hop.latency_s = elapsed(start)
            queries = searchable(analysis.value.new_queries, [state.main_question, *searched])
            if analysis.value.sufficient or not queries:
                break
        return dataclasses.replace(state, questions=questions, context=context.top(), hops=hops)
