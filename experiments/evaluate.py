"""Run a dataset through a pipeline: concurrent, isolated per question, scored per question."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import math
import statistics
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tqdm import tqdm

from caprag.llm import StepFailedError
from caprag.services import AskResult, Pipeline
from experiments import metrics
from experiments.data import Dataset, EvalCase
from experiments.questions import GoldQuestion
from experiments.ragas_metrics import Scores

MAX_HOPS_REPORTED = 3
PASSAGE_CHARS = 2000
"""Characters of a retrieved passage's text kept in the row's trace (the rest cut, marked '…'):
the bundled books' passages are all shorter (longest 879), so this only bounds odd corpora."""


class Scorer(Protocol):
    """Extra per-question metrics (RAGAS, a judge)."""

    async def score(
        self,
        question: str,
        answer: str,
        reference: str,
        contexts: Sequence[str],
        reference_contexts: Sequence[str],
    ) -> Scores:
        """Values computed, and reasons for those that could not be."""
        ...


@dataclass
class QuestionRow:
    """One question's outcome: identity, what happened, metric values and missing reasons."""

    case_id: str
    question_id: str
    set: str
    query_type: str
    turn: int
    question: str
    gold_answer: str
    repeat: int = 0
    status: str = "ok"
    error: str = ""
    main_question: str = ""
    answer: str = ""
    context_ids: list[str] = field(default_factory=list)
    gold_ids: list[str] = field(default_factory=list)
    values: dict[str, float] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    trace: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    started_ns: int = 0
    """Wall-clock time (Unix nanoseconds) the question was asked; its trace starts there."""
    calls: list[dict[str, Any]] = field(default_factory=list)
    """Every LLM step of the turn in order (CallUsage as data): rule or model, tokens, and for a
    model call the messages as sent, the reply, attempts and any error. A question that failed on
    a call keeps that call."""

    def record(self) -> dict[str, Any]:
        """A flat row for tables (MLflow, pandas): lists and dicts as JSON strings."""
        row: dict[str, Any] = {
            "case_id": self.case_id,
            "question_id": self.question_id,
            "set": self.set,
            "query_type": self.query_type,
            "turn": self.turn,
            "repeat": self.repeat,
            "question": self.question,
            "main_question": self.main_question,
            "gold_answer": self.gold_answer,
            "answer": self.answer,
            "status": self.status,
            "error": self.error,
            "context_ids": json.dumps(self.context_ids),
            "gold_ids": json.dumps(self.gold_ids),
            "missing": json.dumps(self.missing),
            "trace": json.dumps(self.trace),
            "timings": json.dumps(self.timings),
            "calls": json.dumps(self.calls),
        }
        row.update(self.values)
        return row

    def to_json(self) -> dict[str, Any]:
        """Every field as JSON-ready data (the journal of a run stores rows this way). Its lists
        and dicts are the row's own, not deep copies (`asdict` cost ~1 ms per row, on the event
        loop, for a line that is only serialized)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QuestionRow:
        """The row `to_json` wrote."""
        return cls(**data)


def score_retrieval(turn: GoldQuestion, result: AskResult, k: int) -> Scores:
    """Gold-passage recall@k, precision@k, MRR and cumulative recall after each hop."""
    if not turn.gold_passages:
        reason = "no gold passages (unanswerable question)"
        names = ["recall_at_k", "precision_at_k", "mrr", "distinct_passages"]
        names += [f"recall_hop{h}" for h in range(1, MAX_HOPS_REPORTED + 1)]
        return {}, dict.fromkeys(names, reason)
    context = [doc.passage_id for doc in result.context]
    gold = turn.gold_passages
    hops = [[ref.passage_id for ref in hop.documents] for hop in result.hops]
    curve = metrics.cumulative_recall(hops, gold, MAX_HOPS_REPORTED)
    values = {
        "recall_at_k": metrics.recall_at_k(context, gold, k),
        "precision_at_k": metrics.precision_at_k(context, gold, k),
        "mrr": metrics.reciprocal_rank(context, gold),
        "all_gold_at_k": float(metrics.recall_at_k(context, gold, k) == 1.0),
        "context_recall": metrics.recall_at_k(context, gold, len(context) or 1),
    }
    values.update({f"recall_hop{h}": v for h, v in enumerate(curve, start=1)})
    return values, {}


def score_answer(turn: GoldQuestion, result: AskResult) -> Scores:
    """Exact match and token F1 (best over the gold answer and its aliases) for answerable
    questions; refusal for unanswerable ones."""
    if result.answer_error:
        names = ("exact_match", "f1", "false_refusal", "correct_refusal")
        return {}, {name: result.answer_error for name in names}
    refused = metrics.is_refusal(result.answer)
    if not turn.gold_passages:
        reason = "unanswerable question has no gold answer"
        return {"correct_refusal": float(refused)}, {
            "exact_match": reason,
            "f1": reason,
            "false_refusal": "question is unanswerable",
        }
    golds = [turn.answer, *turn.answer_aliases]  # SQuAD scores against the best gold answer
    return (
        {
            "exact_match": max(metrics.exact_match(result.answer, g) for g in golds),
            "f1": max(metrics.token_f1(result.answer, g) for g in golds),
            "false_refusal": float(refused),
        },
        {"correct_refusal": "question is answerable"},
    )


def score_adaptive(result: AskResult) -> dict[str, float]:
    """Final depth, confidence and stop of depth-adaptive strategies (nothing for the others)."""
    last = result.hops[-1] if result.hops else None
    if last is None or last.depth is None or last.confidence is None:
        return {}
    return {
        "depth": float(last.depth),
        "confidence": float(last.confidence),
        "reached_threshold": float(last.confidence >= (last.threshold or 0.0)),
        "needed_2plus_rounds": float(len(result.hops) >= 2),
        "budget_stop": float((last.adaptive_decision or "").startswith("budget_exhausted")),
    }


def score_cost(result: AskResult) -> dict[str, float]:
    """Hops, LLM calls, tokens, cost, latency and distinct passages retrieved.

    Calls answered from the response cache still count with their original tokens and cost (what
    the strategy needs); `llm_calls_cached` and `cost_usd_spent` say what this run really paid.
    """
    distinct = {ref.passage_id for hop in result.hops for ref in hop.documents}
    cached = [u for u in result.usage if u.cached]
    return {
        "hops": float(result.hop_count),
        "llm_calls": float(len(result.usage)),
        "llm_calls_cached": float(len(cached)),
        "cost_usd_spent": result.cost_usd - sum(u.cost_usd for u in cached),
        "retrieval_calls": float(sum(len(hop.queries) for hop in result.hops)),
        "prompt_tokens": float(result.prompt_tokens),
        "completion_tokens": float(result.completion_tokens),
        "tokens": float(result.prompt_tokens + result.completion_tokens),
        "cost_usd": result.cost_usd,
        "latency_s": result.latency_s,
        "distinct_passages": float(len(distinct)),
    }


def trace_of(
    result: AskResult,
    passages: dict[str, str],
    gold: Sequence[str],
    texts: Callable[[str], str] = lambda _pid: "",
) -> list[dict[str, Any]]:
    """The hop-by-hop trace as plain data, each document marked gold or not; a document's first
    appearance carries its passage text (from `texts`, else the context), cut to PASSAGE_CHARS."""
    context = {doc.passage_id: doc.text for doc in result.context}
    seen: set[str] = set()
    hops = []
    for hop in result.hops:
        data = hop.model_dump()
        for usage in data["usage"]:  # the messages and reply are kept once, in the row's calls
            usage.pop("messages", None)
            usage.pop("reply", None)
        for ref in data["documents"]:
            ref["gold"] = ref["passage_id"] in gold
            ref["section"] = passages.get(ref["passage_id"], "")
            if ref["passage_id"] not in seen:
                seen.add(ref["passage_id"])
                text = texts(ref["passage_id"]) or context.get(ref["passage_id"], "")
                ref["text"] = text if len(text) <= PASSAGE_CHARS else text[:PASSAGE_CHARS] + "…"
        data["prompt_tokens"] = hop.prompt_tokens
        data["completion_tokens"] = hop.completion_tokens
        data["cost_usd"] = hop.cost_usd
        hops.append(data)
    return hops


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
        on_row: Callable[[QuestionRow], None] | None = None,
        *,
        done: Mapping[str, list[QuestionRow]] | None = None,
        on_case: Callable[[EvalCase, list[QuestionRow]], None] | None = None,
        repeat: int = 0,
    ) -> list[QuestionRow]:
        """All rows, in dataset order; a failing question becomes a failed row, never a crash.

        Cases in `done` (by case id) are not asked again: their rows are used as they are, so a
        resumed run neither loses nor repeats a question. `on_case` sees each case as it ends.
        """
        done = done or {}
        semaphore = asyncio.Semaphore(max(1, self.concurrency))
        bar = tqdm(total=dataset.questions, unit="q", desc="questions", disable=not self.progress)
        bar.update(sum(len(done[c.id]) for c in dataset.cases if c.id in done))

        async def one(case: EvalCase) -> list[QuestionRow]:
            if case.id in done:
                return done[case.id]
            async with semaphore:
                rows = await self.run_case(case, bar, repeat)
            if on_case:
                on_case(case, rows)
            for row in rows:
                if on_row:
                    on_row(row)
            return rows

        # What exists now (index, models, config) outlives the evaluation: frozen, it is not
        # scanned by every full collection (one took 0.5 s of a 2 s evaluation).
        gc.freeze()
        try:
            results = await asyncio.gather(*(one(case) for case in dataset.cases))
        finally:
            gc.unfreeze()
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
                    row.calls = [exc.usage.model_dump(mode="json")]
            if row.status != "ok":  # how long it ran before failing: its trace's duration
                row.timings["total"] = (time.time_ns() - row.started_ns) / 1e9
            rows.append(row)
            if bar is not None:
                bar.update(1)
        return rows

    async def _score(self, row: QuestionRow, turn: GoldQuestion, result: AskResult) -> None:
        row.main_question = result.main_question
        row.answer = result.answer
        row.context_ids = [d.passage_id for d in result.context]
        row.timings = {**result.timings, "total": result.latency_s}
        row.trace = trace_of(result, self.section_of, turn.gold_passages, self.reference_text)
        row.calls = [usage.model_dump(mode="json") for usage in result.usage]
        for values, missing in (score_retrieval(turn, result, self.k), score_answer(turn, result)):
            row.values.update(values)
            row.missing.update(missing)
        row.values.update(score_cost(result))
        row.values.update(score_adaptive(result))
        first = result.hops[0] if result.hops else None
        if self.gold_query_types and first is not None and first.query_type:
            row.values["classified_as_gold_type"] = float(first.query_type == turn.query_type)
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


@dataclass(frozen=True)
class Aggregate:
    """A metric's mean over the questions that have it, and how many do."""

    name: str
    mean: float | None
    n: int
    total: int
    missing_reasons: dict[str, int]

    @property
    def coverage(self) -> str:
        """'57/60'."""
        return f"{self.n}/{self.total}"


ALWAYS_SCORED = (
    "recall_at_k",
    "precision_at_k",
    "mrr",
    "recall_hop1",
    "recall_hop2",
    "recall_hop3",
    "exact_match",
    "f1",
    "correct_refusal",
    "false_refusal",
    "hops",
    "retrieval_calls",
    "llm_calls",
    "llm_calls_cached",
    "distinct_passages",
    "prompt_tokens",
    "completion_tokens",
    "tokens",
    "cost_usd",
    "cost_usd_spent",
    "latency_s",
)
"""Metrics every answered question has, as a value or as a missing reason: a run keeps them
(with their coverage) even when no question was answered."""


def aggregate(
    rows: Sequence[QuestionRow], expected: Sequence[str] = ALWAYS_SCORED
) -> dict[str, Aggregate]:
    """Mean of each metric over the rows that have it; failed rows count in the total.

    The `expected` metrics are there even when no row has them (every question failed): their
    coverage is 0/N with the failures as the reason, not an empty table.
    """
    names: list[str] = []
    for row in rows:
        names += [n for n in [*row.values, *row.missing] if n not in names]
    if rows:
        names += [n for n in expected if n not in names]
    result: dict[str, Aggregate] = {}
    for name in names:
        present = [
            r.values[name] for r in rows if name in r.values and not math.isnan(r.values[name])
        ]
        reasons: dict[str, int] = {}
        for row in rows:
            if name in row.values:
                continue
            reason = row.missing.get(name) or (f"question failed: {row.error}" if row.error else "")
            key = reason.split(":")[0] if reason.startswith("question failed") else reason
            reasons[key or "not computed"] = reasons.get(key or "not computed", 0) + 1
        result[name] = Aggregate(
            name=name,
            mean=statistics.fmean(present) if present else None,
            n=len(present),
            total=len(rows),
            missing_reasons=reasons,
        )
    return result


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0-1) by linear interpolation."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary_metrics(rows: Sequence[QuestionRow]) -> dict[str, float]:
    """Run-level numbers beyond means: failures, latency percentiles, hop distribution."""
    ok = [r for r in rows if r.status == "ok"]
    latencies = [r.values["latency_s"] for r in ok if "latency_s" in r.values]
    out: dict[str, float] = {
        "questions": float(len(rows)),
        "failed": float(len(rows) - len(ok)),
    }
    for label, q in (("p50", 0.5), ("p95", 0.95)):
        value = percentile(latencies, q)
        if value is not None:
            out[f"latency_{label}_s"] = value
    later = [r.values["recall_at_k"] for r in ok if r.turn > 1 and "recall_at_k" in r.values]
    if later:
        out["later_turns_recall_at_k"] = statistics.fmean(later)
        out["later_turns"] = float(len(later))
    for hops in range(1, MAX_HOPS_REPORTED + 1):
        out[f"share_hops_{hops}"] = (
            sum(1 for r in ok if r.values.get("hops") == hops) / len(ok) if ok else 0.0
        )
    return out


@dataclass(frozen=True)
class Failures:
    """The failed questions of a run, grouped by kind of error (most common first)."""

    failed: int
    total: int
    kinds: list[tuple[str, int, str]]
    """(kind, count, the first message of that kind) per kind of error."""

    @property
    def all_failed(self) -> bool:
        """Every question of a non-empty run failed: there is no result to read."""
        return self.total > 0 and self.failed == self.total

    def most_common(self, width: int = 160) -> str:
        """'3 of 4: StructuredOutputError: could not parse ...' (the first message of the most
        common kind), cut to `width` characters."""
        if not self.kinds:
            return ""
        _kind, count, message = self.kinds[0]
        text = f"{count} of {self.failed}: {message}"
        return text if len(text) <= width else text[: width - 1] + "…"


def failures(rows: Sequence[QuestionRow]) -> Failures:
    """Count the failed rows by the kind of their error (its exception name, or 'timed out')."""
    found: dict[str, tuple[int, str]] = {}
    for row in rows:
        if row.status == "ok":
            continue
        error = row.error or "no error recorded"
        kind = "timed out" if error.startswith("timed out") else error.split(":", 1)[0]
        count, first = found.get(kind, (0, error))
        found[kind] = (count + 1, first)
    kinds = sorted(
        ((kind, count, first) for kind, (count, first) in found.items()), key=lambda k: -k[1]
    )
    failed = sum(count for _, count, _ in kinds)
    return Failures(failed=failed, total=len(rows), kinds=kinds)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """Call fn and return (result, seconds)."""
    start = time.perf_counter()
    return fn(), time.perf_counter() - start
