"""Fakes the benchmarks and the tests share: LLM steps that answer at once."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from caprag.schemas import CallUsage, Document
from caprag.steps import StepResult, Steps
from caprag.steps.analyze import SufficiencyDecision
from caprag.steps.assess import ConfidenceAssessment
from caprag.steps.classify import QueryClass
from caprag.steps.generate import GeneratedAnswer


class InstantStep:
    """One step answered at once with a minimal valid value and zero usage."""

    kind = "llm"
    model = "instant"

    def __init__(self, step: str, reply: Callable[..., Any]) -> None:
        self.step = step
        self.reply = reply

    async def __call__(self, *args: Any, **kwargs: Any) -> StepResult[Any]:
        value = self.reply(*args, **kwargs)
        return StepResult(
            value, CallUsage(step=self.step, model=self.model, started_at=time.time())
        )


def _first_passage(question: str, documents: Sequence[Document], *_history: Any) -> Any:
    """The first passage's opening, citing it."""
    if not documents:
        return GeneratedAnswer(answer="The sources do not say.", refused=True)
    first = documents[0]
    return GeneratedAnswer(answer=first.text[:200], source_ids=[first.passage_id])


def instant_steps(**_group: Any) -> Steps:
    """Steps that answer at once (no sub-questions, always sufficient and confident, the first
    passage as the answer): what is left of a run's time is the harness's own. Built as
    `llm._target_` (the llm group's other keys are ignored)."""
    return Steps(
        expand=InstantStep("expand", lambda _q, _n: []),
        analyze=InstantStep("analyze", lambda *_a, **_k: SufficiencyDecision(sufficient=True)),
        generate=InstantStep("generate", _first_passage),
        rewrite=InstantStep("rewrite", lambda question, _h: question),
        classify=InstantStep("classify", lambda _q: QueryClass(query_type="factual")),
        assess=InstantStep("assess", lambda *_a, **_k: ConfidenceAssessment(confidence=1.0)),
    )
