"""Iter-RetGen (Shao et al., 2023): a fixed number of rounds of retrieve, then generate.

Round 1 searches the question; every later round searches the question with the previous
round's answer (the `generate` step's, from that round's k passages), so what a draft answer
names pulls in what the question alone does not reach. Generation gets the last round's k
passages: the pipeline's own generation is the last round's.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from caprag.llm.client import StepFailedError
from caprag.options import IterRetGenOptions
from caprag.schemas import MAX_QUESTION_CHARS, Document, Question
from caprag.state import GraphState
from caprag.steps import Steps
from caprag.steps.ask import clean
from caprag.strategies.base import (
    DocumentPool,
    RetrievalStrategy,
    Retriever,
    elapsed,
)
from caprag.trace import HopTrace


class IterRetGenStrategy(RetrievalStrategy):
    """`rounds` searches, each but the last followed by a draft answer."""

    name = "iter-retgen"

    Options = IterRetGenOptions
    options: IterRetGenOptions

    def __init__(self, retriever: Retriever, steps: Steps, k: int = 8, **options: Any) -> None:
        super().__init__(retriever, steps, k, **options)
        self.rounds = self.options.rounds
        """Searches; draft answers = rounds - 1 (the pipeline's generation is the last round's)."""

    def max_llm_calls(self) -> dict[str, int]:
        """A draft answer after every round but the last."""
        return {"generate": self.rounds - 1}

    async def execute(self, state: GraphState) -> GraphState:
        """1. Search the question (with the last draft answer). 2. Draft an answer from the
        round's k passages. Repeat; hand on the last round's k passages."""
        question = state.main_question
        questions: list[Question] = []
        hops: list[HopTrace] = []
        seen = DocumentPool()
        query = question
        ranked: list[Document] = []
        for number in range(1, self.rounds + 1):
            start = time.perf_counter()
            found = await self.search_many([query], self.k)
            questions += found
            ranked = found[0].context
            refs = seen.add(ranked)
            hop = HopTrace(
                hop=number,
                queries=[query],
                documents=refs,
                new_documents=sum(r.new for r in refs),
                duplicate_documents=sum(not r.new for r in refs),
            )
            hops.append(hop)
            if number < self.rounds:
                try:
                    draft = await self.steps.generate(question, ranked[: self.k])
                    answer, usage = clean(draft.value.answer), draft.usage
                    refused = draft.value.refused
                except StepFailedError as failed:  # an unusable reply: the question alone next
                    answer, usage, refused = "", failed.usage, False
                if usage:
                    hop.usage.append(usage)
                hop.reasoning = [f"(refused) {answer}" if refused else answer]
                # a draft that found nothing has nothing to add to the search: the question alone
                query = next_query(question, "" if refused else answer)
            hop.latency_s = elapsed(start)
        return dataclasses.replace(state, questions=questions, context=ranked[: self.k], hops=hops)


def next_query(question: str, answer: str) -> str:
    """The question with the previous round's answer, cut at a word to the longest query
    (MAX_QUESTION_CHARS): the question is kept whole, the answer gets what is left."""
    if not answer:
        return question
    query = f"{question} {answer}".strip()
    if len(query) <= MAX_QUESTION_CHARS:
        return query
    cut = query[: MAX_QUESTION_CHARS + 1].rsplit(" ", 1)[0]
    return cut if len(cut) >= len(question) else question
