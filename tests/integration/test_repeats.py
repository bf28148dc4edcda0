"""Repeats side by side: the questions of every repeat share one pool of in-flight slots, so no
slot idles while one repeat ends and the next begins (event-based: each question waits until the
test lets it finish; nothing depends on time)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from omegaconf import OmegaConf

from experiments.harness import build
from experiments.harness.evaluate import Evaluator
from experiments.harness.run import _evaluate_repeats
from experiments.results.row import QuestionRow

CASES = 5
SLOTS = 3


class GatedEvaluator(Evaluator):
    """Each question waits for the test's word; the test sees which are in flight."""

    def __init__(self, repeat: int, gates: dict[tuple[int, str], asyncio.Event], flight: set[Any]):
        super().__init__(pipeline=None, k=1, progress=False)  # type: ignore[arg-type]
        self.repeat, self.gates, self.flight = repeat, gates, flight

    async def run_case(self, case: Any, bar: Any = None, repeat: int = 0) -> list[QuestionRow]:
        key = (repeat, case.id)
        self.flight.add(key)
        await self.gates.setdefault(key, asyncio.Event()).wait()
        self.flight.discard(key)
        if bar is not None:
            bar.update(1)
        row = QuestionRow(
            case_id=case.id,
            question_id=case.id,
            set="s",
            query_type="factual",
            turn=1,
            question="?",
            gold_answer="",
            repeat=repeat,
        )
        return [row]


def test_the_questions_of_every_repeat_share_the_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    gates: dict[tuple[int, str], asyncio.Event] = {}
    flight: set[tuple[int, str]] = set()
    monkeypatch.setattr(
        build, "repeat_evaluator", lambda cfg, parts, repeat: GatedEvaluator(repeat, gates, flight)
    )
    cases = [SimpleNamespace(id=f"c{n}") for n in range(CASES)]
    parts = SimpleNamespace(dataset=SimpleNamespace(cases=cases, questions=CASES))
    cfg = OmegaConf.create({"experiment": {"concurrency": SLOTS, "progress": False}})
    journaled: list[str] = []
    journal = SimpleNamespace(append=lambda key, rows: journaled.append(key))
    seen: list[int] = []

    async def drive() -> list[QuestionRow]:
        task = asyncio.ensure_future(
            _evaluate_repeats(cfg, parts, 2, {}, journal)  # type: ignore[arg-type]
        )
        finished = 0
        while finished < 2 * CASES:
            for _ in range(10_000):  # let the harness fill the free slots (counted, not timed)
                if len(flight) >= min(SLOTS, 2 * CASES - finished):
                    break
                await asyncio.sleep(0)
            seen.append(len(flight))
            oldest = min(flight)  # repeat 0 first, then dataset order
            gates[oldest].set()
            while oldest in flight:
                await asyncio.sleep(0)
            finished += 1
        return await task

    rows = asyncio.run(drive())
    # Every slot stayed busy until fewer questions than slots were left, across the repeats'
    # boundary too: repeat 1's first questions were in flight while repeat 0's last were.
    assert seen == [SLOTS] * (2 * CASES - SLOTS + 1) + list(range(SLOTS - 1, 0, -1))
    assert [(r.repeat, r.question_id) for r in rows] == [
        (repeat, f"c{n}") for repeat in range(2) for n in range(CASES)
    ]
    assert sorted(journaled) == sorted(f"{r}:c{n}" for r in range(2) for n in range(CASES))
