"""MLflow logging: config as params, aggregates as metrics, rows as a table (traces: traces.py)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import socket
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from caprag import disable_telemetry
from caprag.config import PROJECT_ROOT
from caprag.errors import CapragError
from caprag.secrets import redact_config, redact_records

disable_telemetry()

import mlflow  # noqa: E402  (after the telemetry opt-out)

from experiments.results.aggregate import Aggregate  # noqa: E402
from experiments.results.row import QuestionRow  # noqa: E402
from experiments.results.slices import slice_metrics  # noqa: E402

DEFAULT_URI = f"sqlite:///{PROJECT_ROOT / 'mlruns.db'}"
TABLE = "questions.json"
logging.getLogger("mlflow").setLevel(logging.WARNING)
logging.getLogger("alembic").setLevel(logging.WARNING)
log = logging.getLogger(__name__)


RETRIES = 3
"""Retries of a failed request to an MLflow server (after 1, 2 and 4 s): `tracking.retries`."""
TIMEOUT_S = 10
"""The most one request to an MLflow server may take: `tracking.timeout_s`."""
CHECK_TIMEOUT_S = 5.0
"""The most the reachability check before the first question may take."""


class TrackingUnavailableError(CapragError):
    """The MLflow server cannot be reached (before the run) or stopped answering (during it)."""


def is_remote(uri: str) -> bool:
    """Whether the store is a tracking server reached over HTTP."""
    return uri.startswith(("http://", "https://"))


def bound_requests(retries: int = RETRIES, timeout_s: int = TIMEOUT_S) -> None:
    """Bound every MLflow HTTP request of this process and the processes it starts (the trace
    writer, workers) through MLflow's documented variables: `retries` retries with backoff 1, 2,
    4... s, each try at most `timeout_s` (MLflow's defaults, 7 retries with backoff 2 s and 120 s
    tries, wait minutes on a server that is gone)."""
    if retries < 0 or timeout_s < 1:
        raise TrackingUnavailableError(
            f"tracking.retries={retries}, tracking.timeout_s={timeout_s}: the retries must be 0 "
            "or more and the timeout at least 1 s"
        )
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(retries)
    os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] = "1"
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(timeout_s)


def check_reachable(uri: str, timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """Fail at once (TrackingUnavailableError naming the URL) when a tracking server does not
    answer; any HTTP answer counts as reachable. Local stores are not checked."""
    if not is_remote(uri):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return  # it answered
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TrackingUnavailableError(
            f"MLflow tracking server {uri} is unreachable ({reason}); start it, or set "
            "tracking.uri to a reachable server (tracking.enabled=false runs without MLflow)"
        ) from None


def unreachable(exc: BaseException) -> bool:
    """Whether an error from MLflow means its server could not be reached or stopped answering
    (after MLflow's bounded retries), rather than that it refused a request."""
    import requests

    if isinstance(exc, requests.exceptions.RequestException | ConnectionError | TimeoutError):
        return True
    text = str(exc)
    return isinstance(exc, mlflow.exceptions.MlflowException) and (
        "Max retries exceeded" in text
        or "failed with exception" in text
        or "Connection refused" in text
        or "timed out" in text
    )


def lost(uri: str, exc: BaseException, journal: Path | None, retries: int) -> str:
    """The one line a run ends with when its tracking server stopped answering."""
    reason = " ".join(str(exc).split())[:200]
    where = (
        f"the questions answered so far are journaled in {journal}"
        if journal is not None
        else "no question was asked"
    )
    return (
        f"MLflow tracking server {uri} stopped answering ({reason}; gave up after "
        f"{retries} retries): {where}. When the server is back, rerun the same command: the run "
        "resumes from its journal and logs them (experiment.resume=auto)"
    )


def tracking_uri(configured: str | None = None) -> str:
    """The configured URI, else MLFLOW_TRACKING_URI, else the project's SQLite file.

    An explicit `tracking.uri` wins over the environment: `mlflow.set_tracking_uri` writes
    MLFLOW_TRACKING_URI into this process's environment, so the variable may be stale.
    """
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


_in_wal: set[str] = set()


def use_wal(uri: str) -> None:
    """Put a SQLite store in WAL mode (a setting of the database file, kept by it): a commit then
    appends to the log instead of rewriting pages under a rollback journal, and readers (the
    dashboard, the harness's count-back) do not block the trace writer. Once per process and
    store; any other store is left as it is."""
    if not uri.startswith("sqlite:///") or uri in _in_wal:
        return
    path = Path(uri.removeprefix("sqlite:///"))
    if str(path) == ":memory:" or not path.parent.is_dir():
        return
    import sqlite3

    with contextlib.closing(sqlite3.connect(path, timeout=30)) as db:
        db.execute("PRAGMA journal_mode=WAL")
    _in_wal.add(uri)


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


def sweep_parents(experiment_id: str, sweep_id: str) -> list[str]:
    """Ids of the sweep's parent runs, the earliest first (ties by run id)."""
    found = mlflow.search_runs(
        experiment_ids=[experiment_id],
        filter_string=f"tags.`caprag.sweep_id` = '{sweep_id}' and tags.`caprag.role` = 'sweep'",
        output_format="list",
    )
    return [
        str(r.info.run_id) for r in sorted(found, key=lambda r: (r.info.start_time, r.info.run_id))
    ]


SWEEP_KEY = "caprag.sweep_key"
"""Parent run tag: what the sweep's command asked (its overrides), the same every time it runs."""
SWEEP_STATE = "caprag.sweep_state"
"""Parent run tag: 'running' until the sweep's end has written its verdict, then 'complete'."""


def unfinished_sweeps(experiment_id: str, key: str) -> list[str]:
    """Parent runs of sweeps of this command whose end never came (killed), newest first."""
    found = newest_first(
        experiment_id, f"tags.`{SWEEP_KEY}` = '{key}' and tags.`caprag.role` = 'sweep'"
    )
    return [str(r.info.run_id) for r in found if r.data.tags.get(SWEEP_STATE) != "complete"]


def parent_run(experiment_id: str, sweep_id: str, name: str, key: str = "") -> str:
    """The run that groups a sweep's runs: found by tag, created once. A sweep whose command
    (`key`) left an unfinished parent (it was killed) takes that parent over, so the sweep run
    again is the same sweep. A file lock keeps it single on one machine; jobs on several
    machines (a Ray cluster) that create one at the same time each keep the earliest and delete
    their own."""
    with file_lock(f"sweep:{key or sweep_id}"):
        found = sweep_parents(experiment_id, sweep_id)
        if found:
            return found[0]
        client = mlflow.MlflowClient()
        if key and (earlier := unfinished_sweeps(experiment_id, key)):
            client.set_tag(earlier[0], "caprag.sweep_id", sweep_id)
            print(
                f"resuming sweep {earlier[0]}: its finished runs are kept, its unfinished ones "
                "resumed",
                flush=True,
            )
            return earlier[0]
        tags = {"caprag.sweep_id": sweep_id, "caprag.role": "sweep", SWEEP_STATE: "running"}
        if key:
            tags[SWEEP_KEY] = key
        run = client.create_run(experiment_id, run_name=name, tags=tags)
        client.set_terminated(run.info.run_id)
        first = sweep_parents(experiment_id, sweep_id)[0]
        if first != run.info.run_id:
            client.delete_run(run.info.run_id)
        return first


def sweep_complete(parent_id: str) -> None:
    """Mark a sweep's parent run complete (its end wrote the verdict): the next sweep of the same
    command starts a parent of its own."""
    mlflow.MlflowClient().set_tag(parent_id, SWEEP_STATE, "complete")


def finished_child(experiment_id: str, parent_id: str, config_hash: str) -> str | None:
    """The finished run of this config under a sweep's parent run, if there is one."""
    found = mlflow.search_runs(
        experiment_ids=[experiment_id],
        filter_string=(
            f"tags.`mlflow.parentRunId` = '{parent_id}' "
            f"and tags.`caprag.config_hash` = '{config_hash}' and attributes.status = 'FINISHED'"
        ),
        output_format="list",
    )
    return str(found[0].info.run_id) if found else None


RUN_NOTE = "mlflow.note.content"
"""MLflow's system tag for a run's description: the UI shows it, as Markdown, on the run's page."""


def trace_route(experiment_id: str, trace_id: str) -> str:
    """A trace's place in the MLflow UI, relative to its base: the experiment's trace list with
    that trace open."""
    return f"#/experiments/{experiment_id}/traces?selectedEvaluationId={trace_id}"


def describe(run_id: str, markdown: str) -> None:
    """Set a run's description (shown on its page in the MLflow UI)."""
    mlflow.MlflowClient().set_tag(run_id, RUN_NOTE, markdown)


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


JOURNAL_TAG = "caprag.journal"
"""HOST:PATH of the run's journal: a resume needs it, and it is a file on that machine."""


def tag_journal(path: Path) -> None:
    """Record on the active run where its journal is (HOST:PATH)."""
    mlflow.set_tag(JOURNAL_TAG, f"{socket.gethostname()}:{path.resolve()}")


def newest_first(experiment_id: str, filter_string: str) -> list[Any]:
    """The experiment's runs that match a filter, the newest first."""
    found: list[Any] = mlflow.search_runs(
        experiment_ids=[experiment_id],
        filter_string=filter_string,
        order_by=["attributes.start_time DESC"],
        output_format="list",
    )
    return found


def unfinished_runs(experiment_id: str, config_hash: str) -> list[str]:
    """Runs of this config that did not finish (killed, failed or still going), newest first."""
    found = newest_first(experiment_id, f"tags.`caprag.config_hash` = '{config_hash}'")
    return [str(r.info.run_id) for r in found if r.info.status != "FINISHED"]


def log_config(config: Mapping[str, Any]) -> None:
    """Every resolved config value as a param; the whole config as an artifact."""
    config = redact_config(config)
    flat = flatten(config)
    items = list(flat.items())
    for start_at in range(0, len(items), 100):
        mlflow.log_params({k[:250]: v[:6000] for k, v in items[start_at : start_at + 100]})
    mlflow.log_dict(dict(config), "config.json")


TRACES_MISSING = "caprag.traces_missing"
"""Run tag: what the count-back found missing of the run's traces and could not write again."""


def tag_traces_missing(missing: str) -> None:
    """Tag the active run with what its traces lack, or clear an earlier attempt's tag."""
    run = mlflow.active_run()
    if run is None:
        return
    if missing:
        mlflow.set_tag(TRACES_MISSING, missing)
    elif TRACES_MISSING in run.data.tags:
        mlflow.MlflowClient().delete_tag(run.info.run_id, TRACES_MISSING)


def log_results(
    rows: Sequence[QuestionRow], aggregates: Mapping[str, Aggregate], summary: Mapping[str, float]
) -> None:
    """Means and coverage as metrics, the main ones per slice (`recall_at_k/cross_book`,
    `recall_at_k/type/bridge`: experiments.results.slices), recall per hop as a stepped metric,
    rows as a table (`QuestionRow.record`: each row whole in `row`, its scalars beside it)."""
    metrics: dict[str, float] = dict(summary)
    for name, agg in aggregates.items():
        if agg.mean is not None:
            metrics[name] = agg.mean
        metrics[f"{name}.coverage"] = agg.n / agg.total if agg.total else 0.0
    records = redact_records([row.record() for row in rows])
    table = _frame(records) if records else None
    if table is not None:
        metrics.update(slice_metrics(table))
    metrics.update(per_thousand(metrics))
    mlflow.log_metrics(metrics)
    if table is not None:
        log_question_sets(table)
    for hop in range(1, 4):
        hop_agg = aggregates.get(f"recall_hop{hop}")
        if hop_agg is not None and hop_agg.mean is not None:
            mlflow.log_metric("recall_cumulative", hop_agg.mean, step=hop)
    if table is not None:
        _log_table(table)
    mlflow.log_dict(
        {
            name: {"mean": a.mean, "n": a.n, "total": a.total, "missing": a.missing_reasons}
            for name, a in aggregates.items()
        },
        "aggregates.json",
    )


PER_1K = "cost_per_1k_usd"
"""The cost metric again as MLflow's own UI shows it: USD per 1,000 questions (`cost_usd` is per
question, too small to read on a chart axis), overall and per slice (`cost_per_1k_usd/<set>`)."""
DATASET_COLUMNS = ("question_id", "set", "query_type", "question", "gold_answer")


def per_thousand(metrics: Mapping[str, float]) -> dict[str, float]:
    """`cost_per_1k_usd[/slice]` for every `cost_usd[/slice]` mean: the same number × 1,000."""
    return {
        PER_1K + name.removeprefix("cost_usd"): value * 1000.0
        for name, value in metrics.items()
        if name == "cost_usd" or name.startswith("cost_usd/")
    }


def log_question_sets(table: Any) -> None:
    """Each question set of the run as an MLflow dataset input (the runs list's Dataset column):
    its questions and gold answers, named by the set, with MLflow's digest of the content."""
    from mlflow.data.pandas_dataset import from_pandas  # MLflow's public dataset constructor

    columns = [c for c in DATASET_COLUMNS if c in table.columns]
    if "set" not in table.columns or "question_id" not in columns:
        return
    questions = table[columns].drop_duplicates("question_id")
    target = "gold_answer" if "gold_answer" in columns else None
    for name, rows in questions.groupby("set", sort=True):
        dataset = from_pandas(rows.reset_index(drop=True), name=str(name), targets=target)
        _log_dataset(dataset)


def _log_dataset(dataset: Any) -> None:
    """`mlflow.log_input`, once more if the first try fails: runs of one sweep that log the same
    set at once race in the tracking server (both find no dataset and both insert it; the second
    insert fails on its unique key), and on the second try the server finds the one now stored.
    The Dataset column only labels a run, so a second failure is a warning, never a lost run."""
    for attempt in (1, 2):
        try:
            mlflow.log_input(dataset, context="evaluation")
            return
        except mlflow.exceptions.MlflowException as error:
            if attempt == 2:
                log.warning("question set %r not in the run's datasets: %s", dataset.name, error)


def _log_table(table: Any) -> None:
    """The rows as the run's table, replacing one the run already has: `mlflow.log_table` appends
    to an existing table, and a resumed run's killed process may have logged it already (it is
    logged while the trace writer writes its last batch, so kill -9 can land after it)."""
    run = mlflow.active_run()
    assert run is not None
    if not any(f.path == TABLE for f in mlflow.MlflowClient().list_artifacts(run.info.run_id)):
        mlflow.log_table(table, artifact_file=TABLE)
        return
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / TABLE
        # The file mlflow.log_table writes (its tag on the run is there from the first time).
        table.to_json(path, orient="split", index=False, date_format="iso")
        mlflow.log_artifact(str(path))


def _frame(records: list[dict[str, Any]]) -> Any:
    """The rows as a DataFrame whose text columns hold the records' own strings: pandas'
    default Arrow storage would copy every trace and call into Arrow and back to write the
    JSON, twice the table's size at the end of a long run (same file either way)."""
    import pandas as pd

    with pd.option_context("mode.string_storage", "python"):
        return pd.DataFrame.from_records(records)
