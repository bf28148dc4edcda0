"""IRCoT (Trivedi et al., 2023): retrieval interleaved with a chain of thought.

Search the question; then, while the bound allows, let the `reason` step write the next
sentence of the reasoning from the passages read, and search with that sentence, until a
sentence gives the answer (or none is left to write). Generation gets the k passages of the
fixed budget: the question's own ranking first, then what the sentences found.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from caprag.options import IRCoTOptions
from caprag.schemas import Question, RetrievedRef
from caprag.state import GraphState
from caprag.steps import Steps
from caprag.strategies.base import (
    FollowedContext,
    RetrievalStrategy,
    Retriever,
    elapsed,
)
from caprag.text import junk_query
from caprag.trace import HopTrace


class IRCoTStrategy(RetrievalStrategy):
    """Each reasoning sentence is the next query (at most `max_steps` searches)."""

    name = "ircot"

    Options = IRCoTOptions
    options: IRCoTOptions

    def __init__(self, retriever: Retriever, steps: Steps, k: int = 8, **options: Any) -> None:
        super().__init__(retriever, steps, k, **options)
        self.max_steps = self.options.max_steps
        """Searches in all: the question's, then one per reasoning sentence."""
        self.follow_k = self.options.follow_k
        """New passages a sentence's search adds to the context."""
        self.reason_k = self.options.reason_k
        """Passages the reasoner reads per step."""

    def max_llm_calls(self) -> dict[str, int]:
        """A reasoning sentence after every search but the last."""
        return {"reason": self.max_steps - 1}

    async def execute(self, state: GraphState) -> GraphState:
        """1. Search the question. 2. Reason one sentence from what was read. 3. Search with it.
        Repeat 2-3 until a sentence answers, none is written, or the bound is reached."""
        context = FollowedContext(self.k, max_followed=max(1, self.k // 2))
        questions: list[Question] = []
        hops: list[HopTrace] = []
        reasoning: list[str] = []
        query = state.main_question
        for number in range(1, self.max_steps + 1):
            start = time.perf_counter()
            found = await self.search_many([query], self.k)
            questions += found
            refs: list[RetrievedRef] = (
                context.add_first(found[0].context)
                if number == 1
                else context.add_follow_up(found[0].context, self.follow_k)
            )
            hop = HopTrace(
                hop=number,
                queries=[query],
                documents=refs,
                new_documents=sum(r.new for r in refs),
                duplicate_documents=sum(not r.new for r in refs),
            )
            hops.append(hop)
            if number == self.max_steps:
                hop.latency_s = elapsed(start)
                break
            thought = await self.steps.reason(
                state.main_question, context.top()[: self.reason_k], reasoning
            )
            if thought.usage:
                hop.usage.append(thought.usage)
            hop.latency_s = elapsed(start)
            sentence = thought.value.sentence
            if sentence:
                reasoning.append(sentence)
                hop.reasoning = [sentence]
            answer = thought.value.answer
            if answer:
                said = "(this sentence answers)" if answer == sentence else answer
                hop.reasoning = [*(hop.reasoning or []), f"So the answer is: {said}"]
            searched = [state.main_question, *(q for h in hops for q in h.queries)]
            if thought.value.answer or not sentence or junk_query(sentence, searched):
                break
            query = sentence
        return dataclasses.replace(state, questions=questions, context=context.top(), hops=hops)
