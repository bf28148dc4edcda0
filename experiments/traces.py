"""One MLflow trace per question, written while the run goes on.

Each trace is built from the question's row (the same object the journal keeps) with its real
timestamps: the question starts at the wall-clock time it was asked (`QuestionRow.started_ns`),
each LLM call at the time it was made (`started_at` of its usage), nodes and hops last as long as
the pipeline measured. A `TraceWriter` process receives the rows as each question finishes and
writes whatever is waiting as one batch through MLflow's batch span API (one transaction per batch,
plus one to link the batch to the run), so answering never waits on the store; at the end it sends
back the traces it wrote, and the harness searches the store only for the rest. Trace and span
ids derive from the run and the case: writing a trace again (a resumed run) replaces it instead of
adding a second one.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import multiprocessing
import os
import queue
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import mlflow
from mlflow.entities import Span, SpanType, TraceData, TraceInfo, TraceLocation, TraceState
from mlflow.store.tracking.abstract_store import AbstractStore
from mlflow.tracing.client import TracingClient
from mlflow.tracing.constant import SpanAttributeKey, TraceMetadataKey, TraceTagKey
from mlflow.tracing.utils import dump_span_attribute_value
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags

from experiments.evaluate import QuestionRow

CASE_TAG = "caprag.case"
"""Trace tag naming the case (repeat:question id) a trace belongs to."""
BATCH = 64
"""Traces the writer puts in one transaction at most (it writes whatever is waiting, up to this)."""
LINGER_S = 0.1
"""Seconds the writer gathers rows after the first of a batch: a transaction's fixed cost shared by
~8 traces instead of ~2 costs about 5.5 instead of 8 ms of CPU per trace. The end of a run does not
wait for it: told to flush or stop, the writer writes what it has at once."""
FLUSH = "flush"
"""Tells the writer to write what it has at once and send the list of what it wrote."""
LINKS_PER_CALL = 100
"""MLflow links at most 100 traces to a run per call."""
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
    """Where a run's traces go."""

    uri: str
    experiment_id: str
    run_id: str


def case_of(row: QuestionRow) -> str:
    """The case a row's trace is tagged with: 'repeat:question id'."""
    return f"{row.repeat}:{row.question_id}"


@functools.cache
def _resource() -> Resource:
    """The OpenTelemetry resource of every span: what `ReadableSpan` would detect for each span
    (service name, SDK; MLflow stores its attributes as trace tags), detected once per process
    instead of per span (detection starts a thread pool: ~1.5 ms a span)."""
    return Resource.create()


def _digest(*parts: str) -> bytes:
    return hashlib.sha256("/".join(parts).encode()).digest()


@dataclass
class _Trace:
    """The spans of one question's trace, built parent first."""

    target: Target
    row: QuestionRow
    otel_id: int = 0
    trace_id: str = ""
    spans: list[Span] = field(default_factory=list)
    ids: int = 0

    def __post_init__(self) -> None:
        self.otel_id = int.from_bytes(_digest(self.target.run_id, case_of(self.row))[:16], "big")
        self.trace_id = f"tr-{self.otel_id:032x}"

    @property
    def tags(self) -> dict[str, str]:
        row = self.row
        return {
            CASE_TAG: case_of(row),
            "caprag.question_id": row.question_id,
            "caprag.set": row.set,
            "caprag.query_type": row.query_type or "",
            TraceTagKey.TRACE_NAME: f"question {row.question_id}",
        }

    def new_id(self) -> int:
        """The next span id: the same for the same trace and position, so a rewrite replaces."""
        self.ids += 1
        return int.from_bytes(_digest(self.trace_id, str(self.ids))[:8], "big") or 1

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
    ) -> int:
        """Add a finished span (a root goes first); returns its id."""
        span_id = span_id or self.new_id()
        values: dict[str, Any] = {
            SpanAttributeKey.REQUEST_ID: self.trace_id,
            SpanAttributeKey.SPAN_TYPE: kind,
            **(attributes or {}),
            SpanAttributeKey.INPUTS: inputs,
            SpanAttributeKey.OUTPUTS: outputs,
        }
        if parent is None:
            values.update({SpanAttributeKey.TRACE_TAG_PREFIX + k: v for k, v in self.tags.items()})
        self.spans.insert(
            0 if parent is None else len(self.spans),
            Span(
                ReadableSpan(
                    name=name,
                    context=self._context(span_id),
                    parent=self._context(parent) if parent is not None else None,
                    attributes={k: dump_span_attribute_value(v) for k, v in values.items()},
                    start_time=start_ns,
                    end_time=max(end_ns, start_ns),
                    status=Status(StatusCode.OK),
                    resource=_resource(),
                )
            ),
        )
        return span_id

    def _context(self, span_id: int) -> SpanContext:
        return SpanContext(
            trace_id=self.otel_id,
            span_id=span_id,
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )

    def info(self) -> TraceInfo:
        """The trace's info, for stores that take whole traces (no span API)."""
        root = self.spans[0]
        return TraceInfo(
            trace_id=self.trace_id,
            trace_location=TraceLocation.from_experiment_id(self.target.experiment_id),
            request_time=root.start_time_ns // 1_000_000,
            execution_duration=((root.end_time_ns or root.start_time_ns) - root.start_time_ns)
            // 1_000_000,
            state=TraceState.OK,
            trace_metadata={TraceMetadataKey.SOURCE_RUN: self.target.run_id},
            tags=self.tags,
        )


def _ns(seconds: float | None) -> int:
    return int((seconds or 0.0) * 1e9)


def _split_calls(
    row: QuestionRow,
) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """The row's calls by node: rewrite, each hop, generate (in the order the turn made them)."""
    calls = list(row.calls)
    rewrite = [calls.pop(0)] if calls and calls[0].get("step") == "rewrite" else []
    generate = [calls.pop()] if calls and calls[-1].get("step") == "generate" else []
    hops = []
    for hop in row.trace:
        count = len(hop.get("usage") or [])
        hops.append(calls[:count])
        calls = calls[count:]
    return rewrite, hops, generate


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
        calls: Sequence[Mapping[str, Any]] = (),
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
    def _call_windows(calls: Sequence[Mapping[str, Any]], start_ns: int) -> list[tuple[int, int]]:
        windows = []
        t = start_ns
        for call in calls:
            started = call.get("started_at")
            begin = int(started * 1e9) if started else t
            t = begin + _ns(call.get("latency_s"))
            windows.append((begin, t))
        return windows

    def _call(self, parent: int, call: Mapping[str, Any], start_ns: int, end_ns: int) -> None:
        """The messages as sent and the reply of a model call; the rule and cost of a rule step."""
        attributes = {
            key: str(call[key])
            for key in ("model", "prompt_tokens", "completion_tokens", "cost_usd", "attempts")
            if call.get(key) is not None
        }
        for key in ("error", "notes", "cached"):
            if call.get(key):
                attributes[key] = str(call[key])
        self.trace.span(
            f"llm {call['step']}",
            SpanType.CHAT_MODEL,
            parent,
            {"messages": call.get("messages") or f"(rule: no call, {call.get('prompt_version')})"},
            {"reply": call.get("reply")},
            start_ns,
            end_ns,
            attributes,
        )


def build_trace(row: QuestionRow, target: Target) -> _Trace:
    """The question's trace: a span per node, under retrieve a span per hop, and under those a
    span per LLM call with its messages as sent and its reply."""
    trace = _Trace(target, row)
    timeline = _Timeline(trace)
    total_ns = _ns(row.timings.get("total"))
    start = row.started_ns or time.time_ns() - total_ns  # rows journaled before started_ns
    rewrite_calls, hop_calls, generate_calls = _split_calls(row)
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
    hops_ns = sum(_ns(hop.get("latency_s")) for hop in row.trace)
    retrieve_ns = max(_ns(row.timings.get("retrieve")), hops_ns)
    retrieve = trace.span(
        "retrieve",
        SpanType.RETRIEVER,
        root,
        {"main_question": row.main_question},
        {"context": row.context_ids},
        t,
        t + retrieve_ns,
    )
    h = t
    for hop, calls in zip(row.trace, hop_calls, strict=True):
        h = timeline.node(
            retrieve,
            f"hop {hop['hop']}",
            SpanType.RETRIEVER,
            {"queries": hop["queries"]},
            {"documents": hop["documents"], "decision": hop.get("decision")},
            h,
            float(hop.get("latency_s", 0.0)),
            {key: str(hop[key]) for key in HOP_ATTRIBUTES if hop.get(key) is not None},
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
    trace.span(
        f"question {row.question_id}",
        SpanType.CHAIN,
        None,
        {"question": row.question},
        {"answer": row.answer, "gold_answer": row.gold_answer},
        start,
        max(end, max(s.end_time_ns or 0 for s in trace.spans), start + total_ns),
        {"set": row.set, "query_type": row.query_type},
        span_id=root,
    )
    return trace


def _store_writes_spans(client: TracingClient) -> bool:
    """Whether the store takes spans in batches (SQL stores, a tracking server)."""
    return type(client.store).log_spans is not AbstractStore.log_spans


def write_traces(rows: Sequence[QuestionRow], target: Target) -> list[str]:
    """Write the traces of answered rows in one batch; returns their cases.

    A store with the span API gets every span in one call, then the traces are linked to the
    run; any other store (a file store) gets each trace whole."""
    traces = [build_trace(row, target) for row in rows if row.status == "ok"]
    if not traces:
        return []
    client = TracingClient(target.uri)
    if _store_writes_spans(client):
        client.log_spans(target.experiment_id, [s for trace in traces for s in trace.spans])
    else:
        for trace in traces:
            info = client.start_trace(trace.info())
            client._upload_trace_data(info, TraceData(spans=trace.spans))
    ids = [trace.trace_id for trace in traces]
    runs = mlflow.MlflowClient(target.uri)
    for at in range(0, len(ids), LINKS_PER_CALL):
        runs.link_traces_to_run(ids[at : at + LINKS_PER_CALL], target.run_id)
    return [case_of(trace.row) for trace in traces]


def traced_cases(target: Target) -> set[str]:
    """Cases of a run that have a trace."""
    client = mlflow.MlflowClient(target.uri)
    cases: set[str] = set()
    token = None
    while True:
        page = client.search_traces(
            locations=[target.experiment_id],
            run_id=target.run_id,
            include_spans=False,
            max_results=500,
            page_token=token,
        )
        cases.update(str(t.info.tags[CASE_TAG]) for t in page if CASE_TAG in t.info.tags)
        token = page.token
        if not token:
            return cases


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _fresh_store_connections(uri: str) -> None:
    """Drop the SQL connections a forked process inherited (its parent keeps using them)."""
    engine = getattr(TracingClient(uri).store, "engine", None)
    if engine is not None:
        engine.dispose(close=False)


def _serve(inbox: Any, replies: tuple[Connection, Connection], parent_pid: int) -> None:
    """The writer process: write whatever rows are waiting as one batch, until told to stop or
    the harness is gone (then the rows it sent are written and the process ends). Told to flush
    (a run ended) or to stop, it writes what it has at once and sends the harness the
    (run id, case) of every trace it wrote since its last such list."""
    inherited, sender = replies
    inherited.close()  # the harness's end: if the harness dies, sending fails instead of blocking
    written: list[tuple[str, str]] = []
    seen: set[str] = set()
    pending: list[tuple[Target, QuestionRow]] = []
    stop = False
    report = False

    def take(item: Any) -> None:
        nonlocal stop, report
        if item is None:
            stop = True
            return
        if isinstance(item, str):  # FLUSH
            report = True
            return
        target, rows = item
        if target.uri not in seen:
            seen.add(target.uri)
            _fresh_store_connections(target.uri)
        pending.extend((target, row) for row in rows)

    def send() -> bool:
        """Hand the harness the list of traces written; False when the harness is gone."""
        try:
            sender.send(written)
        except OSError:  # the harness died after asking
            return False
        written.clear()
        return True

    while not stop:
        try:
            take(inbox.get(timeout=1.0))
        except queue.Empty:
            if os.getppid() != parent_pid:
                break  # the harness was killed: finish what it sent
            continue
        except (EOFError, OSError):
            break
        # Take what else is waiting and gather for a moment: a transaction's fixed cost is worth
        # sharing (a flush or stop ends the gathering at once).
        deadline = time.monotonic() + LINGER_S
        with contextlib.suppress(queue.Empty):
            while not (stop or report) and len(pending) < BATCH:
                take(inbox.get(timeout=max(0.0, deadline - time.monotonic())))
        written += _flush(pending)
        if report and not stop:
            report = False
            if not send():
                return
    written += _flush(pending)
    if stop:
        send()


def _flush(pending: list[tuple[Target, QuestionRow]]) -> list[tuple[str, str]]:
    """Write the pending rows; returns the (run id, case) of the traces written (a failure is
    reported; the harness writes what is missing)."""
    by_target: dict[Target, list[QuestionRow]] = {}
    for target, row in pending:
        by_target.setdefault(target, []).append(row)
    pending.clear()
    written: list[tuple[str, str]] = []
    for target, rows in by_target.items():
        try:
            written += [(target.run_id, case) for case in write_traces(rows, target)]
        except Exception as exc:  # the harness checks at the end and writes the missing ones
            _warn(f"the trace writer could not write {len(rows)} traces: {exc!r}")
    return written


class TraceWriter:
    """Writes each question's trace in a separate process as the question finishes.

    The process is forked before the run's journal is opened (so it never holds the journal's
    lock) and gets rows through a queue; `close` waits for its list of the traces it wrote,
    then writes in this process, with a warning, any trace it did not write. Killed with the
    harness, it writes the rows it was sent and ends; the resumed run writes the rest. A writer
    that dies mid-run is sent nothing more; `close` writes its traces.

    A writer made with `keep=True` outlives `close`: the next run of the same harness process
    uses it again (see `shared`), so a sweep forks it once and its later runs pay no fork (and
    none of the copy-on-write page faults a fork of the whole harness costs its parent).
    """

    def __init__(self, close_timeout_s: float = 600.0, *, keep: bool = False) -> None:
        self.close_timeout_s = close_timeout_s
        self.keep = keep
        self.target: Target | None = None
        self._stopped = False
        self._finishing = False
        self._written: set[tuple[str, str]] = set()
        self._owner = os.getpid()
        context = multiprocessing.get_context("fork")
        self._inbox = context.Queue()
        self._replies, sender = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_serve,
            args=(self._inbox, (self._replies, sender), os.getpid()),
            name="caprag-traces",
            daemon=True,
        )
        self._process.start()
        sender.close()  # the writer's end: when it ends, reading here ends too

    @property
    def pid(self) -> int:
        """The writer process's id."""
        return self._process.pid or 0

    def bind(self, target: Target) -> None:
        """The run the following rows belong to."""
        self.target = target

    def submit(self, rows: Sequence[QuestionRow]) -> None:
        """Queue the traces of answered rows (returns at once; nothing is queued for a writer
        that died: `close` writes those traces)."""
        answered = [row for row in rows if row.status == "ok"]
        if answered and self.target is not None and self._alive():
            self._inbox.put((self.target, answered))

    def _alive(self) -> bool:
        """Whether the writer still runs (only the process that started it can tell; any other
        queues its rows regardless)."""
        return not self._stopped and (os.getpid() != self._owner or self._process.is_alive())

    def close(self, rows: Sequence[QuestionRow] = ()) -> int:
        """Wait until the writer wrote everything sent so far (a kept writer then waits for the
        next run; any other ends), then make sure every answered row in `rows` has its trace;
        returns how many of them do. Only rows the writer did not report (a resumed run's
        earlier ones, a failing writer's) are looked up in the store."""
        if self.keep and not self._stopped:
            self.finish()
            if not self._collect():
                self.stop()  # it is gone: reap it and say how it ended
            self._finishing = False
        else:
            self.stop()
        answered = [row for row in rows if row.status == "ok"]
        if self.target is None or not answered:
            return 0
        run_id = self.target.run_id
        unconfirmed = [row for row in answered if (run_id, case_of(row)) not in self._written]
        if unconfirmed:
            done = traced_cases(self.target)
            missing = [row for row in unconfirmed if case_of(row) not in done]
            if missing:
                _warn(
                    f"{len(missing)} traces were not written by the trace writer: writing them now"
                )
                write_traces(missing, self.target)
        return len(answered)

    def _collect(self) -> bool:
        """Take the writer's next list of written traces; False when it ended without one."""
        with contextlib.suppress(EOFError, OSError):
            if self._replies.poll(self.close_timeout_s):
                self._written.update(self._replies.recv())
                return True
        return False

    def finish(self) -> None:
        """Tell the writer no more rows come for now: it writes what it has at once (and ends,
        unless it is kept for later runs)."""
        if self._finishing or self._stopped:
            return
        self._finishing = True
        if self.keep:
            self._inbox.put(FLUSH)
        else:
            self._inbox.put(None)
            self._inbox.close()

    def stop(self) -> None:
        """Let the writer finish what it was sent, take its lists of written traces and wait for
        it to end (a no-op once stopped)."""
        if self._stopped:
            return
        self._stopped = True
        if self.keep or not self._finishing:
            self._finishing = True
            with contextlib.suppress(ValueError, OSError):  # its queue is already closed
                self._inbox.put(None)
            self._inbox.close()
        deadline = time.monotonic() + self.close_timeout_s
        while self._collect():  # a kept writer may owe the list of a flush besides its last
            if time.monotonic() > deadline:
                break
        self._replies.close()
        self._process.join(max(0.0, deadline - time.monotonic()))
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(10)
            _warn(f"the trace writer did not finish within {self.close_timeout_s:g} s")
        elif self._process.exitcode:
            _warn(f"the trace writer ended with exit code {self._process.exitcode}")
        # Rows still queued for a writer that is gone must not hold this process at exit.
        self._inbox.cancel_join_thread()


_shared: TraceWriter | None = None


def shared() -> TraceWriter:
    """This harness process's kept writer: started at its first traced run (`run` starts it
    before it builds anything, so the fork copies as little as possible), used again by every
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
    trace_writer._written.clear()
    try:
        yield trace_writer
    finally:
        trace_writer.close()
