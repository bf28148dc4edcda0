"""`python -m experiments.run strategy=multi-hop [...]`: one experiment (or a sweep with -m).

`main` is a thin Hydra shell; `run(cfg)` does the work and is what tests call.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import socket
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from caprag.errors import CapragError, ConfigError
from caprag.llm import StructuredClient
from caprag.llm.usage import PRICE_TABLE_VERSION
from caprag.services import Pipeline
from caprag.steps import ROLES, Steps, build_steps, prompt_versions, rule_steps
from caprag.store import PassageIndex
from caprag.strategies import RetrievalStrategy, Retriever
from experiments import cluster, traces, tracking
from experiments.data import Dataset, EvalCase
from experiments.dryrun import CostEstimate, client_config, estimate_cost, estimate_price_model
from experiments.evaluate import (
    Aggregate,
    Evaluator,
    QuestionRow,
    Scorer,
    aggregate,
    failures,
    summary_metrics,
)
from experiments.harness import workers
from experiments.harness.reuse import RowCache, run_fingerprint
from experiments.journal import Journal, case_key, config_hash
from experiments.questions import DatasetError
from experiments.tables import run_table


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

    @property
    def all_failed(self) -> bool:
        """Every question of the run failed: it has rows but no result."""
        return failures(self.rows).all_failed

    def mean(self, metric: str) -> float | None:
        """The aggregate mean of a metric (None when no question has it)."""
        agg = self.aggregates.get(metric)
        return agg.mean if agg else None


@dataclass
class Components:
    """What a run is made of, built from config; the LLM is rebuilt per repeat (its seed)."""

    dataset: Dataset
    steps: Steps
    scorers: list[Scorer]
    index: PassageIndex
    make_strategy: Callable[..., RetrievalStrategy]

    def strategy(
        self, steps: Steps, k: int, retriever: Retriever | None = None
    ) -> RetrievalStrategy:
        """The configured strategy over the index (or a narrower retriever) and the steps."""
        try:
            return self.make_strategy(retriever=retriever or self.index, steps=steps, k=k)
        except ValueError as exc:  # settings that do not fit together (adaptive's max_depth)
            raise ConfigError(f"strategy: {exc}") from None


URI_FORMS = (
    "sqlite:///PATH, file:PATH, a plain folder path, http(s)://HOST[:PORT], "
    "postgresql|mysql|mssql://USER@HOST/DB or databricks"
)
DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")
"""SQLAlchemy stores MLflow opens (with or without a driver: postgresql+psycopg2://...)."""
SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


def _shown(value: Any) -> str:
    return "null" if value is None else repr(value) if isinstance(value, str) else str(value)


def _bad(key: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{key}={_shown(value)} is not allowed: expected {allowed}")


def _whole(cfg: DictConfig, key: str, minimum: int | None, meaning: str, *, null: str = "") -> None:
    """A whole number of at least `minimum` (or null when `null` says what null means)."""
    value = OmegaConf.select(cfg, key, default=None)
    if value is None and null:
        return
    whole = not isinstance(value, bool) and isinstance(value, int)
    if not whole or (minimum is not None and value < minimum):
        bound = f" of at least {minimum}" if minimum is not None else ""
        alternative = f" or null for {null}" if null else ""
        raise _bad(key, value, f"a whole number{bound}{alternative} ({meaning})")


def _positive(cfg: DictConfig, key: str, meaning: str, *, zero: bool = False) -> None:
    """A number above 0 (or at least 0 with `zero`)."""
    value = OmegaConf.select(cfg, key, default=None)
    number = not isinstance(value, bool) and isinstance(value, int | float)
    if not number or math.isnan(value) or (value < 0 if zero else value <= 0):
        bound = "at least 0" if zero else "above 0"
        raise _bad(key, value, f"a number {bound} ({meaning})")


def _flag(cfg: DictConfig, key: str, meaning: str) -> None:
    value = OmegaConf.select(cfg, key, default=None)
    if not isinstance(value, bool):
        raise _bad(key, value, f"true or false ({meaning})")


def _limit_per_set(cfg: DictConfig) -> None:
    key = "experiment.limit_per_set"
    value = OmegaConf.select(cfg, key, default=None)
    if isinstance(value, DictConfig):
        for name, keep in value.items():
            if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
                raise _bad(
                    f"{key}.{name!s}",
                    keep,
                    "a whole number of at least 1 (the first N cases of that set)",
                )
        return
    _whole(
        cfg,
        key,
        1,
        "the first N cases of each set, or per set {single_book: 3, follow_up: 1}",
        null="every case",
    )


def check_tracking_uri(cfg: DictConfig) -> None:
    """The MLflow store URI has a form MLflow can open, before MLflow is asked to open it."""
    configured = OmegaConf.select(cfg, "tracking.uri", default=None)
    key, value = "tracking.uri", configured
    if configured is None:
        key, value = "MLFLOW_TRACKING_URI", os.environ.get("MLFLOW_TRACKING_URI")
    if value is None:
        return  # the project's SQLite file
    if not isinstance(value, str) or not value.strip():
        raise _bad(key, value, URI_FORMS)
    scheme = SCHEME.match(value)
    name = scheme.group(1).lower() if scheme else ""
    fine = (
        not scheme  # a plain path
        or (name == "sqlite" and value.startswith("sqlite:///") and len(value) > len("sqlite:///"))
        or (name == "file" and len(value) > len("file:"))
        or (name in ("http", "https") and len(value.split("://", 1)[-1].strip("/")) > 0)
        or (name.split("+")[0] in DATABASE_SCHEMES and "://" in value)
        or (name == "databricks")
    )
    if not fine or (name in ("http", "https") and "://" not in value):
        raise _bad(key, value, URI_FORMS)


def check_settings(cfg: DictConfig) -> None:
    """Every harness setting against what it allows, before anything is built or run.

    Raises ConfigError naming the key, its value and what is allowed (one line).
    """
    _whole(cfg, "retriever.k", 1, "passages handed to generation")
    if OmegaConf.select(cfg, "retriever.index.chunk_chars", default=None) is not None:
        _whole(cfg, "retriever.index.chunk_chars", 1, "characters per embedded chunk")
    _whole(cfg, "experiment.limit", 1, "run the first N cases", null="every case")
    _limit_per_set(cfg)
    _whole(cfg, "experiment.concurrency", 1, "questions in flight at once")
    _workers(cfg)
    _whole(cfg, "experiment.repeats", 1, "times every question is run")
    _positive(cfg, "experiment.question_timeout_s", "seconds one question may take")
    _whole(cfg, "experiment.dry_run_sample", 1, "questions the dry run asks offline")
    _whole(cfg, "experiment.seed", None, "the LLM seed of the first repeat")
    _flag(cfg, "experiment.dry_run", "estimate the cost and ask nothing")
    _flag(cfg, "experiment.progress", "show a progress bar")
    _flag(cfg, "experiment.ragas", "compute the offline RAGAS metrics")
    _flag(cfg, "experiment.cache", "answer identical LLM calls from paths.cache")
    resume = OmegaConf.select(cfg, "experiment.resume", default=None)
    if resume is not None and (OmegaConf.is_config(resume) or not str(resume).strip()):
        raise _bad("experiment.resume", resume, "auto, never or the RUN_ID of an unfinished run")
    _flag(cfg, "pipeline.rewrite", "rewrite follow-ups into standalone questions")
    _whole(cfg, "pipeline.history_pairs", 0, "question/answer pairs the steps see")
    _flag(cfg, "tracking.enabled", "log the run to MLflow")
    _flag(cfg, "tracking.traces", "one MLflow trace per question")
    if cfg.tracking.enabled:
        name = OmegaConf.select(cfg, "tracking.experiment_name", default=None)
        if not isinstance(name, str) or not name.strip():
            raise _bad("tracking.experiment_name", name, "a non-empty MLflow experiment name")
        check_tracking_uri(cfg)
    _check_strategy(cfg)
    _check_llm(cfg)
    if cfg.judge is not None and "max_output_tokens" in cfg.judge:
        _whole(
            cfg,
            "judge.max_output_tokens",
            1,
            "the output cap of one judge reply",
            null="the server's default",
        )


def _workers(cfg: DictConfig) -> None:
    value = OmegaConf.select(cfg, "experiment.workers", default=workers.AUTO)
    if value != workers.AUTO and (
        isinstance(value, bool) or not isinstance(value, int) or value < 1
    ):
        raise _bad(
            "experiment.workers",
            value,
            "auto or a whole number of at least 1 (processes that answer the questions)",
        )


STRATEGY_MINIMUMS = {
    "max_hops": (1, "hops of multi-hop"),
    "follow_k": (1, "passages kept per follow-up query"),
    "n_subquestions": (1, "sub-questions of an expansion (strategy=single for none)"),
    "max_depth": (1, "deepest adaptive depth"),
    "max_iterations": (1, "adaptive searches in all"),
    "max_chunks": (1, "passages adaptive gathers in all"),
    "max_context_tokens": (1, "tokens of the passages handed to generation"),
}


def _check_strategy(cfg: DictConfig) -> None:
    """The numbers of the chosen strategy group (the strategy checks how they fit together)."""
    for name, (minimum, meaning) in STRATEGY_MINIMUMS.items():
        if name in cfg.strategy:
            _whole(cfg, f"strategy.{name}", minimum, meaning)
    if "expand_first_hop" in cfg.strategy:
        _flag(cfg, "strategy.expand_first_hop", "also search the expansion on hop 1")
    if "timeout_s" in cfg.strategy:
        _positive(cfg, "strategy.timeout_s", "seconds adaptive may search")
    chunks = cfg.strategy.get("depth_chunks")
    whole = OmegaConf.is_list(chunks) and all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in chunks
    )
    if chunks is not None and not whole:
        raise _bad(
            "strategy.depth_chunks",
            OmegaConf.to_container(chunks) if OmegaConf.is_config(chunks) else chunks,
            "a list of whole numbers of at least 1 (passages searched at depth 1, 2, 3)",
        )


def _check_llm(cfg: DictConfig) -> None:
    """The client settings of an LLM backend, when the llm group has one."""
    client = cfg.llm.get("client") if "_target_" not in cfg.llm else None
    if not client:
        return
    if "timeout_s" in client:
        _positive(cfg, "llm.client.timeout_s", "seconds one LLM call may take")
    if "max_retries" in client:
        _whole(cfg, "llm.client.max_retries", 0, "retries of a failed call")
    if "parse_attempts" in client:
        _whole(cfg, "llm.client.parse_attempts", 1, "tries to get a parseable reply")
    if "max_output_tokens" in client:
        _whole(cfg, "llm.client.max_output_tokens", 1, "the output cap of one reply")
    if "temperature" in client:
        _positive(cfg, "llm.client.temperature", "the sampling temperature", zero=True)


def _build(cfg: DictConfig, what: str, **overrides: Any) -> Any:
    """instantiate() that surfaces our own errors instead of Hydra's wrapper."""
    try:
        return instantiate(cfg, **overrides)
    except InstantiationException as exc:
        cause = exc.__cause__
        if isinstance(cause, CapragError | DatasetError | FileNotFoundError | ValueError):
            raise cause from None
        raise CapragError(f"cannot build {what}: {exc}") from exc


def steps_from_config(cfg: DictConfig, repeat: int = 0) -> Steps:
    """The configured steps: each role (expander, analyzer, ...) by its rule or by the `llm`
    group's client; a client with a seed gets experiment.seed + repeat. An `llm._target_` (tests,
    benchmarks) builds the whole Steps itself."""
    if "_target_" in cfg.llm:
        return _build(cfg.llm, "the steps")
    settings = client_config(cfg)
    client: StructuredClient | None = None
    rewrite_client: StructuredClient | None = None
    if settings:
        seeded = {"seed": int(cfg.experiment.seed) + repeat} if "seed" in settings else {}
        client = _build(settings, "the LLM client", **seeded)
        rewrite_model = cfg.llm.get("rewrite_model")
        if rewrite_model and rewrite_model != client.model:
            rewrite_client = _build(settings, "the rewrite client", model=rewrite_model, **seeded)
    choices = {role: str(cfg.get(role) or "auto") for role in ROLES}
    return build_steps(
        client,
        rewrite_client=rewrite_client,
        price_model=str(cfg.llm.get("price_model") or "gpt-4o-mini"),
        choices=choices,
    )


def build_components(cfg: DictConfig, *, llm: bool = True) -> Components:
    """Everything the run needs, in the order that fails fastest on bad input.

    `llm=False` (the dry run) builds the offline stand-in instead of the configured backend, so
    nothing can reach a paid endpoint.
    """
    # 1. The questions: a broken line fails here, before any question runs.
    dataset: Dataset = _build(cfg.dataset, "the dataset")
    # 2. The LLM and judge: a missing key fails here.
    model = steps_from_config(cfg) if llm else rule_steps(price_model=estimate_price_model(cfg))
    scorers: list[Scorer] = []
    if llm and cfg.experiment.get("ragas", True):
        from experiments.ragas_metrics import OfflineRagas

        scorers.append(OfflineRagas())
    judge = _build(cfg.judge, "the judge") if llm else None
    if judge is not None:
        scorers.append(judge)
    # 3. The index (ingests new or changed books; a benchmark brings its own), then the strategy.
    index: PassageIndex = _build(
        cfg.retriever.index, "the retriever", **dataset.index_overrides(cfg.retriever.index.store)
    )
    # 4. Every gold passage must be one the index can return: a typo fails here, not as recall 0.
    corpus = "the benchmark's own corpus" if dataset.books else str(cfg.retriever.index.corpus)
    dataset.check_gold_passages(index.parents().keys(), corpus)
    make_strategy = _build(cfg.strategy, "the strategy")
    return Components(dataset, model, scorers, index, make_strategy)


def evaluator_for(cfg: DictConfig, parts: Components, llm: Steps) -> Evaluator:
    """An evaluator over one LLM (one repeat); cases with a passage scope get their own pipeline."""
    k = int(cfg.retriever.k)
    parents = parts.index.parents()

    def pipeline(strategy: RetrievalStrategy) -> Pipeline:
        return Pipeline(
            strategy,
            llm,
            rewrite_follow_ups=cfg.pipeline.rewrite,
            history_window=cfg.pipeline.history_pairs,
        )

    return Evaluator(
        pipeline=pipeline(parts.strategy(llm, k)),
        k=k,
        scorers=parts.scorers,
        concurrency=cfg.experiment.concurrency,
        question_timeout_s=cfg.experiment.question_timeout_s,
        progress=cfg.experiment.progress,
        reference_text=lambda pid: parents[pid].text if pid in parents else "",
        section_of={pid: doc.section for pid, doc in parents.items()},
        gold_query_types=parts.dataset.books is None,
        scoped=lambda scope: pipeline(parts.strategy(llm, k, parts.index.restricted(scope))),
    )


def repeat_evaluator(cfg: DictConfig, parts: Components, repeat: int) -> Evaluator:
    """The evaluator of one repeat: the first uses the built steps, later ones new LLM clients
    seeded experiment.seed + repeat."""
    llm = parts.steps if repeat == 0 else steps_from_config(cfg, repeat)
    return evaluator_for(cfg, parts, llm)


def run(cfg: DictConfig, sweep_id: str | None = None) -> RunResult:
    """Run one configuration end to end and log it to MLflow (unless tracking.enabled=false).

    A run is journaled case by case: when an earlier process of the same run died, the run is
    resumed (experiment.resume=auto or RUN_ID) and only the missing questions are asked.
    With experiment.dry_run=true nothing is asked: the cost estimate is printed and returned.
    """
    check_settings(cfg)
    dry = bool(cfg.experiment.dry_run)
    if not dry:
        if cfg.tracking.enabled and cfg.tracking.traces:
            traces.shared()  # forked before anything is built: the fork copies little
        workers.prepare(cfg)  # the workers' server imports while the components are built
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
    print(f"run {name}: {questions} questions{times}, k={cfg.retriever.k}", flush=True)
    identity = RunIdentity.resolve(cfg, config, parts.dataset)
    tags = run_tags(cfg, identity, strategy, parts.steps)
    writing = bool(cfg.tracking.enabled and cfg.tracking.traces)
    with (
        traces.writer(writing) as trace_writer,  # forked before the journal: it must not hold it
        workers.pool(cfg, config) as pool,  # started while the MLflow run and journal open
        identity.open(name, sweep_id, tags) as (journal, run_id),
    ):
        done = journal.done()
        resumed = sum(len(rows) for rows in done.values())
        if resumed:
            print(
                f"resuming run {run_id or journal.path.stem}: {resumed} of {questions} "
                "questions already done (experiment.resume=never starts over)",
                flush=True,
            )
        if trace_writer is not None and run_id is not None:
            _resume_traces(trace_writer, identity, run_id, done, strategy.name)
        reuse = row_cache(cfg, parts, config)
        try:
            rows = asyncio.run(
                _evaluate_repeats(cfg, parts, repeats, done, journal, trace_writer, reuse, pool)
            )
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
            strategy.name,
            parts.dataset.name,
            rows,
            aggregates,
            summary,
            config=config,
            resumed=resumed,
        )
        if run_id is not None:
            result.run_id = run_id
            result.traces = _log(result, trace_writer, uri=identity.uri)
    failed = failures(result.rows)
    print(run_table(result.aggregates, result.summary, failed), flush=True)
    if failed.all_failed:
        print(
            f"warning: every question failed ({failed.failed} of {failed.total}), so no metric "
            f"has a value; most common error: {failed.most_common()}",
            file=sys.stderr,
            flush=True,
        )
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
    """Every repeat in one event loop (HTTP clients are bound to the loop that opened them), or
    over the pool's worker processes (experiment.workers).

    Cases the journal has (a resumed run) or the row cache has (an identical earlier run) are not
    asked again. A case that finishes is journaled, offered to the row cache and its traces
    queued for the writer; a reused case's traces are queued too (this run has none yet)."""
    rows: list[QuestionRow] = []
    for repeat in range(repeats):

        def record(case: EvalCase, found: list[QuestionRow], r: int = repeat) -> None:
            journal.append(case_key(r, case.id), found)
            if reuse is not None:
                reuse.put(r, case, found)
            if trace_writer is not None:
                trace_writer.submit(found)

        prefix = f"{repeat}:"
        known = {k.removeprefix(prefix): v for k, v in done.items() if k.startswith(prefix)}
        if reuse is not None:
            for case in parts.dataset.cases:
                found = None if case.id in known else reuse.get(repeat, case)
                if found is not None:
                    known[case.id] = found
                    if trace_writer is not None:
                        trace_writer.submit(found)
        evaluate = repeat_evaluator(cfg, parts, repeat).run if pool is None else pool.run
        rows += await evaluate(
            parts.dataset,
            done=known,
            on_case=record,
            repeat=repeat,
        )
    return rows


def row_cache(cfg: DictConfig, parts: Components, config: Mapping[str, Any]) -> RowCache | None:
    """The cache of finished rows (experiment.cache=true, an index that reports its books), in
    the LLM response cache's file."""
    manifest = getattr(parts.index, "manifest", None)
    if not cfg.experiment.cache or manifest is None:
        return None
    return RowCache(Path(cfg.paths.cache), run_fingerprint(config, manifest()))


def _resume_traces(
    trace_writer: traces.TraceWriter,
    identity: RunIdentity,
    run_id: str,
    done: dict[str, list[QuestionRow]],
    strategy: str = "",
) -> None:
    """Point the writer at the run (its traces tagged with the strategy); a resumed run first
    queues the journaled questions whose trace the killed process did not write."""
    assert identity.uri is not None and identity.experiment_id is not None
    target = traces.Target(identity.uri, identity.experiment_id, run_id, strategy)
    trace_writer.bind(target)
    if done:
        traced = traces.traced_cases(target)
        journaled = [row for rows in done.values() for row in rows]
        trace_writer.submit([row for row in journaled if traces.case_of(row) not in traced])


def _log(result: RunResult, trace_writer: traces.TraceWriter | None, uri: str | None) -> int:
    """Results and table into the open run (while the trace writer writes its last batch), then
    waits for the writer."""
    if trace_writer is not None:
        trace_writer.finish()
    tracking.log_results(result.rows, result.aggregates, result.summary)
    written = trace_writer.close(result.rows) if trace_writer is not None else 0
    print(f"logged MLflow run {result.run_id} ({written} traces) to {uri}")
    return written


@dataclass
class RunIdentity:
    """Which run this process writes: a new one, or an unfinished one it resumes."""

    cfg: DictConfig
    config: dict[str, Any]
    dataset: Dataset
    config_hash: str
    uri: str | None = None
    experiment_id: str | None = None
    resume_id: str | None = None
    journal_name: str | None = None

    @classmethod
    def resolve(cls, cfg: DictConfig, config: dict[str, Any], dataset: Dataset) -> RunIdentity:
        """Pick the run by experiment.resume: auto (an unfinished run of this config whose
        process is dead), a RUN_ID, or never."""
        identity = cls(cfg, config, dataset, config_hash(config, dataset.content_hash))
        wanted = str(cfg.experiment.resume or "never")
        folder = Path(cfg.paths.journals)
        if cfg.tracking.enabled:
            identity.uri = tracking.tracking_uri(cfg.tracking.uri)
            identity.experiment_id = tracking.use_experiment(
                identity.uri, cfg.tracking.experiment_name
            )
        if wanted == "never":
            return identity
        if wanted == "auto":
            candidates = (
                tracking.unfinished_runs(identity.experiment_id, identity.config_hash)
                if identity.experiment_id is not None
                else [f"cfg-{identity.config_hash}"]
            )
            for candidate in candidates:
                journal = Journal(folder, candidate)
                if journal.exists and not journal.busy():
                    identity.resume_id = candidate if cfg.tracking.enabled else None
                    identity.journal_name = candidate
                    break
            else:
                identity._report_journals_elsewhere(candidates, folder)
            return identity
        identity._check_resumable(wanted)
        identity.resume_id = identity.journal_name = wanted
        return identity

    def _report_journals_elsewhere(self, candidates: list[str], folder: Path) -> None:
        """Say so when an unfinished run of this config was journaled on another machine (or
        in another paths.journals): it cannot be resumed here, so a new run starts."""
        if self.experiment_id is None:
            return
        for candidate in candidates:
            if Journal(folder, candidate).exists:
                continue  # its process is still going on this machine
            info = tracking.run_info(candidate)
            where = (info[1] if info else {}).get(tracking.JOURNAL_TAG)
            print(
                f"warning: run {candidate} of this configuration is unfinished in {self.uri}, but "
                f"its journal is not in {folder} on {socket.gethostname()}"
                + (f" (it is at {where})" if where else "")
                + "; starting a new run. To resume it, run again where that journal is, or keep "
                "paths.journals on storage every machine shares",
                file=sys.stderr,
                flush=True,
            )
            return

    def _check_resumable(self, run_id: str) -> None:
        if self.uri is None:
            raise CapragError(
                f"experiment.resume={run_id} needs tracking (tracking.enabled=true); without it, "
                "experiment.resume=auto continues the unfinished run of the same config"
            )
        info = tracking.run_info(run_id)
        if info is None:
            raise CapragError(f"experiment.resume={run_id}: no such run in {self.uri}")
        status, tags = info
        if status == "FINISHED":
            raise CapragError(f"experiment.resume={run_id}: that run is already complete")
        theirs = tags.get("caprag.config_hash")
        if theirs != self.config_hash:
            raise CapragError(
                f"experiment.resume={run_id}: that run was made with another configuration "
                f"(config hash {theirs}, this one {self.config_hash}); resume it with the "
                "overrides it was started with"
            )

    @contextlib.contextmanager
    def open(
        self, name: str, sweep_id: str | None, tags: dict[str, str]
    ) -> Iterator[tuple[Journal, str | None]]:
        """The journal to append to and the MLflow run id (None without tracking); the run is
        ended FINISHED and the journal removed only when the body completes."""
        folder = Path(self.cfg.paths.journals)
        if self.experiment_id is None:
            journal = Journal(folder, self.journal_name or f"cfg-{self.config_hash}").open()
            with _kept_on_failure(journal):
                yield journal, None
            journal.close(remove=True)
            return
        parent = (
            tracking.parent_run(
                self.experiment_id, sweep_id, sweep_name(self.cfg, sweep_id, self.dataset.name)
            )
            if sweep_id and self.resume_id is None
            else None
        )
        with tracking.start(name, parent, tags, run_id=self.resume_id) as active:
            run_id = str(active.info.run_id)
            journal = Journal(folder, self.journal_name or run_id).open()
            tracking.tag_journal(journal.path)
            print(f"MLflow run {run_id} (if interrupted: experiment.resume={run_id})", flush=True)
            if self.resume_id is None:
                tracking.log_config(self.config)
            with _kept_on_failure(journal):
                yield journal, run_id
        journal.close(remove=True)


def swept(sweep_dir: str | Path) -> list[str]:
    """The overrides a Hydra sweep varies (`strategy=single,multi-hop`, `k=range(5,20,5)`), as
    typed: the sweeper's `params` and the command line's sweep overrides, read from the
    `multirun.yaml` Hydra saves in the sweep folder before any job starts (empty when absent)."""
    saved = Path(sweep_dir) / "multirun.yaml"
    if not saved.is_file():
        return []
    loaded = OmegaConf.load(saved)
    hydra_cfg = loaded.get("hydra") if isinstance(loaded, DictConfig) else None
    if not isinstance(hydra_cfg, DictConfig):
        return []
    params = OmegaConf.select(hydra_cfg, "sweeper.params") or {}
    given = [f"{key}={value}" for key, value in params.items()]
    given += [str(o) for o in OmegaConf.select(hydra_cfg, "overrides.task") or []]
    parsed = OverridesParser.create().parse_overrides(given)
    return [
        f"{o.key_or_group}={o.input_line.split('=', 1)[1]}"
        for o in parsed
        if o.is_sweep_override() and o.input_line is not None
    ]


def sweep_name(cfg: DictConfig, sweep_dir: str | Path, dataset: str) -> str:
    """The sweep's parent run name: what it varies and on which dataset, e.g.
    `sweep strategy=single,multi-hop · curated` (a preset's name leads when one is chosen; the
    dataset is left out when it is itself swept)."""
    varied = swept(sweep_dir)
    words = [] if str(cfg.experiment.name) == "default" and varied else [str(cfg.experiment.name)]
    name = " ".join(["sweep", *words, *varied])
    if any(v.split("=", 1)[0] == "dataset" for v in varied):
        return name
    return f"{name} · {dataset}"


@contextlib.contextmanager
def _kept_on_failure(journal: Journal) -> Iterator[None]:
    """Close (and keep) the journal when the body raises: its lock is released at once, so the
    same process can resume the run while the traceback (which holds the journal) lives on."""
    try:
        yield
    except BaseException:
        journal.close()
        raise


DEFAULT_RETRIEVER = "dense-minilm"
"""Runs over it keep their names; another retriever is named at the end of the run name."""


def retriever_label(cfg: DictConfig) -> str:
    """The retriever a run searched with: bm25, dense-<embedding> or hybrid-<embedding>."""
    index = cfg.retriever.index
    kind = str(index.get("kind") or "dense")
    return kind if kind == "bm25" else f"{kind}-{index.get('embedding') or 'minilm'}"


def run_tags(
    cfg: DictConfig, identity: RunIdentity, strategy: RetrievalStrategy, llm: Steps
) -> dict[str, str]:
    """What the dashboard and the gate filter runs by, plus versions that explain numbers."""
    return {
        "caprag.strategy": strategy.name,
        "caprag.retriever": retriever_label(cfg),
        "caprag.dataset": identity.dataset.name,
        "caprag.dataset_hash": identity.dataset.content_hash,
        "caprag.config_hash": identity.config_hash,
        "caprag.llm": llm.backend,
        "caprag.model": llm.model,
        **{f"caprag.step.{role}": kind for role, kind in llm.kinds().items()},
        "caprag.experiment": str(cfg.experiment.name),
        "caprag.git_commit": tracking.git_commit(),
        "caprag.price_table": PRICE_TABLE_VERSION,
        "caprag.schema": "1",
        "caprag.repeats": str(max(1, int(cfg.experiment.repeats))),
        **{f"caprag.prompt.{k}": v for k, v in prompt_versions().items()},
        **{str(k): str(v) for k, v in (cfg.experiment.tags or {}).items()},
    }


cluster.quiet_launcher_schema_warning()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Hydra entry point: resolve the config and run it. Exit 2 with a one-line error on bad
    input (before any question is asked); exit 1 when every question of the run failed."""
    sweep_id = None
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        sweep_id = str(HydraConfig.get().sweep.dir)
    try:
        result = run(cfg, sweep_id=sweep_id)
    except MissingMandatoryValue as exc:
        print(f"error: {exc.full_key} must be set ({exc.full_key}=...)", file=sys.stderr)
        sys.exit(2)
    except (CapragError, DatasetError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    if result.all_failed and sweep_id is None:
        sys.exit(1)  # in a sweep the warning is printed and the other jobs still run
    return result.mean("recall_at_k")


if __name__ == "__main__":
    main()
