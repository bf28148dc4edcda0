"""One MLflow trace per question, written while the run goes on, at the store's pace.

Each trace is built from the question's row (the same object the journal keeps) with its real
timestamps: the question starts at the wall-clock time it was asked (`QuestionRow.started_ns`),
each LLM call at the time it was made (`started_at` of its usage), nodes and hops last as long as
the pipeline measured. A `TraceWriter` process (spawned: it inherits no connection of the
harness) receives the rows as each question finishes and writes whatever is waiting, so
answering never waits on the store.

How a trace is written, in as few store transactions as MLflow's public API allows:
- the root span is an OpenTelemetry span started with the question's real start time on the
  tracer provider MLflow shares (`MLFLOW_USE_DEFAULT_TRACER_PROVIDER=false`, MLflow's documented
  mode for mixing the OpenTelemetry SDK with its own), made current with OpenTelemetry's
  `use_span`; every other span is `mlflow.start_span_no_context(parent_span=..., start_time_ns=...)`
  and each span ends with its real end time, so no child starts before its root;
- the scores are logged with `mlflow.log_assessment` while the root is current: MLflow keeps them
  with the trace in memory and they go to the store inside its one `start_trace`, not one
  transaction each;
- spans are exported asynchronously (`MLFLOW_ENABLE_ASYNC_TRACE_LOGGING`, one export thread) in
  batches of many traces, and the writer waits (`flush_trace_async_logging`) once per batch, never
  per trace, and before either export queue could fill (MLflow drops exports past it);
- a SQLite store is in WAL mode and the writer keeps pooled connections.
Measured on a SQLite file: about 2 commits a trace (its `start_trace` and the experiment read
inside it; the spans of a whole batch share one). `count_back` reads back what the store holds
(one trace per case, its spans and its assessments) against what was sent; the harness writes any
shortfall again and fails the run on what it cannot repair.

MLflow makes the trace ids; a trace is found by its run and its `caprag.case` tag (`find_trace`).
Writing a trace again (a repair, a resumed run) deletes the earlier one of the case first.

What a trace holds, so MLflow's trace list can filter and compare questions:
- tags: case, question id, set, query type, turn, status and strategy (`caprag.*`), e.g.
  `mlflow.search_traces(filter_string="tags.`caprag.set` = 'cross_book'")`;
- assessments: each of the row's scores (`values`: recall@k, all-gold, MRR, F1, correct
  refusal...) as a Feedback from CODE named after the metric, each metric the row could not
  compute as a Feedback carrying its reason as error, and the gold answer and passages as
  Expectations (`feedback.recall_at_k < 1` filters);
- content: a hop span's outputs are its documents in MLflow's retriever format (passage text where
  the row kept it: see `row.PASSAGE_CHARS`), an LLM call's span has its messages and reply in
  the OpenAI chat format (inputs `messages`, outputs `choices`) and `mlflow.chat.messages`;
- a failed question's trace: its root span has status ERROR and an `exception` event with the
  row's error, with the calls the question made before it failed.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import multiprocessing
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import mlflow
from mlflow.entities import (
    Assessment,
    AssessmentError,
    AssessmentSource,
    AssessmentSourceType,
    Expectation,
    Feedback,
    SpanEvent,
    SpanStatus,
    SpanStatusCode,
    SpanType,
)
from mlflow.tracing.constant import AssessmentMetadataKey, SpanAttributeKey, TraceMetadataKey
from opentelemetry import trace as otel
from tqdm import tqdm

from caprag.schemas import CallUsage, RetrievedRef
from experiments.results import tracking
from experiments.results.row import QuestionRow
from experiments.results.spawn import main_not_imported

# How MLflow exports traces, in this process and the writer's (each is read when first used).
# Pooled SQL connections (the writer is spawned, so it inherits none of the harness's).
_WRITER_SETTINGS = {
    # The root span comes from the OpenTelemetry SDK with its real start time: MLflow then uses the
    # global tracer provider, its documented mode for OpenTelemetry spans in MLflow traces.
    "MLFLOW_USE_DEFAULT_TRACER_PROVIDER": "false",
    # Spans and traces go to the store from one export thread, in batches of many traces (one
    # thread: SQLite takes one writer at a time, and parallel ones lose traces to its lock).
    "MLFLOW_ENABLE_ASYNC_TRACE_LOGGING": "true",
    "MLFLOW_ASYNC_TRACE_LOGGING_MAX_WORKERS": "1",
    "MLFLOW_ASYNC_TRACE_LOGGING_MAX_SPAN_BATCH_SIZE": "4096",
    "MLFLOW_ASYNC_TRACE_LOGGING_MAX_INTERVAL_MILLIS": "500",
    "MLFLOW_ASYNC_TRACE_LOGGING_MAX_QUEUE_SIZE": "10000",
}
for _key, _value in _WRITER_SETTINGS.items():
    os.environ.setdefault(_key, _value)

CASE_TAG = "caprag.case"
"""Trace tag naming the case (repeat:question id) a trace belongs to."""
SCORER = AssessmentSource(source_type=AssessmentSourceType.CODE, source_id="caprag.evaluate")
"""Who made a trace's assessments: the evaluator's code (a rewrite replaces only these)."""
CHAT_MESSAGES = "mlflow.chat.messages"
"""Span attribute the MLflow UI reads a chat span's conversation from (messages, then reply)."""
BATCH = 128
"""Traces the writer takes in one batch at most (it writes whatever is waiting, up to this), and
so the most it has in MLflow's export queues before it waits for them: 128 traces of ~8 spans
stay well inside the span queue (4,096) and the task queue (10,000), which drop when full."""
LINGER_S = 0.1
"""Seconds the writer gathers rows after the first of a batch (one search for earlier traces and
one link call per batch). The end of a run does not wait for it: told to flush or stop, the writer
writes what it has at once."""
READ_BACK = 100
"""Traces read back in one query (their ids in one `IN` filter)."""
FLUSH = "flush"
"""Tells the writer to write what it has at once and send the list of what it wrote."""
HOP_ATTRIBUTES = (
    "new_documents",
    "duplicate_documents",
    "prompt_tokens",
    "cost_usd",
    "depth",
    "chunks",
    "confidence",
    "threshold",
    "adaptive_decision",
    "warning",
    "hint",
)


@dataclass(frozen=True)
class Target:
    """Where a run's traces go (and the run's strategy, which its traces are tagged with)."""

    uri: str
    experiment_id: str
    run_id: str
    strategy: str = ""


def case_key(repeat: int, question_id: str) -> str:
    """A case: 'repeat:question id'."""
    return f"{repeat}:{question_id}"


def case_of(row: QuestionRow) -> str:
    """The case a row's trace is tagged with: 'repeat:question id'."""
    return case_key(row.repeat, row.question_id)


@dataclass
class PlannedSpan:
    """One span of a trace as it will be written: where it sits, what it holds, when it ran."""

    key: int
    parent: int | None
    name: str
    kind: str
    inputs: Any
    outputs: Any
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    error: str = ""


@dataclass
class _Trace:
    """The spans of one question's trace (the root first, every parent before its children)."""

    target: Target
    row: QuestionRow
    spans: list[PlannedSpan] = field(default_factory=list)
    ids: int = 0

    @property
    def tags(self) -> dict[str, str]:
        row = self.row
        return {
            CASE_TAG: case_of(row),
            "caprag.question_id": row.question_id,
            "caprag.set": row.set,
            "caprag.query_type": row.query_type or "",
            "caprag.turn": str(row.turn),
            "caprag.status": row.status,
            "caprag.strategy": self.target.strategy,
        }

    def assessments(self) -> list[Assessment]:
        """The row's scores as Feedback (a metric it could not compute: its reason as error) and
        its gold answer and passages as Expectations."""
        row = self.row
        metadata = {AssessmentMetadataKey.SOURCE_RUN_ID: self.target.run_id}
        found: list[Assessment] = []
        missing = dict(row.missing)
        for name, value in sorted(row.values.items()):
            if math.isfinite(value):
                found.append(
                    Feedback(name=name, value=float(value), source=SCORER, metadata=metadata)
                )
            else:
                missing.setdefault(name, f"not a number ({value})")
        found += [
            Feedback(
                name=name,
                error=AssessmentError("NOT_COMPUTED", reason),
                source=SCORER,
                metadata=metadata,
            )
            for name, reason in sorted(missing.items())
            if name not in row.values or not math.isfinite(row.values[name])
        ]
        if row.gold_answer:
            found.append(
                Expectation(
                    name="gold_answer", value=row.gold_answer, source=SCORER, metadata=metadata
                )
            )
        if row.gold_ids:
            found.append(
                Expectation(
                    name="gold_passages", value=row.gold_ids, source=SCORER, metadata=metadata
                )
            )
        return found

    def new_id(self) -> int:
        """The next span's key (its place in this trace)."""
        self.ids += 1
        return self.ids

    def span(
        self,
        name: str,
        kind: str,
        parent: int | None,
        inputs: Any,
        outputs: Any,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, Any] | None = None,
        span_id: int | None = None,
        error: str = "",
    ) -> int:
        """Plan a finished span (a root goes first); returns its key. A span with an error gets
        status ERROR and an `exception` event carrying it."""
        key = span_id or self.new_id()
        planned = PlannedSpan(
            key,
            parent,
            name,
            kind,
            inputs,
            outputs,
            start_ns,
            max(end_ns, start_ns),
            dict(attributes or {}),
            error,
        )
        self.spans.insert(0 if parent is None else len(self.spans), planned)
        return key


def _exception(error: str, at_ns: int) -> SpanEvent:
    """The exception event of a failed question (type and message as recorded)."""
    kind, _, message = error.partition(": ")
    if not message:  # "timed out after 120s": no exception name recorded
        kind, message = "Error", error
    return SpanEvent(  # type: ignore[abstract]  # a dataclass; mypy sees an abstract base
        name="exception",
        timestamp=at_ns,
        attributes={"exception.type": kind, "exception.message": message},
    )


def _ns(seconds: float | None) -> int:
    return int((seconds or 0.0) * 1e9)


class _Timeline:
    """Real times of a question: calls where measured, else laid one after another."""

    def __init__(self, trace: _Trace) -> None:
        self.trace = trace

    def node(
        self,
        parent: int,
        name: str,
        kind: str,
        inputs: Any,
        outputs: Any,
        start_ns: int,
        seconds: float,
        attributes: Mapping[str, Any] | None = None,
        calls: Sequence[CallUsage] = (),
    ) -> int:
        """A span of `seconds` from start_ns with a CHAT_MODEL span per call under it (widened to
        hold its calls); returns its end."""
        windows = self._call_windows(calls, start_ns)
        end_ns = start_ns + _ns(seconds)
        if windows:
            start_ns = min(start_ns, windows[0][0])
            end_ns = max(end_ns, max(end for _start, end in windows))
        span = self.trace.span(name, kind, parent, inputs, outputs, start_ns, end_ns, attributes)
        for call, (call_start, call_end) in zip(calls, windows, strict=True):
            self._call(span, call, call_start, call_end)
        return end_ns

    @staticmethod
    def _call_windows(calls: Sequence[CallUsage], start_ns: int) -> list[tuple[int, int]]:
        windows = []
        t = start_ns
        for call in calls:
            begin = int(call.started_at * 1e9) if call.started_at else t
            t = begin + _ns(call.latency_s)
            windows.append((begin, t))
        return windows

    def _call(self, parent: int, call: CallUsage, start_ns: int, end_ns: int) -> None:
        """The messages as sent and the reply of a model call; the rule and cost of a rule step."""
        attributes: dict[str, Any] = {
            key: str(getattr(call, key))
            for key in ("model", "prompt_tokens", "completion_tokens", "cost_usd", "attempts")
        }
        for key in ("error", "notes", "cached"):
            if getattr(call, key):
                attributes[key] = str(getattr(call, key))
        if call.messages is None:  # a rule step: nothing was sent
            inputs: Any = {"rule": f"no call ({call.prompt_version})"}
            outputs: Any = {"reply": call.reply}
            # The tokens it is priced by (as if its prompt were sent), so the trace list's
            # Tokens column adds up to the run's tokens for an offline run too.
            attributes[SpanAttributeKey.CHAT_USAGE] = usage_of(call)
        else:
            inputs, outputs, chat = _chat(call, call.messages)
            attributes.update(chat)
        self.trace.span(
            f"llm {call.step}",
            SpanType.CHAT_MODEL,
            parent,
            inputs,
            outputs,
            start_ns,
            end_ns,
            attributes,
        )


def _chat(call: CallUsage, messages: list[dict[str, str]]) -> tuple[Any, Any, dict[str, Any]]:
    """A model call in the OpenAI chat format the MLflow UI renders: request (model, messages as
    sent), completion (the reply as the assistant's message), the conversation and token use."""
    reply = call.reply
    model = call.model
    prompt, completion = call.prompt_tokens, call.completion_tokens
    outputs = {
        "object": "chat.completion",
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply},
                "finish_reason": "stop" if reply is not None else "error",
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }
    conversation = [*messages, {"role": "assistant", "content": reply or ""}]
    return (
        {"model": model, "messages": messages},
        outputs,
        {
            CHAT_MESSAGES: conversation,
            SpanAttributeKey.MESSAGE_FORMAT: "openai",
            SpanAttributeKey.CHAT_USAGE: usage_of(call),
        },
    )


def usage_of(call: CallUsage) -> dict[str, int]:
    """A call's tokens in MLflow's standard span attribute (the trace list sums them)."""
    total = call.prompt_tokens + call.completion_tokens
    return {
        "input_tokens": call.prompt_tokens,
        "output_tokens": call.completion_tokens,
        "total_tokens": total,
    }


def documents(row: QuestionRow, refs: Sequence[RetrievedRef]) -> list[dict[str, Any]]:
    """A hop's documents in MLflow's retriever format (page_content, metadata, id): the text the
    row keeps of each passage, the document with its section and whether it is gold."""
    return [
        {
            "page_content": row.passage(ref.passage_id).text,
            "metadata": {
                **ref.model_dump(),
                "gold": row.is_gold(ref.passage_id),
                "section": row.passage(ref.passage_id).section,
            },
            "id": ref.passage_id,
        }
        for ref in refs
    ]


def context_documents(row: QuestionRow) -> list[dict[str, Any]]:
    """The passages handed to generation in MLflow's retriever format (text as the row keeps it)."""
    return [
        {
            "page_content": row.passage(pid).text,
            "metadata": {"passage_id": pid},
            "id": pid,
        }
        for pid in row.context_ids
    ]


def build_trace(row: QuestionRow, target: Target) -> _Trace:
    """The question's trace: a span per node, under retrieve a span per hop (its documents with
    their text), and under those a span per LLM call with its messages as sent and its reply. A
    failed question's trace is its root span (status ERROR) with the calls it made."""
    trace = _Trace(target, row)
    timeline = _Timeline(trace)
    total_ns = _ns(row.timings.get("total"))
    start = row.started_ns or time.time_ns() - total_ns  # rows journaled before started_ns
    if row.status != "ok":
        return _failed(trace, timeline, start, total_ns)
    rewrite_calls, hop_calls, generate_calls = row.calls_by_node()
    root = trace.new_id()
    t = timeline.node(
        root,
        "rewrite",
        SpanType.CHAIN,
        {"question": row.question},
        {"main_question": row.main_question},
        start,
        row.timings.get("rewrite", 0.0),
        calls=rewrite_calls,
    )
    hops_ns = sum(_ns(hop.latency_s) for hop in row.hops)
    retrieve_ns = max(_ns(row.timings.get("retrieve")), hops_ns)
    retrieve = trace.span(
        "retrieve",
        SpanType.RETRIEVER,
        root,
        {"main_question": row.main_question},
        context_documents(row),
        t,
        t + retrieve_ns,
    )
    h = t
    for hop, calls in zip(row.hops, hop_calls, strict=True):
        attributes: dict[str, Any] = {
            key: str(getattr(hop, key)) for key in HOP_ATTRIBUTES if getattr(hop, key) is not None
        }
        if hop.decision is not None:
            attributes["decision"] = hop.decision.model_dump()
        h = timeline.node(
            retrieve,
            f"hop {hop.hop}",
            SpanType.RETRIEVER,
            {"queries": hop.queries},
            documents(row, hop.documents),
            h,
            hop.latency_s,
            attributes,
            calls,
        )
    end = timeline.node(
        root,
        "generate",
        SpanType.LLM,
        {"context": row.context_ids},
        {"answer": row.answer},
        t + retrieve_ns,
        row.timings.get("generate", 0.0),
        calls=generate_calls,
    )
    end = max(end, max(s.end_ns for s in trace.spans), start + total_ns)
    _root(trace, root, {"answer": row.answer, "gold_answer": row.gold_answer}, start, end)
    return trace


def _root(
    trace: _Trace, root: int, outputs: dict[str, Any], start: int, end: int, error: str = ""
) -> None:
    """The question's root span (its children were added under `root` already)."""
    row = trace.row
    strategy = f" · {trace.target.strategy}" if trace.target.strategy else ""
    trace.span(
        # the trace list's Name column: which question of which set, answered by which strategy
        # (the question first: the column cuts long names at its end)
        f"{row.question_id} · {row.set}{strategy}",
        SpanType.CHAIN,
        None,
        {"question": row.question},
        outputs,
        start,
        end,
        {"set": row.set, "query_type": row.query_type},
        span_id=root,
        error=error,
    )


def _failed(trace: _Trace, timeline: _Timeline, start: int, total_ns: int) -> _Trace:
    """A failed question's trace: the calls it made (the one that failed keeps its error), under
    a root span with status ERROR and the row's error as an exception event."""
    row = trace.row
    root = trace.new_id()
    end = start + total_ns
    if row.calls:
        end = max(
            end, timeline.node(root, "calls", SpanType.CHAIN, {}, {}, start, 0.0, calls=row.calls)
        )
    outputs = {"error": row.error, "gold_answer": row.gold_answer}
    _root(trace, root, outputs, start, end, error=row.error or row.status)
    return trace


def _emit(trace: _Trace) -> str:
    """Start one planned trace and end it, each span at its own real start and end time (children
    end before their parents) and its assessments logged while its root is current (so they go
    to the store with the trace); returns the trace's id. The export itself is asynchronous."""
    root, *children = trace.spans
    first = otel.get_tracer(__name__).start_span(root.name, start_time=root.start_ns)
    with otel.use_span(first, end_on_exit=False):
        live_root = mlflow.get_current_active_span()
        if live_root is None:
            first.end(end_time=root.end_ns)
            raise RuntimeError("MLflow did not record the trace's root span (is tracing enabled?)")
        live_root.set_span_type(root.kind)
        live_root.set_inputs(root.inputs)
        live_root.set_attributes(root.attributes)
        mlflow.update_current_trace(
            tags=trace.tags, metadata={TraceMetadataKey.SOURCE_RUN: trace.target.run_id}
        )
        live = {root.key: live_root}
        for span in children:
            assert span.parent is not None
            live[span.key] = mlflow.start_span_no_context(
                span.name,
                span_type=span.kind,
                parent_span=live[span.parent],
                inputs=span.inputs,
                attributes=span.attributes,
                start_time_ns=span.start_ns,
            )
        for span in reversed(children):
            if span.error:
                live[span.key].add_event(_exception(span.error, span.end_ns))
            live[span.key].end(
                outputs=span.outputs, status=_status(span.error), end_time_ns=span.end_ns
            )
        for assessment in trace.assessments():
            mlflow.log_assessment(live_root.trace_id, assessment)
        if root.error:
            live_root.add_event(_exception(root.error, root.end_ns))
        live_root.end(outputs=root.outputs, status=_status(root.error), end_time_ns=root.end_ns)
    return live_root.trace_id


def _status(error: str) -> SpanStatus:
    return SpanStatus(SpanStatusCode.ERROR, error) if error else SpanStatus(SpanStatusCode.OK)


_exporting_to: tuple[str, str] | None = None
"""The store and experiment this process's tracer provider exports to (MLflow resets the
provider when either changes)."""


def _export_to(target: Target) -> None:
    """Point MLflow's tracing at the target's store and experiment (a no-op when it already is)."""
    global _exporting_to
    if _exporting_to == (target.uri, target.experiment_id):
        return
    if mlflow.get_tracking_uri() != target.uri:
        mlflow.set_tracking_uri(target.uri)
    tracking.use_wal(target.uri)
    mlflow.set_experiment(experiment_id=target.experiment_id)
    mlflow.tracing.enable()  # the tracer provider now, before the root span asks for it
    _exporting_to = (target.uri, target.experiment_id)


@dataclass(frozen=True)
class Written:
    """One trace as the writer sent it: its run, its case and the id MLflow gave it."""

    run_id: str
    case: str
    trace_id: str


def write_traces(
    rows: Sequence[QuestionRow], target: Target, earlier: Mapping[str, Sequence[str]] | None = None
) -> list[Written]:
    """Write the traces of rows (answered or failed), replacing any earlier trace of the same
    case in the run (`earlier`: case -> trace ids, when the caller knows them; else the store is
    searched); returns what was sent, once MLflow's export queue has written it."""
    planned = [build_trace(row, target) for row in rows]
    if not planned:
        return []
    _export_to(target)
    client = mlflow.MlflowClient(target.uri)
    cases = {case_of(row) for row in rows}
    if earlier is None:
        old = _trace_ids(target, cases)
    else:
        old = [trace_id for case in cases for trace_id in earlier.get(case, ())]
    if old:
        client.delete_traces(target.experiment_id, trace_ids=old)
    sent = [Written(target.run_id, case_of(trace.row), _emit(trace)) for trace in planned]
    # Once per batch: the batch is in the store. (No `link_traces_to_run`: the run's id is in
    # each trace's metadata, which MLflow's run filter and the run's Traces tab read.)
    mlflow.flush_trace_async_logging()
    return sent


def _run_traces(target: Target, *, spans: bool = False) -> Iterator[mlflow.entities.Trace]:
    """The run's traces (their info only, unless `spans`)."""
    client = mlflow.MlflowClient(target.uri)
    token = None
    while True:
        page = client.search_traces(
            locations=[target.experiment_id],
            run_id=target.run_id,
            include_spans=spans,
            max_results=500,
            page_token=token,
        )
        yield from page
        token = page.token
        if not token:
            return


def _trace_ids(target: Target, cases: set[str]) -> list[str]:
    """The ids of the run's traces of these cases."""
    return [t.info.trace_id for t in _run_traces(target) if t.info.tags.get(CASE_TAG) in cases]


def find_trace(target: Target, case: str) -> str | None:
    """The id of the trace a run wrote for a case ('repeat:question id'), if there is one."""
    return trace_ids(target).get(case)


def trace_ids(target: Target) -> dict[str, str]:
    """The id of the trace a run wrote for each of its traced cases, read in one pass (the
    first one the store lists, when a case has more)."""
    ids: dict[str, str] = {}
    for t in _run_traces(target):
        case = t.info.tags.get(CASE_TAG)
        if case is not None:
            ids.setdefault(str(case), t.info.trace_id)
    return ids


def traced_cases(target: Target) -> set[str]:
    """Cases of a run that have a trace."""
    return set(trace_ids(target))


@dataclass
class CountBack:
    """What the store holds of a run's traces against what its rows should have."""

    expected: int = 0
    missing: list[QuestionRow] = field(default_factory=list)
    """Rows whose case has no trace, or one short of spans or assessments."""
    reasons: dict[str, int] = field(default_factory=dict)
    """How many traces fall short, by what: 'no trace', 'spans', 'assessments'."""
    extra: list[str] = field(default_factory=list)
    """Ids of second traces of a case (a rewrite whose delete did not land)."""
    waited_s: float = 0.0
    """Seconds the run waited for the writer before counting back (`TraceWriter.close`)."""
    seconds: float = 0.0
    """Seconds the count-back took, with any repair (`TraceWriter.close`)."""
    listed: bool = True
    """Whether the count-back read the run's traces from the store (False: every trace had been
    read back, whole, as it was written)."""

    @property
    def complete(self) -> bool:
        return not self.missing and not self.extra

    def line(self) -> str:
        """What is missing, in one line."""
        parts = [f"{count} {reason}" for reason, count in sorted(self.reasons.items())]
        if self.extra:
            parts.append(f"{len(self.extra)} duplicate traces")
        short = len(self.missing)
        return f"{short} of {self.expected} traces incomplete ({', '.join(parts)})"


@dataclass(frozen=True)
class Stored:
    """One trace as the store holds it, read back right after the writer reported it."""

    trace_id: str
    spans: int
    assessments: int


def read_back(target: Target, trace_ids: Sequence[str]) -> dict[str, Stored]:
    """What the store holds of these traces of the run, by case (one query a hundred ids)."""
    client = mlflow.MlflowClient(target.uri)
    found: dict[str, Stored] = {}
    ids = [i for i in trace_ids if i.replace("-", "").isalnum()]  # MLflow's ids: quote-free
    for start in range(0, len(ids), READ_BACK):
        chunk = ids[start : start + READ_BACK]
        listed = ", ".join(f"'{trace_id}'" for trace_id in chunk)
        for t in client.search_traces(
            locations=[target.experiment_id],
            filter_string=f"trace.request_id IN ({listed})",
            include_spans=True,
            max_results=len(chunk),
        ):
            case = str(t.info.tags.get(CASE_TAG))
            found[case] = Stored(t.info.trace_id, len(t.data.spans), len(t.info.assessments))
    return found


def count_back(
    target: Target, rows: Sequence[QuestionRow], seen: Mapping[str, Stored] | None = None
) -> CountBack:
    """Compare what the store holds of each case's trace with what its row makes: one trace,
    its spans and its assessments. `seen` is what the store held of traces read back as they
    were written (`TraceWriter` reads each batch back as soon as the writer reports it); when
    every row's trace is there, whole, nothing is read again. Otherwise (a trace short or
    unseen: a failed write, a resumed run's earlier traces) the run's traces are read back."""
    if seen is not None:
        whole = 0
        for row in rows:
            plan = build_trace(row, target)
            stored = seen.get(case_of(row))
            if not (
                stored
                and stored.spans == len(plan.spans)
                and stored.assessments == len(plan.assessments())
            ):
                break
            whole += 1
        if whole == len(rows):
            return CountBack(expected=len(rows), listed=False)
    stored_traces: dict[str, list[mlflow.entities.Trace]] = {}
    for t in _run_traces(target, spans=True):
        stored_traces.setdefault(str(t.info.tags.get(CASE_TAG)), []).append(t)
    result = CountBack(expected=len(rows))
    for row in rows:
        plan = build_trace(row, target)
        found = stored_traces.get(case_of(row), [])
        complete = [
            t
            for t in found
            if len(t.data.spans) == len(plan.spans)
            and len(t.info.assessments) == len(plan.assessments())
        ]
        if complete:
            result.extra += [t.info.trace_id for t in found if t is not complete[0]]
            continue
        reason = "no trace"
        if found:
            reason = "spans" if len(found[0].data.spans) != len(plan.spans) else "assessments"
        result.reasons[reason] = result.reasons.get(reason, 0) + 1
        result.missing.append(row)
    return result


def repair(
    target: Target, rows: Sequence[QuestionRow], seen: Mapping[str, Stored] | None = None
) -> CountBack:
    """Count back the run's traces; write again each case that falls short (and drop second
    traces of a case), then count again, reading the store: what is still short is what could
    not be repaired."""
    found = count_back(target, rows, seen)
    if found.complete:
        return found
    client = mlflow.MlflowClient(target.uri)
    if found.extra:
        client.delete_traces(target.experiment_id, trace_ids=found.extra)
    if found.missing:
        _warn(f"{found.line()}: writing them again")
        with contextlib.suppress(Exception):  # counted again below
            write_traces(found.missing, target)
    return count_back(target, rows)


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _serve(
    inbox: Any,
    replies: tuple[Connection, Connection],
    parent_pid: int,
    write: Callable[..., list[Written]] | None = None,
) -> None:
    """The writer process: write whatever rows are waiting as one batch, until told to stop or
    the harness is gone (then the rows it sent are written and the process ends). After each
    batch it sends the harness what it wrote; told to flush (a run ended) or to stop, it writes
    what it has at once and then says so. `write` replaces `write_traces` (tests)."""
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    inherited, sender = replies
    inherited.close()  # the harness's end: if the harness dies, sending fails instead of blocking
    pending: list[tuple[Target, QuestionRow]] = []
    known: dict[str, dict[str, list[str]]] = {}  # run id -> case -> trace ids in the store
    stop = False
    flushes = 0

    def take(item: Any) -> None:
        nonlocal stop, flushes
        if item is None:
            stop = True
            return
        if isinstance(item, str):  # FLUSH
            flushes += 1
            return
        target, rows = item
        pending.extend((target, row) for row in rows)

    def send(message: tuple[str, Any]) -> bool:
        """Tell the harness; False when the harness is gone."""
        try:
            sender.send(message)
        except OSError:  # the harness died
            return False
        return True

    alive = True
    while not stop:
        try:
            take(inbox.get(timeout=1.0))
        except queue.Empty:
            if os.getppid() != parent_pid:
                break  # the harness was killed: finish what it sent
            continue
        except (EOFError, OSError):
            break
        # Take what else is waiting and gather for a moment: a batch shares its export's fixed
        # costs (a flush or stop ends the gathering at once).
        deadline = time.monotonic() + LINGER_S
        with contextlib.suppress(queue.Empty):
            while not (stop or flushes) and len(pending) < BATCH:
                take(inbox.get(timeout=max(0.0, deadline - time.monotonic())))
        while pending:
            written = _flush(pending, known, write or write_traces)
            if alive and written:
                alive = send(("wrote", written))
        while flushes and alive:
            flushes -= 1
            alive = send(("flushed", None))
    while pending:
        written = _flush(pending, known, write or write_traces)
        if alive and written:
            alive = send(("wrote", written))
    if alive:
        send(("flushed", None))


def _flush(
    pending: list[tuple[Target, QuestionRow]],
    known: dict[str, dict[str, list[str]]],
    write: Callable[..., list[Written]],
) -> list[Written]:
    """Write up to a batch of the pending rows (earliest first); returns what was written (a
    failure is reported: the harness counts back and writes what is missing)."""
    batch = pending[:BATCH]
    del pending[:BATCH]
    by_target: dict[Target, list[QuestionRow]] = {}
    for target, row in batch:
        by_target.setdefault(target, []).append(row)
    written: list[Written] = []
    for target, rows in by_target.items():
        try:
            if target.run_id not in known:  # a resumed run's earlier traces: read once
                _export_to(target)
                found: dict[str, list[str]] = {}
                for t in _run_traces(target):
                    found.setdefault(str(t.info.tags.get(CASE_TAG)), []).append(t.info.trace_id)
                known[target.run_id] = found
            ids = known[target.run_id]
            done = write(rows, target, ids)
        except Exception as exc:  # the harness counts back at the end and writes what is missing
            _warn(f"the trace writer could not write {len(rows)} traces: {exc!r}")
            known.pop(target.run_id, None)  # what the store holds is unknown now: read it again
            continue
        for item in done:
            ids[item.case] = [item.trace_id]
        written += done
    return written


class TraceWriter:
    """Writes each question's trace in a separate process as the question finishes.

    The process is spawned (it inherits no connection, lock or thread of the harness; it is
    started before the run's journal is opened) and gets rows through a queue; a thread here
    takes its reports as they come, so `close` can show the export's progress and knows which
    traces were written. `close` then counts back what the store holds and writes any shortfall
    in this process. Killed with the harness, the writer writes the rows it was sent and ends;
    the resumed run writes the rest. A writer that dies mid-run is sent nothing more.

    A writer made with `keep=True` outlives `close`: the next run of the same harness process
    uses it again (see `shared`), so a sweep starts it once.
    """

    def __init__(
        self,
        close_timeout_s: float = 600.0,
        *,
        keep: bool = False,
        write: Callable[..., list[Written]] | None = None,
    ) -> None:
        self.close_timeout_s = close_timeout_s
        self.keep = keep
        self.progress = True
        """Whether `close` draws a progress bar while it waits for the export."""
        self.target: Target | None = None
        self._stopped = False
        self._finishing = False
        self._sent: dict[str, int] = {}  # run id -> rows submitted
        self._done: dict[str, int] = {}  # run id -> traces the writer reported
        self._flushed = 0
        self._asked = 0
        self._gone = False
        self._targets: dict[str, Target] = {}  # run id -> where its traces are read back
        self._unchecked: list[Written] = []  # reported written, not read back yet
        self._checking = False
        self._seen: dict[str, dict[str, Stored]] = {}  # run id -> case -> what the store holds
        self._changed = threading.Condition()
        self._owner = os.getpid()
        context = multiprocessing.get_context("spawn")
        self._inbox = context.Queue()
        self._replies, sender = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_serve,
            args=(self._inbox, (self._replies, sender), os.getpid(), write),
            name="caprag-traces",
            daemon=True,
        )
        with main_not_imported():
            self._process.start()
        sender.close()  # the writer's end: when it ends, reading here ends too
        self._reader = threading.Thread(target=self._read, name="caprag-trace-reports", daemon=True)
        self._reader.start()
        self._checker = threading.Thread(target=self._check, name="caprag-trace-check", daemon=True)
        self._checker.start()

    @property
    def pid(self) -> int:
        """The writer process's id."""
        return self._process.pid or 0

    def _read(self) -> None:
        """Take the writer's reports as they come (until its end of the pipe closes)."""
        while True:
            try:
                kind, payload = self._replies.recv()
            except (EOFError, OSError):
                with self._changed:
                    self._gone = True
                    self._changed.notify_all()
                return
            with self._changed:
                if kind == "wrote":
                    for item in payload:
                        self._done[item.run_id] = self._done.get(item.run_id, 0) + 1
                    self._unchecked += payload
                else:
                    self._flushed += 1
                self._changed.notify_all()

    def _check(self) -> None:
        """Read back each batch the writer reports as soon as it does (here, while the run goes
        on: the count-back at the end then has only the last batch left to read), until the
        writer is gone and every report was read back."""
        while True:
            with self._changed:
                while not self._unchecked and not self._gone:
                    self._changed.wait()
                if not self._unchecked:
                    return
                batch, self._unchecked, self._checking = self._unchecked, [], True
            try:
                by_run: dict[str, list[str]] = {}
                for item in batch:
                    by_run.setdefault(item.run_id, []).append(item.trace_id)
                for run_id, ids in by_run.items():
                    found = read_back(self._targets[run_id], ids)
                    with self._changed:
                        self._seen.setdefault(run_id, {}).update(found)
            except Exception:  # what was not read back is read at the end (`count_back`)
                pass
            finally:
                with self._changed:
                    self._checking = False
                    self._changed.notify_all()

    def _wait_checked(self, deadline: float) -> None:
        """Wait until every batch reported so far was read back (or the hang guard ran out)."""
        with self._changed:
            while self._unchecked or self._checking:
                left = deadline - time.monotonic()
                if left <= 0 or not self._checker.is_alive():
                    return
                self._changed.wait(min(left, 1.0))

    def bind(self, target: Target) -> None:
        """The run the following rows belong to."""
        self.target = target
        self._targets[target.run_id] = target

    def submit(self, rows: Sequence[QuestionRow]) -> None:
        """Queue the traces of rows, answered or failed (returns at once; nothing is queued for
        a writer that died: `close` writes those traces)."""
        if rows and self.target is not None and self._alive():
            self._inbox.put((self.target, list(rows)))
            run_id = self.target.run_id
            self._sent[run_id] = self._sent.get(run_id, 0) + len(rows)

    def _alive(self) -> bool:
        """Whether the writer still runs (only the process that started it can tell; any other
        queues its rows regardless)."""
        return not self._stopped and (os.getpid() != self._owner or self._process.is_alive())

    def close(self, rows: Sequence[QuestionRow] = ()) -> CountBack:
        """Wait until the writer wrote everything sent so far (a kept writer then waits for the
        next run; any other ends), showing the export's progress; then count back the run's
        traces against `rows` and write again what falls short. Returns the count back (what
        could not be repaired is in it)."""
        start = time.monotonic()
        if self.keep and not self._stopped:
            if not self.drain():
                self.stop()  # it is gone: reap it and say how it ended
        else:
            self.stop()
        counted = time.monotonic()
        if self.target is None:
            return CountBack(waited_s=counted - start)
        self._wait_checked(counted + self.close_timeout_s)
        with self._changed:
            seen = self._seen.pop(self.target.run_id, {})
        if not rows:
            return CountBack(waited_s=counted - start)
        found = repair(self.target, rows, seen)
        found.waited_s, found.seconds = counted - start, time.monotonic() - counted
        return found

    def drain(self) -> bool:
        """Have a kept writer write everything sent so far and wait until it has (a bar shows
        its progress); False when it ended first or the hang guard ran out."""
        self.finish()
        try:
            return self._wait_flushed()
        finally:
            self._finishing = False

    def _wait_flushed(self) -> bool:
        """Wait for the writer to say it wrote everything asked so far (a bar shows its
        progress); False when it ended first or the hang guard ran out."""
        run_id = self.target.run_id if self.target is not None else ""
        total = self._sent.get(run_id, 0)
        done = min(total, self._done.get(run_id, 0))
        bar = tqdm(
            total=total,
            initial=done,
            unit="trace",
            desc="traces",
            disable=not self.progress or done >= total,
            file=sys.stderr,
        )
        deadline = time.monotonic() + self.close_timeout_s
        try:
            with self._changed:
                while self._flushed < self._asked and not self._gone:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._changed.wait(min(left, 1.0))
                    bar.update(min(total, self._done.get(run_id, 0)) - bar.n)
                return self._flushed >= self._asked
        finally:
            bar.update(min(total, self._done.get(run_id, 0)) - bar.n)  # what was written
            bar.close()

    def finish(self) -> None:
        """Tell the writer no more rows come for now: it writes what it has at once (and ends,
        unless it is kept for later runs)."""
        if self._finishing or self._stopped:
            return
        self._finishing = True
        with self._changed:
            self._asked += 1
        if self.keep:
            self._inbox.put(FLUSH)
        else:
            self._inbox.put(None)
            self._inbox.close()

    def stop(self) -> None:
        """Let the writer finish what it was sent, take its reports and wait for it to end (a
        no-op once stopped)."""
        if self._stopped:
            return
        self._stopped = True
        if self.keep or not self._finishing:
            self._finishing = True
            with self._changed:
                self._asked += 1
            with contextlib.suppress(ValueError, OSError):  # its queue is already closed
                self._inbox.put(None)
            self._inbox.close()
        deadline = time.monotonic() + self.close_timeout_s
        self._process.join(max(0.0, deadline - time.monotonic()))
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(10)
            _warn(f"the trace writer did not finish within {self.close_timeout_s:g} s")
        elif self._process.exitcode:
            _warn(f"the trace writer ended with exit code {self._process.exitcode}")
        self._reader.join(10)
        self._replies.close()
        self._checker.join(self.close_timeout_s)
        # Rows still queued for a writer that is gone must not hold this process at exit.
        self._inbox.cancel_join_thread()

    def written(self, run_id: str) -> int:
        """How many traces of a run the writer reported written."""
        return self._done.get(run_id, 0)


_shared: TraceWriter | None = None


def shared() -> TraceWriter:
    """This harness process's kept writer: started at its first traced run (`run` starts it
    before it builds anything, so it imports MLflow while the run builds), used again by every
    later run while it lives, stopped when the process exits."""
    global _shared
    if _shared is None or not _shared._alive():
        if _shared is None:
            atexit.register(_stop_shared)
        else:
            _shared.stop()  # a writer that died: reap it (and say how it ended)
        _shared = TraceWriter(keep=True)
    return _shared


def _stop_shared() -> None:
    if _shared is not None and _shared._owner == os.getpid():
        _shared.stop()


@contextlib.contextmanager
def writer(enabled: bool) -> Iterator[TraceWriter | None]:
    """The trace writer of one run (None when traces are off): the process's kept writer, which
    has written everything this run sent however the run ends."""
    if not enabled:
        yield None
        return
    trace_writer = shared()
    trace_writer.target = None
    try:
        yield trace_writer
    finally:
        trace_writer.close()
