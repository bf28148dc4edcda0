"""Run a dataset through a pipeline: concurrent, isolated per question, scored per question."""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from caprag.llm import StepFailedError
from caprag.serve.services import AskResult, Pipeline
from experiments.harness.data import Dataset, EvalCase
from experiments.results import metrics as registry
from experiments.results.metrics import Metric, NotScored
from experiments.results.questions import GoldQuestion
from experiments.results.row import QuestionRow
from experiments.scoring.question import (
    Scorer,
    cost_missing,
    score_adaptive,
    score_answer,
    score_cost,
    score_retrieval,
)


@dataclass
class Evaluator:
    """Answers every case of a dataset with one pipeline and scores each question."""

    pipeline: Pipeline
    k: int
    scorers: Sequence[Scorer] = ()
    concurrency: int = 4
    question_timeout_s: float = 120.0
    progress: bool = True
    reference_text: Callable[[str], str] = lambda _pid: ""
    section_of: dict[str, str] = field(default_factory=dict)
    gold_query_types: bool = True
    """Whether the questions' query types are gold labels (curated sets; not benchmarks)."""
    scoped: Callable[[tuple[str, ...]], Pipeline] | None = None
    """A pipeline that searches only the given passages (a case with a `scope`: the benchmark
    distractor setting)."""
    metrics: Sequence[Metric] = field(default_factory=registry.scored)
    """The registered metrics with their own per-question scorer (experiments.results.metrics),
    as registered when the evaluator is made."""

    def pipeline_for(self, case: EvalCase) -> Pipeline:
        """The shared pipeline, or one confined to the case's own passages."""
        if case.scope is None:
            return self.pipeline
        if self.scoped is None:
            raise ValueError(f"case {case.id} has a passage scope but the evaluator cannot scope")
        return self.scoped(case.scope)

    async def run(
        self,
        dataset: Dataset,
        *,
        done: Mapping[str, list[QuestionRow]] | None = None,
        on_case: Callable[[EvalCase, list[QuestionRow]], None] | None = None,
        repeat: int = 0,
        slots: asyncio.Semaphore | None = None,
        bar: tqdm[Any] | None = None,
    ) -> list[QuestionRow]:
        """All rows, in dataset order; a failing question becomes a failed row, never a crash.

        Cases in `done` (by case id) are not asked again: their rows are used as they are, so a
        resumed run neither loses nor repeats a question. `on_case` sees each case as it ends.
        `slots` and `bar`: the questions in flight and the progress bar, when several repeats
        share them (else the evaluator's own concurrency and a bar of its own).
        """
        done = done or {}
        semaphore = slots or asyncio.Semaphore(max(1, self.concurrency))
        own_bar = bar is None
        if bar is None:
            bar = tqdm(
                total=dataset.questions, unit="q", desc="questions", disable=not self.progress
            )
        bar.update(sum(len(done[c.id]) for c in dataset.cases if c.id in done))

        async def one(case: EvalCase) -> list[QuestionRow]:
            if case.id in done:
                return done[case.id]
            async with semaphore:
                rows = await self.run_case(case, bar, repeat)
            if on_case:
                on_case(case, rows)
            return rows

        # What exists now (index, models, config) outlives the evaluation: frozen, it is not
        # scanned by every full collection (one took 0.5 s of a 2 s evaluation).
        gc.freeze()
        try:
            results = await asyncio.gather(*(one(case) for case in dataset.cases))
        finally:
            gc.unfreeze()
            if own_bar:
                bar.close()
        return [row for rows in results for row in rows]

    async def run_case(
        self, case: EvalCase, bar: tqdm[Any] | None = None, repeat: int = 0
    ) -> list[QuestionRow]:
        """Ask each turn on one thread, then delete the thread's memory (only the rows are
        kept: a long run holds no conversation it has finished); score each turn or record why
        it failed."""
        thread = f"eval-{case.id}-{uuid.uuid4().hex[:8]}"
        pipeline = self.pipeline_for(case)
        try:
            return await self._ask_turns(case, pipeline, thread, bar, repeat)
        finally:
            await pipeline.forget(thread)

    async def _ask_turns(
        self, case: EvalCase, pipeline: Pipeline, thread: str, bar: tqdm[Any] | None, repeat: int
    ) -> list[QuestionRow]:
        rows = []
        for number, turn in enumerate(case.turns, start=1):
            row = QuestionRow(
                case_id=case.id,
                question_id=turn.id,
                set=case.set,
                query_type=turn.query_type,
                turn=number,
                question=turn.question,
                gold_answer=turn.answer,
                gold_ids=list(turn.gold_passages),
                repeat=repeat,
            )
            row.started_ns = time.time_ns()
            try:
                result = await asyncio.wait_for(
                    pipeline.ask(turn.question, thread), self.question_timeout_s
                )
                await self._score(row, turn, result)
            except TimeoutError:
                row.status, row.error = "failed", f"timed out after {self.question_timeout_s:g}s"
            except Exception as exc:  # isolation: record the failure, go on with the run
                row.status, row.error = "failed", f"{type(exc).__name__}: {exc}"
                if isinstance(exc, StepFailedError):
                    row.calls = [exc.usage]
            if row.status != "ok":  # how long it ran before failing: its trace's duration
                row.timings["total"] = (time.time_ns() - row.started_ns) / 1e9
            rows.append(row)
            if bar is not None:
                bar.update(1)
        return rows

    async def _score(self, row: QuestionRow, turn: GoldQuestion, result: AskResult) -> None:
        row.add_answer(result, self.section_of, self.reference_text)
        for values, missing in (score_retrieval(turn, result, self.k), score_answer(turn, result)):
            row.values.update(values)
            row.missing.update(missing)
        row.values.update(score_cost(result))
        row.missing.update(cost_missing(result))
        row.values.update(score_adaptive(result))
        first = result.hops[0] if result.hops else None
        if self.gold_query_types and first is not None and first.query_type:
            row.values["classified_as_gold_type"] = float(first.query_type == turn.query_type)
        for metric in self.metrics:
            score_with(metric, turn, result, self.k, row)
        gold_texts = [self.reference_text(pid) for pid in turn.gold_passages]
        for scorer in self.scorers:
            values, missing = await scorer.score(
                turn.search_text,
                result.answer,
                turn.reference or turn.answer,
                [d.text for d in result.context],
                [t for t in gold_texts if t],
            )
            row.values.update(values)
            row.missing.update(missing)


def score_with(
    metric: Metric, turn: GoldQuestion, result: AskResult, k: int, row: QuestionRow
) -> None:
    """One registered metric's value for the turn into the row, or the reason it has none (its
    scorer's `NotScored`, or the error it raised: the question itself is still answered)."""
    assert metric.score is not None
    try:
        value = metric.score(turn, result, k)
    except Exception as exc:  # a metric's failure is its missing reason, never the question's
        row.missing[metric.name] = f"{type(exc).__name__}: {exc}"
        return
    if isinstance(value, NotScored):
        row.missing[metric.name] = value.reason
    elif value is not None:
        row.values[metric.name] = float(value)
