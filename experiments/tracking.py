"""MLflow logging: config as params, aggregates as metrics, rows and traces as artifacts."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from caprag.config import PROJECT_ROOT
from caprag.secrets import redact_config, redact_records
from caprag.telemetry import disable_telemetry

disable_telemetry()

import mlflow  # noqa: E402  (after the telemetry opt-out)

from experiments.evaluate import Aggregate, QuestionRow  # noqa: E402

DEFAULT_URI = f"sqlite:///{PROJECT_ROOT / 'mlruns.db'}"
TABLE = "questions.json"
logging.getLogger("mlflow").setLevel(logging.WARNING)
logging.getLogger("alembic").setLevel(logging.WARNING)


def tracking_uri(configured: str | None = None) -> str:
    """The configured URI, else MLFLOW_TRACKING_URI, else the project's SQLite file.

    An explicit `tracking.uri` wins over the environment: `mlflow.set_tracking_uri` writes
    MLFLOW_TRACKING_URI into this process's environment, so the variable may be stale.
    """
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def artifact_root(uri: str) -> str | None:
    """Artifacts beside a local SQLite store (not under whatever the current folder is)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlruns").as_uri()
    return None


@contextlib.contextmanager
def file_lock(key: str) -> Iterator[None]:
    """A lock shared by the processes of one machine (parallel sweep jobs)."""
    name = "caprag-" + hashlib.sha256(key.encode()).hexdigest()[:16] + ".lock"
    with (Path(tempfile.gettempdir()) / name).open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def use_experiment(uri: str, name: str) -> str:
    """Point MLflow at the store and experiment; create either if needed.

    Creating a SQLite store runs migrations that race when parallel jobs do it at once, so the
    first contact with a store is serialised.
    """
    mlflow.set_tracking_uri(uri)
    with file_lock(f"store:{uri}"):
        existing = mlflow.get_experiment_by_name(name)
        if existing is not None:
            experiment_id = str(existing.experiment_id)
        else:
            experiment_id = str(
                mlflow.create_experiment(name, artifact_location=artifact_root(uri))
            )
    mlflow.set_experiment(experiment_id=experiment_id)
    return experiment_id


def git_commit() -> str:
    """The commit of the working tree ('+dirty' when it has changes), or 'unknown'."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        return commit + ("+dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config → {'a.b.c': 'value'} with values as strings (MLflow params)."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = json.dumps(value) if isinstance(value, list | tuple) else str(value)
    return flat


def parent_run(experiment_id: str, sweep_id: str, name: str) -> str:
    """The run that groups a sweep's runs: found by tag, created once (a file lock guards it)."""
    with file_lock(f"sweep:{sweep_id}"):
        found = mlflow.search_runs(
            experiment_ids=[experiment_id],
            filter_string=f"tags.`caprag.sweep_id` = '{sweep_id}' and tags.`caprag.role` = 'sweep'",
            output_format="list",
        )
        if found:
            return str(found[0].info.run_id)
        client = mlflow.MlflowClient()
        run = client.create_run(
            experiment_id,
            run_name=name,
            tags={"caprag.sweep_id": sweep_id, "caprag.role": "sweep"},
        )
        client.set_terminated(run.info.run_id)
        return str(run.info.run_id)


@contextlib.contextmanager
def start(
    run_name: str, parent_id: str | None, tags: Mapping[str, str], run_id: str | None = None
) -> Iterator[Any]:
    """Open a new run (nested under the sweep's parent run when there is one), or reopen
    `run_id` to finish it. An exception ends the run FAILED; a kill leaves it RUNNING."""
    if run_id is not None:
        with mlflow.start_run(run_id=run_id) as run:
            yield run
        return
    with mlflow.start_run(run_name=run_name, parent_run_id=parent_id, tags=dict(tags)) as run:
        yield run


def run_info(run_id: str) -> tuple[str, dict[str, str]] | None:
    """A run's status and tags, or None when the store has no such run."""
    try:
        found = mlflow.MlflowClient().get_run(run_id)
    except mlflow.exceptions.MlflowException:
        return None
    return str(found.info.status), dict(found.data.tags)


def unfinished_runs(experiment_id: str, config_hash: str) -> list[str]:
    """Runs of this config that did not finish (killed, failed or still going), newest first."""
    found = mlflow.search_runs(
        experiment_ids=[experiment_id],
        filter_string=f"tags.`caprag.config_hash` = '{config_hash}'",
        order_by=["attributes.start_time DESC"],
        output_format="list",
    )
    return [str(r.info.run_id) for r in found if r.info.status != "FINISHED"]


def log_config(config: Mapping[str, Any]) -> None:
    """Every resolved config value as a param; the whole config as an artifact."""
    config = redact_config(config)
    flat = flatten(config)
    items = list(flat.items())
    for start_at in range(0, len(items), 100):
        mlflow.log_params({k[:250]: v[:6000] for k, v in items[start_at : start_at + 100]})
    mlflow.log_dict(dict(config), "config.json")


def log_results(
    rows: Sequence[QuestionRow], aggregates: Mapping[str, Aggregate], summary: Mapping[str, float]
) -> None:
    """Means and coverage as metrics, recall per hop as a stepped metric, rows as a table."""
    metrics: dict[str, float] = dict(summary)
    for name, agg in aggregates.items():
        if agg.mean is not None:
            metrics[name] = agg.mean
        metrics[f"{name}.coverage"] = agg.n / agg.total if agg.total else 0.0
    mlflow.log_metrics(metrics)
    for hop in range(1, 4):
        hop_agg = aggregates.get(f"recall_hop{hop}")
        if hop_agg is not None and hop_agg.mean is not None:
            mlflow.log_metric("recall_cumulative", hop_agg.mean, step=hop)
    records = [redact_records(row.record()) for row in rows]  # row by row: no whole-table copy
    if records:
        mlflow.log_table(_frame(records), artifact_file=TABLE)
    mlflow.log_dict(
        {
            name: {"mean": a.mean, "n": a.n, "total": a.total, "missing": a.missing_reasons}
            for name, a in aggregates.items()
        },
        "aggregates.json",
    )


def _frame(records: list[dict[str, Any]]) -> Any:
    """The rows as a DataFrame whose text columns hold the records' own strings: pandas'
    default Arrow storage would copy every trace and call into Arrow and back to write the
    JSON, twice the table's size at the end of a long run (same file either way)."""
    import pandas as pd

    with pd.option_context("mode.string_storage", "python"):
        return pd.DataFrame.from_records(records)


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


def _hop_attributes(hop: Mapping[str, Any]) -> dict[str, str]:
    """The hop's counts, cost and (adaptive) decision log as span attributes."""
    return {key: str(hop[key]) for key in HOP_ATTRIBUTES if hop.get(key) is not None}


def _span(
    parent: Any,
    name: str,
    kind: str,
    inputs: dict[str, Any],
    outputs: dict[str, Any],
    start_ns: int,
    seconds: float,
    attributes: dict[str, str] | None = None,
    children: Sequence[Mapping[str, Any]] = (),
) -> int:
    """A finished child span of `seconds` starting at start_ns (with a span per LLM call in
    `children`); returns its end time."""
    span = mlflow.start_span_no_context(
        name,
        span_type=kind,
        parent_span=parent,
        inputs=inputs,
        attributes=attributes,
        start_time_ns=start_ns,
    )
    if children:
        _call_spans(span, children, start_ns)
    span.set_outputs(outputs)
    end_ns = start_ns + int(seconds * 1e9)
    span.end(end_time_ns=end_ns)
    return end_ns


def _call_spans(parent: Any, calls: Sequence[Mapping[str, Any]], start_ns: int) -> None:
    """A CHAT_MODEL span per LLM step under `parent`: the messages as sent and the reply for a
    model call, the step's rule and cost for a rule step."""
    t = start_ns
    for call in calls:
        attributes = {
            key: str(call[key])
            for key in ("model", "prompt_tokens", "completion_tokens", "cost_usd", "attempts")
            if call.get(key) is not None
        }
        for key in ("error", "notes", "cached"):
            if call.get(key):
                attributes[key] = str(call[key])
        t = _span(
            parent,
            f"llm {call['step']}",
            "CHAT_MODEL",
            {"messages": call.get("messages") or f"(rule: no call, {call.get('prompt_version')})"},
            {"reply": call.get("reply")},
            t,
            float(call.get("latency_s") or 0.0),
            attributes,
        )


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


CASE_TAG = "caprag.case"
"""Trace tag naming the case (repeat:question id) a trace belongs to."""


def traced_cases(run_id: str, experiment_id: str) -> set[str]:
    """Cases of a run that already have a trace (a process killed while logging left some)."""
    found = mlflow.search_traces(
        locations=[experiment_id], run_id=run_id, include_spans=False, return_type="list"
    )
    return {str(t.info.tags[CASE_TAG]) for t in found if CASE_TAG in t.info.tags}


def log_traces(rows: Sequence[QuestionRow], start_ns: int) -> int:
    """One MLflow trace per question: a span per node, under retrieve a span per hop, and under
    those a span per LLM call with its messages as sent and its reply.

    Each trace is tagged with its case; cases the active run already traced are skipped, so a
    run resumed after its process was killed while logging traces has one trace per question.
    Returns the traces the run has for these rows."""
    active = mlflow.active_run()
    done = (
        traced_cases(active.info.run_id, active.info.experiment_id) if active is not None else set()
    )
    count = 0
    for row in rows:
        if row.status != "ok":
            continue
        case = f"{row.repeat}:{row.question_id}"
        if case in done:
            count += 1
            continue
        t = start_ns
        rewrite_calls, hop_calls, generate_calls = _split_calls(row)
        root = mlflow.start_span_no_context(
            f"question {row.question_id}",
            span_type="CHAIN",
            inputs={"question": row.question},
            attributes={"set": row.set, "query_type": row.query_type},
            tags={
                CASE_TAG: case,
                "caprag.question_id": row.question_id,
                "caprag.set": row.set,
                "caprag.query_type": row.query_type or "",
            },
            start_time_ns=t,
        )
        t = _span(
            root,
            "rewrite",
            "CHAIN",
            {"question": row.question},
            {"main_question": row.main_question},
            t,
            row.timings.get("rewrite", 0.0),
            children=rewrite_calls,
        )
        retrieve = mlflow.start_span_no_context(
            "retrieve",
            span_type="RETRIEVER",
            parent_span=root,
            inputs={"main_question": row.main_question},
            start_time_ns=t,
        )
        for hop, calls in zip(row.trace, hop_calls, strict=True):
            t = _span(
                retrieve,
                f"hop {hop['hop']}",
                "RETRIEVER",
                {"queries": hop["queries"]},
                {"documents": hop["documents"], "decision": hop.get("decision")},
                t,
                float(hop.get("latency_s", 0.0)),
                _hop_attributes(hop),
                children=calls,
            )
        retrieve.set_outputs({"context": row.context_ids})
        retrieve.end(end_time_ns=t)
        t = _span(
            root,
            "generate",
            "LLM",
            {"context": row.context_ids},
            {"answer": row.answer},
            t,
            row.timings.get("generate", 0.0),
            children=generate_calls,
        )
        root.set_outputs({"answer": row.answer, "gold_answer": row.gold_answer})
        root.end(end_time_ns=max(t, start_ns + int(row.timings.get("total", 0.0) * 1e9)))
        count += 1
    mlflow.flush_trace_async_logging()
    return count
