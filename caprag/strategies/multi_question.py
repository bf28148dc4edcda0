"""Multi-question: the LLM expands the question into sub-questions, all searched in parallel."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from caprag.options import MultiQuestionOptions
from caprag.state import GraphState
from caprag.steps import Steps
from caprag.strategies.base import DocumentPool, RetrievalStrategy, Retriever, elapsed
from caprag.trace import HopTrace


class MultiQuestionStrategy(RetrievalStrategy):
    """One hop, many queries: the original question plus up to `n_subquestions` expansions."""

    name = "multi-question"

    Options = MultiQuestionOptions
    options: MultiQuestionOptions

    def __init__(self, retriever: Retriever, steps: Steps, k: int = 8, **options: Any) -> None:
        super().__init__(retriever, steps, k, **options)
        self.n_subquestions = self.options.n_subquestions

    def max_llm_calls(self) -> dict[str, int]:
        """One expansion."""
        return {"expand": 1}

    async def execute(self, state: GraphState) -> GraphState:
        """1. Expand. 2. Search original + sub-questions concurrently. 3. Fuse and cut to k."""
        start = time.perf_counter()
        queries, usage = await self.expanded(state.main_question, self.n_subquestions)
        questions = await self.search_many(queries)
        pool = DocumentPool()
        refs = [ref for index, q in enumerate(questions) for ref in pool.add(q.context, index)]
        hop = HopTrace(
            hop=1,
            queries=queries,
            documents=refs,
            new_documents=sum(r.new for r in refs),
            duplicate_documents=sum(not r.new for r in refs),
            usage=usage,
            latency_s=elapsed(start),
        )
        return dataclasses.replace(state, questions=questions, context=pool.top(self.k), hops=[hop])
