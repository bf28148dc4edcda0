"""Self-Ask (Press et al., 2023): follow-up questions, each answered from its own retrieval.

Search the question (the fixed budget's first ranking, as every strategy starts). Then, at most
`max_follow_ups` times: the `ask` step gives the next follow-up (or, when the intermediate
answers suffice, the final answer composed from them); the follow-up is searched and answered by
the `generate` step from its own passages (an unusable reply leaves that answer empty).
Generation gets the k passages of the fixed budget: the question's own ranking first, then what
the follow-ups found.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from caprag.llm.client import StepFailedError
from caprag.options import SelfAskOptions
from caprag.state import GraphState
from caprag.steps import Steps
from caprag.steps.ask import clean
from caprag.strategies.base import (
    FollowedContext,
    RetrievalStrategy,
    Retriever,
    elapsed,
)
from caprag.text import junk_query
from caprag.trace import HopTrace


class SelfAskStrategy(RetrievalStrategy):
    """Ask, search, answer; repeat until the asker composes the final answer or the bound."""

    name = "self-ask"

    Options = SelfAskOptions
    options: SelfAskOptions

    def __init__(self, retriever: Retriever, steps: Steps, k: int = 8, **options: Any) -> None:
        super().__init__(retriever, steps, k, **options)
        self.max_follow_ups = self.options.max_follow_ups
        """Follow-ups asked at most (each one search and one intermediate answer)."""
        self.follow_k = self.options.follow_k
        """New passages a follow-up's search adds to the context."""
        self.answer_k = self.options.answer_k
        """Passages of its own search an intermediate answer is generated from."""

    def max_llm_calls(self) -> dict[str, int]:
        """An ask per follow-up and one to compose the answer; an answer per follow-up."""
        return {"ask": self.max_follow_ups + 1, "generate": self.max_follow_ups}

    async def execute(self, state: GraphState) -> GraphState:
        """1. Search the question. 2. Ask the next follow-up. 3. Search it, answer it from its
        own passages. Repeat 2-3 until the asker gives the final answer or the bound."""
        question = state.main_question
        context = FollowedContext(self.k, max_followed=max(1, self.k // 2))
        start = time.perf_counter()
        questions = await self.search_many([question], self.k)
        refs = context.add_first(questions[0].context)
        hops = [
            HopTrace(
                hop=1,
                queries=[question],
                documents=refs,
                new_documents=sum(r.new for r in refs),
                duplicate_documents=sum(not r.new for r in refs),
            )
        ]
        asked: list[tuple[str, str]] = []
        hop = hops[0]
        for number in range(2, self.max_follow_ups + 3):
            turn = await self.steps.ask(question, asked)
            if turn.usage:
                hop.usage.append(turn.usage)
            follow_up = turn.value.follow_up
            searched = [question, *(f for f, _ in asked)]
            junk = bool(follow_up) and junk_query(follow_up, searched) is not None
            if turn.value.final_answer or not follow_up or junk or number > self.max_follow_ups + 1:
                if turn.value.final_answer:
                    hop.reasoning = [
                        *(hop.reasoning or []),
                        f"So the final answer is: {turn.value.final_answer}",
                    ]
                break
            hop.latency_s = elapsed(start)
            start = time.perf_counter()
            found = await self.search_many([follow_up], self.k)
            questions += found
            refs = context.add_follow_up(found[0].context, self.follow_k)
            try:
                answer = await self.steps.generate(follow_up, found[0].context[: self.answer_k])
                intermediate, usage = clean(answer.value.answer), answer.usage
                if answer.value.refused:  # nothing found: no answer to ask on from or compose
                    intermediate = ""
            except StepFailedError as failed:  # an unusable reply: asked on without an answer
                intermediate, usage = "", failed.usage
            asked.append((follow_up, intermediate))
            hop = HopTrace(
                hop=number,
                queries=[follow_up],
                documents=refs,
                new_documents=sum(r.new for r in refs),
                duplicate_documents=sum(not r.new for r in refs),
                usage=[u for u in (usage,) if u],
                reasoning=[f"Follow up: {follow_up}", f"Intermediate answer: {intermediate}"],
            )
            hops.append(hop)
        hop.latency_s = elapsed(start)
        return dataclasses.replace(state, questions=questions, context=context.top(), hops=hops)
