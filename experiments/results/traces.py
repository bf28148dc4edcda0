"""One MLflow trace per question, written while the run goes on.

Each trace is built from the question's row (the same object the journal keeps) with its real
timestamps: the question starts at the wall-clock time it was asked (`QuestionRow.started_ns`),
each LLM call at the time it was made (`started_at` of its usage), nodes and hops last as long as
the pipeline measured. A `TraceWriter` process receives the rows as each question finishes and
writes whatever is waiting through MLflow's public tracing API (`MlflowClient.start_trace`,
`start_span`, `end_span`, `end_trace` with each span's real start and end times; then
`mlflow.log_assessment`; then `link_traces_to_run`), so answering never waits on the store; at
the end it sends back the traces it wrote, and the harness searches the store only for the rest.
MLflow makes the trace ids; a trace is found by its run and its `caprag.case` tag (`find_trace`).
Writing a trace again (a resumed run) deletes the earlier one of the case first.

What a trace holds, so MLflow's trace list can filter and compare questions:
- tags: case, question id, set, query type, turn, status and strategy (`caprag.*`), e.g.
  `mlflow.search_traces(filter_string="tags.`caprag.set` = 'cross_book'")`;
- assessments: each of the row's scores (`values`: recall@k, all-gold, MRR, F1, correct
  refusal...) as a Feedback from CODE named after the metric, each metric the row could not
  compute as a Feedback carrying its reason as error, and the gold answer and passages as
  Expectations (`feedback.recall_at_k < 1` filters), one `log_assessment` call each (MLflow has no
  public batch call for assessments of a written trace: ~17 calls a trace, in the writer process);
- content: a hop span's outputs are its documents in MLflow's retriever format (passage text where
  the row kept it: see `row.PASSAGE_CHARS`), an LLM call's span has its messages and reply in
  the OpenAI chat format (inputs `messages`, outputs `choices`) and `mlflow.chat.messages`;
- a failed question's trace: its root span has status ERROR and an `exception` event with the
  row's error, with the calls the question made before it failed.
"""

from __future__ import annotations

import atexit
import contextlib
import math
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
from mlflow.tracing.constant import AssessmentMetadataKey, SpanAttributeKey

from caprag.schemas import CallUsage, RetrievedRef
from experiments.results.row import QuestionRow

# The writer is a fork of the harness: with no pooled SQL connections (a documented MLflow
# setting), it inherits none that its parent goes on using. Costs a connect per store session.
os.environ.setdefault("MLFLOW_SQLALCHEMYSTORE_POOLCLASS", "NullPool")
# Traces are exported as each ends, in the writer: MLflow's background export threads contend
# for a SQLite store's lock and lose traces ("database is locked": 2 of 150 seen).
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")

CASE_TAG = "caprag.case"
"""Trace tag naming the case (repeat:question id) a trace belongs to."""
SCORER = AssessmentSource(source_type=AssessmentSourceType.CODE, source_id="caprag.evaluate")
"""Who made a trace's assessments: the evaluator's code (a rewrite replaces only these)."""
CHAT_MESSAGES = "mlflow.chat.messages"
"""Span attribute the MLflow UI reads a chat span's conversation from (messages, then reply)."""
BATCH = 64
"""Traces the writer takes in one batch at most (it writes whatever is waiting, up to this)."""
LINGER_S = 0.1
"""Seconds the writer gathers rows after the first of a batch (one search for earlier traces and
one link call per batch). The end of a run does not wait for it: told to flush or stop, the writer
writes what it has at once."""
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


def _emit(client: mlflow.MlflowClient, trace: _Trace) -> str:
    """Write one planned trace through MLflow's span API, each span with its own start and end
    time (children end before their parents); returns the trace's id."""
    root, *children = trace.spans
    live = {
        root.key: client.start_trace(
            root.name,
            span_type=root.kind,
            inputs=root.inputs,
            attributes=root.attributes,
            tags=trace.tags,
            experiment_id=trace.target.experiment_id,
            start_time_ns=root.start_ns,
            run_id=trace.target.run_id,
        )
    }
    trace_id = live[root.key].trace_id
    for span in children:
        assert span.parent is not None
        live[span.key] = client.start_span(
            span.name,
            trace_id=trace_id,
            parent_id=live[span.parent].span_id,
            span_type=span.kind,
            inputs=span.inputs,
            attributes=span.attributes,
            start_time_ns=span.start_ns,
        )
    for span in reversed(children):
        if span.error:
            live[span.key].add_event(_exception(span.error, span.end_ns))
        client.end_span(
            trace_id,
            live[span.key].span_id,
            outputs=span.outputs,
            status=_status(span.error),
            end_time_ns=span.end_ns,
        )
    if root.error:
        live[root.key].add_event(_exception(root.error, root.end_ns))
    client.end_trace(
        trace_id,
        outputs=root.outputs,
        status=_status(root.error),
        end_time_ns=root.end_ns,
    )
    return trace_id


def _status(error: str) -> SpanStatus:
    return SpanStatus(SpanStatusCode.ERROR, error) if error else SpanStatus(SpanStatusCode.OK)


def write_traces(rows: Sequence[QuestionRow], target: Target) -> list[str]:
    """Write the traces of rows (answered or failed), replacing any earlier trace of the same
    case in the run; returns their cases.

    Spans go through MLflow's tracing API, then the assessments (`mlflow.log_assessment`), then
    the traces are linked to the run (`link_traces_to_run`)."""
    planned = [build_trace(row, target) for row in rows]
    if not planned:
        return []
    if mlflow.get_tracking_uri() != target.uri:
        mlflow.set_tracking_uri(target.uri)  # where the tracer exports and assessments go
    client = mlflow.MlflowClient(target.uri)
    earlier = _trace_ids(target, {case_of(row) for row in rows})
    if earlier:
        client.delete_traces(target.experiment_id, trace_ids=earlier)
    ids = [_emit(client, trace) for trace in planned]
    mlflow.flush_trace_async_logging()  # the traces are in the store before their assessments
    for trace, trace_id in zip(planned, ids, strict=True):
        for assessment in trace.assessments():
            mlflow.log_assessment(trace_id, assessment)
    for at in range(0, len(ids), LINKS_PER_CALL):
        client.link_traces_to_run(ids[at : at + LINKS_PER_CALL], target.run_id)
    return [case_of(trace.row) for trace in planned]


def _run_traces(target: Target) -> Iterator[mlflow.entities.Trace]:
    """The run's traces (their info only)."""
    client = mlflow.MlflowClient(target.uri)
    token = None
    while True:
        page = client.search_traces(
            locations=[target.experiment_id],
            run_id=target.run_id,
            include_spans=False,
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
    found = _trace_ids(target, {case})
    return found[0] if found else None


def trace_ids(target: Target) -> dict[str, str]:
    """The id of the trace a run wrote for each of its traced cases, read in one pass (the
    first one, as `find_trace` gives it, when a case has more)."""
    ids: dict[str, str] = {}
    for t in _run_traces(target):
        case = t.info.tags.get(CASE_TAG)
        if case is not None:
            ids.setdefault(str(case), t.info.trace_id)
    return ids


def traced_cases(target: Target) -> set[str]:
    """Cases of a run that have a trace."""
    return set(trace_ids(target))


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _serve(inbox: Any, replies: tuple[Connection, Connection], parent_pid: int) -> None:
    """The writer process: write whatever rows are waiting as one batch, until told to stop or
    the harness is gone (then the rows it sent are written and the process ends). Told to flush
    (a run ended) or to stop, it writes what it has at once and sends the harness the
    (run id, case) of every trace it wrote since its last such list."""
    inherited, sender = replies
    inherited.close()  # the harness's end: if the harness dies, sending fails instead of blocking
    written: list[tuple[str, str]] = []
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
        """Queue the traces of rows, answered or failed (returns at once; nothing is queued for
        a writer that died: `close` writes those traces)."""
        if rows and self.target is not None and self._alive():
            self._inbox.put((self.target, list(rows)))

    def _alive(self) -> bool:
        """Whether the writer still runs (only the process that started it can tell; any other
        queues its rows regardless)."""
        return not self._stopped and (os.getpid() != self._owner or self._process.is_alive())

    def close(self, rows: Sequence[QuestionRow] = ()) -> int:
        """Wait until the writer wrote everything sent so far (a kept writer then waits for the
        next run; any other ends), then make sure every row in `rows` (answered or failed) has
        its trace; returns how many of them do. Only rows the writer did not report (a resumed run's
        earlier ones, a failing writer's) are looked up in the store."""
        if self.keep and not self._stopped:
            self.finish()
            if not self._collect():
                self.stop()  # it is gone: reap it and say how it ended
            self._finishing = False
        else:
            self.stop()
        if self.target is None or not rows:
            return 0
        run_id = self.target.run_id
        unconfirmed = [row for row in rows if (run_id, case_of(row)) not in self._written]
        if unconfirmed:
            done = traced_cases(self.target)
            missing = [row for row in unconfirmed if case_of(row) not in done]
            if missing:
                _warn(
                    f"{len(missing)} traces were not written by the trace writer: writing them now"
                )
                write_traces(missing, self.target)
        return len(rows)

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
