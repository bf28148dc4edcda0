"""`python -m experiments.run strategy=multi-hop [...]`: one experiment (or a sweep with -m).

`main` checks the command line's keys and calls `hydra_main`, a thin Hydra shell; `run(cfg)` does
the work and is what tests call. It reads top to bottom: check the settings, build the components,
pick the run (new or resumed), answer every question (journaled, traced), aggregate, log.

Only Hydra, OmegaConf and the settings check are imported with this module: MLflow, LangChain,
Chroma, RAGAS and pandas come in with the harness's other modules, imported by `run` once the
settings are checked, so a typo'd override or `--help` costs about a CPU-second, not eight.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from caprag.errors import CapragError
from caprag.secrets import install_log_redaction
from experiments.harness import cluster, groups
from experiments.harness.hooks import NO_HOOKS, RunHooks
from experiments.harness.settings import check_override_keys, check_settings

if TYPE_CHECKING:
    from experiments.harness import workers
    from experiments.harness.build import Components
    from experiments.harness.data import EvalCase
    from experiments.harness.dryrun import CostEstimate
    from experiments.harness.identity import RunIdentity
    from experiments.harness.journal import Journal
    from experiments.harness.reuse import RowCache
    from experiments.results import traces
    from experiments.results.aggregate import Aggregate
    from experiments.results.row import QuestionRow


@dataclass
class RunResult:
    """What one run produced: per-question rows and the aggregates traced back to them."""

    name: str
    strategy: str
    dataset: str
    rows: list[QuestionRow]
    aggregates: dict[str, Aggregate]
    summary: dict[str, float]
    run_id: str | None = None
    traces: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    resumed: int = 0
    """Questions taken from the journal of an earlier, interrupted process."""
    estimate: CostEstimate | None = None
    """The dry run's estimate (experiment.dry_run=true): then no question was asked."""
    answering_s: float = 0.0
    """Seconds from the first question asked to the last one answered (scored and journaled)."""
    recording_s: float = 0.0
    """Seconds after the last answer until the run was recorded: results, traces, count-back."""
    results_s: float = 0.0
    """Of that, logging the results and the table to MLflow."""
    traces_wait_s: float = 0.0
    """Of that, waiting for the trace writer to write what was left of the run's traces."""
    count_back_s: float = 0.0
    """Of that, counting the run's traces back from the store (and writing any shortfall)."""
    traces_missing: str = ""
    """What the count-back found missing and could not write again (empty: every trace is in)."""

    @property
    def all_failed(self) -> bool:
        """Every question of the run failed: it has rows but no result."""
        from experiments.results.aggregate import failures

        return failures(self.rows).all_failed

    def mean(self, metric: str) -> float | None:
        """The aggregate mean of a metric (None when no question has it)."""
        agg = self.aggregates.get(metric)
        return agg.mean if agg else None


def run(
    cfg: DictConfig,
    sweep_id: str | None = None,
    given: Sequence[str] | None = None,
    *,
    hooks: RunHooks = NO_HOOKS,
) -> RunResult:
    """Run one configuration end to end and log it to MLflow (unless tracking.enabled=false).

    A run is journaled case by case: when an earlier process of the same run died, the run is
    resumed (experiment.resume=auto or RUN_ID) and only the missing questions are asked.
    With experiment.dry_run=true nothing is asked: the cost estimate is printed and returned.
    `given`: the config groups the command line chose (so the run says which it defaulted).
    `hooks` lets a benchmark time the run's phases (experiments.harness.hooks).
    """
    check_settings(cfg)
    # 1. the settings are good: now the harness (and MLflow, LangChain, Chroma, pandas) is needed
    from experiments.harness import workers
    from experiments.harness.build import build_components, evaluator_for
    from experiments.harness.dryrun import client_config, estimate_cost
    from experiments.harness.identity import (
        DEFAULT_RETRIEVER,
        RunIdentity,
        describe_setup,
        resolved_setup,
        retriever_label,
        run_tags,
    )
    from experiments.results import traces, tracking
    from experiments.results.aggregate import failures
    from experiments.results.tables import run_table

    dry = bool(cfg.experiment.dry_run)
    retries = int(OmegaConf.select(cfg, "tracking.retries", default=tracking.RETRIES))
    if cfg.tracking.enabled and not dry:
        # Bounded waits on the server, checked before anything is built or asked.
        tracking.bound_requests(
            retries, int(OmegaConf.select(cfg, "tracking.timeout_s", default=tracking.TIMEOUT_S))
        )
        tracking.check_reachable(tracking.tracking_uri(cfg.tracking.uri))
        tracking.use_wal(tracking.tracking_uri(cfg.tracking.uri))
    if not dry:
        if cfg.tracking.enabled and cfg.tracking.traces:
            traces.shared()  # started first: it imports MLflow while the run builds
        workers.prepare(cfg)  # the workers' server imports while the components are built
    with hooks.phase("setup"):
        parts = build_components(cfg, llm=not dry)
    raw = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(raw, dict)
    config = {str(k): v for k, v in raw.items()}
    strategy = parts.strategy(parts.steps, int(cfg.retriever.k))
    variant = f" power={cfg.strategy.power}" if "power" in cfg.strategy else ""
    backend = ("llm" if client_config(cfg) else "offline") if dry else parts.steps.backend
    name = f"{cfg.experiment.name}:{strategy.name}{variant}:{parts.dataset.name}:{backend}"
    retriever = retriever_label(cfg)
    if retriever != DEFAULT_RETRIEVER:
        name += f":{retriever}"
    repeats = max(1, int(cfg.experiment.repeats))
    if dry:
        pipelines = evaluator_for(cfg, parts, parts.steps)
        estimate = estimate_cost(cfg, parts.dataset, strategy, pipelines.pipeline_for)
        print(estimate.table())
        return RunResult(
            name, strategy.name, parts.dataset.name, [], {}, {}, config=config, estimate=estimate
        )
    questions = parts.dataset.questions * repeats
    times = f" x {repeats} repeats" if repeats > 1 else ""
    setup = resolved_setup(cfg, parts, strategy, given)
    print(f"run {name}: {questions} questions{times}; " + describe_setup(setup), flush=True)
    writing = bool(cfg.tracking.enabled and cfg.tracking.traces)
    journaled: list[Path] = []
    incomplete: TracesIncompleteError | None = None
    try:
        identity = RunIdentity.resolve(cfg, config, parts.dataset)
        tags = run_tags(cfg, identity, strategy, parts.steps, setup)
        names = (name, strategy.name)
        rest = (sweep_id, tags, config, writing, journaled, setup)
        result = _run_logged(cfg, parts, identity, names, *rest, hooks=hooks)
    except TracesIncompleteError as exc:
        result, incomplete = exc.result, exc
    except Exception as exc:
        uri = tracking.tracking_uri(cfg.tracking.uri)
        if not (cfg.tracking.enabled and tracking.is_remote(uri) and tracking.unreachable(exc)):
            raise
        journal = journaled[0] if journaled else None
        raise tracking.TrackingUnavailableError(tracking.lost(uri, exc, journal, retries)) from None
    failed = failures(result.rows)
    print(run_table(result.aggregates, result.summary, failed), flush=True)
    print(time_split(result), flush=True)
    if incomplete is not None:
        raise incomplete
    if failed.all_failed:
        print(
            f"warning: every question failed ({failed.failed} of {failed.total}), so no metric "
            f"has a value; most common error: {failed.most_common()}",
            file=sys.stderr,
            flush=True,
        )
    return result


def _run_logged(
    cfg: DictConfig,
    parts: Components,
    identity: RunIdentity,
    names: tuple[str, str],
    sweep_id: str | None,
    tags: dict[str, str],
    config: dict[str, Any],
    writing: bool,
    journaled: list[Path],
    setup: dict[str, str],
    hooks: RunHooks = NO_HOOKS,
) -> RunResult:
    """Ask every question of the run (journaled as they finish) and log the result to MLflow;
    `journaled` receives the journal's path as soon as it is open. `names`: the run's and the
    strategy's."""
    from experiments.harness import workers
    from experiments.harness.build import row_cache
    from experiments.results import traces
    from experiments.results.aggregate import aggregate, summary_metrics

    name, strategy_name = names
    repeats = max(1, int(cfg.experiment.repeats))
    questions = parts.dataset.questions * repeats
    kept = identity.finished_in_sweep(sweep_id)
    if kept is not None:
        return _kept(kept, names, parts.dataset.name, config)
    with (
        traces.writer(writing) as trace_writer,  # the writer started above (spawned: holds nothing)
        workers.pool(cfg, config) as pool,  # started while the MLflow run and journal open
        identity.open(name, sweep_id, tags, setup) as (journal, run_id),
    ):
        journaled.append(journal.path)
        done = journal.done()
        resumed = sum(len(rows) for rows in done.values())
        if resumed:
            print(
                f"resuming run {run_id or journal.path.stem}: {resumed} of {questions} "
                "questions already done (experiment.resume=never starts over)",
                flush=True,
            )
        if trace_writer is not None and run_id is not None:
            trace_writer.progress = bool(cfg.experiment.progress)
            _resume_traces(trace_writer, identity, run_id, done, strategy_name)
        reuse = row_cache(cfg, parts, config) if hooks.reuse_rows else None
        try:
            answering = time.monotonic()
            with hooks.phase("evaluate"):
                rows = asyncio.run(
                    _evaluate_repeats(cfg, parts, repeats, done, journal, trace_writer, reuse, pool)
                )
            answering_s = time.monotonic() - answering
        finally:
            if reuse is not None:
                reuse.close()
        if reuse is not None and reuse.hits:
            print(
                f"{reuse.hits} of {len(parts.dataset.cases) * repeats} cases reused from an "
                "identical earlier run (experiment.cache=false asks every question again)",
                flush=True,
            )
        aggregates = aggregate(rows)
        summary = summary_metrics(rows)
        if reuse is not None:
            summary["reused_cases"] = float(reuse.hits)
        result = RunResult(
            name,
            strategy_name,
            parts.dataset.name,
            rows,
            aggregates,
            summary,
            config=config,
            resumed=resumed,
            answering_s=answering_s,
        )
        recording = time.monotonic()
        if run_id is not None:
            result.run_id = run_id
            _log(result, trace_writer, uri=identity.uri, hooks=hooks)
            if result.traces_missing:  # the run ends FAILED, its journal kept: run again to mend
                result.recording_s = time.monotonic() - recording
                raise TracesIncompleteError(result)
    result.recording_s = time.monotonic() - recording
    return result


def _kept(run_id: str, names: tuple[str, str], dataset: str, config: dict[str, Any]) -> RunResult:
    """The result of a run that an earlier attempt of this sweep finished: read back from its
    table, nothing asked or written again (its traces stay as they are)."""
    from experiments.results.aggregate import aggregate, summary_metrics
    from experiments.results.row import rows_of
    from experiments.results.runs import load_run

    rows = rows_of(load_run(run_id).questions)
    print(
        f"run {run_id} of this sweep finished in an earlier attempt: its {len(rows)} questions "
        "and their traces are kept as they are",
        flush=True,
    )
    name, strategy_name = names
    aggregates, summary = aggregate(rows), summary_metrics(rows)
    result = RunResult(name, strategy_name, dataset, rows, aggregates, summary, config=config)
    result.run_id = run_id
    return result


async def _evaluate_repeats(
    cfg: DictConfig,
    parts: Components,
    repeats: int,
    done: dict[str, list[QuestionRow]],
    journal: Journal,
    trace_writer: traces.TraceWriter | None = None,
    reuse: RowCache | None = None,
    pool: workers.WorkerPool | None = None,
) -> list[QuestionRow]:
    """Every repeat side by side in one event loop (HTTP clients are bound to the loop that
    opened them), or over the pool's worker processes (experiment.workers): the questions of all
    repeats share one pool of `experiment.concurrency` slots, so no slot idles while one repeat
    ends and the next begins. Rows come back in repeat order, each repeat in dataset order.

    Cases the journal has (a resumed run) or the row cache has (an identical earlier run) are not
    asked again. A case that finishes is journaled, offered to the row cache and its traces
    queued for the writer; a reused case's traces are queued too (this run has none yet)."""
    from tqdm import tqdm

    from experiments.harness.build import repeat_evaluator
    from experiments.harness.journal import case_key

    def record(repeat: int, case: EvalCase, found: list[QuestionRow]) -> None:
        journal.append(case_key(repeat, case.id), found)
        if reuse is not None:
            reuse.put(repeat, case, found)
        if trace_writer is not None:
            trace_writer.submit(found)

    known: dict[int, dict[str, list[QuestionRow]]] = {}
    for repeat in range(repeats):
        prefix = f"{repeat}:"
        known[repeat] = {k.removeprefix(prefix): v for k, v in done.items() if k.startswith(prefix)}
        if reuse is not None:
            for case in parts.dataset.cases:
                found = None if case.id in known[repeat] else reuse.get(repeat, case)
                if found is not None:
                    known[repeat][case.id] = found
                    if trace_writer is not None:
                        trace_writer.submit(found)
    if pool is not None:
        return await pool.run(parts.dataset, done=known, on_case=record, repeats=range(repeats))
    slots = asyncio.Semaphore(max(1, int(cfg.experiment.concurrency)))
    total = parts.dataset.questions * repeats
    with tqdm(total=total, unit="q", desc="questions", disable=not cfg.experiment.progress) as bar:
        answered = await asyncio.gather(
            *(
                repeat_evaluator(cfg, parts, repeat).run(
                    parts.dataset,
                    done=known[repeat],
                    on_case=functools.partial(record, repeat),
                    repeat=repeat,
                    slots=slots,
                    bar=bar,
                )
                for repeat in range(repeats)
            )
        )
    return [row for rows in answered for row in rows]


def _resume_traces(
    trace_writer: traces.TraceWriter,
    identity: RunIdentity,
    run_id: str,
    done: dict[str, list[QuestionRow]],
    strategy: str = "",
) -> None:
    """Point the writer at the run (its traces tagged with the strategy); a resumed run first
    queues the journaled questions whose trace the killed process did not write."""
    from experiments.results import traces

    assert identity.uri is not None and identity.experiment_id is not None
    target = traces.Target(identity.uri, identity.experiment_id, run_id, strategy)
    trace_writer.bind(target)
    if done:
        traced = traces.traced_cases(target)
        journaled = [row for rows in done.values() for row in rows]
        trace_writer.submit([row for row in journaled if traces.case_of(row) not in traced])


class TracesIncompleteError(CapragError):
    """Some of a run's traces could not be written, even again; the run keeps its rows and
    metrics, is tagged with what is missing and ends FAILED, so the same command resumes it and
    writes only the missing traces."""

    def __init__(self, result: RunResult) -> None:
        super().__init__(
            f"run {result.run_id}: {result.traces_missing}; its rows and metrics are logged and "
            "it is tagged caprag.traces_missing: run the same command again to write the "
            "missing traces"
        )
        self.result = result


def _log(
    result: RunResult,
    trace_writer: traces.TraceWriter | None,
    uri: str | None,
    hooks: RunHooks = NO_HOOKS,
) -> None:
    """Results and table into the open run (while the trace writer writes its last batch), then
    wait for the writer (a bar shows its progress) and count back the run's traces: a shortfall
    is written again, and what still falls short is kept in `result.traces_missing` and tagged
    on the run."""
    from experiments.results import tracking

    if trace_writer is not None:
        trace_writer.finish()
    start = time.monotonic()
    with hooks.phase("mlflow_results"):
        tracking.log_results(result.rows, result.aggregates, result.summary)
    result.results_s = time.monotonic() - start
    written = 0
    with hooks.phase("mlflow_traces"):
        if trace_writer is not None:
            counted = trace_writer.close(result.rows)
            result.traces_wait_s, result.count_back_s = counted.waited_s, counted.seconds
            written = counted.expected - len(counted.missing)
            if not counted.complete:
                result.traces_missing = counted.line()
            tracking.tag_traces_missing(result.traces_missing)
    result.traces = written
    print(f"logged MLflow run {result.run_id} ({written} traces) to {uri}")


def time_split(result: RunResult) -> str:
    """Where the run's time went, in one line: answering, then recording after the last answer
    (the results; with traces, the wait for the writer's last ones and their count-back)."""
    questions = len(result.rows)
    rate = f", {questions / result.answering_s:.0f} q/s" if result.answering_s > 0 else ""
    parts = f"results {result.results_s:.1f} s"
    if result.traces:
        parts += (
            f"; {result.traces} traces: {result.traces_wait_s:.1f} s for the writer's last ones, "
            f"{result.count_back_s:.1f} s to count them back"
        )
    return (
        f"time: answering {result.answering_s:.1f} s ({questions} questions{rate}); "
        f"recording {result.recording_s:.1f} s after the last answer ({parts})"
    )


cluster.quiet_launcher_schema_warning()
groups.offer_registered()  # before @hydra.main composes: registered names are group members


def main() -> None:
    """`python -m experiments.run`: a typo'd key of a closed group fails with "did you mean"
    (exit 2), before Hydra composes; then the Hydra shell."""
    try:
        check_override_keys([arg for arg in sys.argv[1:] if not arg.startswith("-")])
    except CapragError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    hydra_main()


@hydra.main(version_base="1.3", config_path="../../conf", config_name="config")
def hydra_main(cfg: DictConfig) -> float | None:
    """Hydra entry point: resolve the config and run it. Exit 2 with a one-line error on bad
    input (before any question is asked); exit 1 when every question of the run failed."""
    install_log_redaction()  # Hydra has configured logging (console, run.log): filter it
    sweep_id = None
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        sweep_id = str(HydraConfig.get().sweep.dir)
    given = [str(o).split("=", 1)[0].lstrip("+~") for o in HydraConfig.get().overrides.task]
    try:
        result = run(cfg, sweep_id=sweep_id, given=given)
    except MissingMandatoryValue as exc:
        print(f"error: {exc.full_key} must be set ({exc.full_key}=...)", file=sys.stderr)
        sys.exit(2)
    except (CapragError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except Exception as exc:
        from experiments.results.questions import DatasetError  # loaded by run: imports nothing

        if not isinstance(exc, DatasetError):
            raise
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    if result.all_failed and sweep_id is None:
        sys.exit(1)  # in a sweep the warning is printed and the other jobs still run
    return result.mean("recall_at_k")
