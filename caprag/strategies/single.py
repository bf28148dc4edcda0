"""The baseline: one query (the standalone question), one search."""

from __future__ import annotations

import dataclasses
import time

from caprag.options import SingleOptions
from caprag.state import GraphState
from caprag.strategies.base import DocumentPool, RetrievalStrategy, elapsed
from caprag.trace import HopTrace


class SingleQueryStrategy(RetrievalStrategy):
    """Search once with the question as asked (after rewrite)."""

    name = "single"
    Options = SingleOptions

    def max_llm_calls(self) -> dict[str, int]:
        """One search and no LLM call."""
        return {}

    async def execute(self, state: GraphState) -> GraphState:
        """1. Search the question. 2. Hand its top k to generation."""
        start = time.perf_counter()
        questions = await self.search_many([state.main_question])
        pool = DocumentPool()
        refs = pool.add(questions[0].context)
        hop = HopTrace(
            hop=1,
            queries=[state.main_question],
            documents=refs,
            new_documents=sum(r.new for r in refs),
            duplicate_documents=sum(not r.new for r in refs),
            latency_s=elapsed(start),
        )
        return dataclasses.replace(state, questions=questions, context=pool.top(self.k), hops=[hop])
