"""`python -m experiments.run strategy=multi-hop [...]`: one experiment (or a sweep with -m).

`main` is a thin Hydra shell; `run(cfg)` does the work and is what tests call.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from caprag.errors import CapragError
from caprag.llm import StructuredClient
from caprag.llm.usage import PRICE_TABLE_VERSION
from caprag.services import Pipeline
from caprag.steps import ROLES, Steps, build_steps, prompt_versions, rule_steps
from caprag.store import PassageIndex
from caprag.strategies import RetrievalStrategy, Retriever
from experiments import tracking
from experiments.data import Dataset, EvalCase
from experiments.dryrun import CostEstimate, client_config, estimate_cost, estimate_price_model
from experiments.evaluate import (
    Aggregate,
    Evaluator,
    QuestionRow,
    Scorer,
    aggregate,
    summary_metrics,
)
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
        return self.make_strategy(retriever=retriever or self.index, steps=steps, k=k)


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


def run(cfg: DictConfig, sweep_id: str | None = None) -> RunResult:
    """Run one configuration end to end and log it to MLflow (unless tracking.enabled=false).

    A run is journaled case by case: when an earlier process of the same run died, the run is
    resumed (experiment.resume=auto or RUN_ID) and only the missing questions are asked.
    With experiment.dry_run=true nothing is asked: the cost estimate is printed and returned.
    """
    dry = bool(cfg.experiment.dry_run)
    parts = build_components(cfg, llm=not dry)
    raw = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(raw, dict)
    config = {str(k): v for k, v in raw.items()}
    strategy = parts.strategy(parts.steps, int(cfg.retriever.k))
    variant = f" power={cfg.strategy.power}" if "power" in cfg.strategy else ""
    backend = ("llm" if client_config(cfg) else "offline") if dry else parts.steps.backend
    name = f"{cfg.experiment.name}:{strategy.name}{variant}:{parts.dataset.name}:{backend}"
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
    with identity.open(name, sweep_id, tags) as (journal, run_id):
        done = journal.done()
        resumed = sum(len(rows) for rows in done.values())
        if resumed:
            print(
                f"resuming run {run_id or journal.path.stem}: {resumed} of {questions} "
                "questions already done (experiment.resume=never starts over)",
                flush=True,
            )
        start_ns = time.time_ns()
        rows = asyncio.run(_evaluate_repeats(cfg, parts, repeats, done, journal))
        aggregates = aggregate(rows)
        summary = summary_metrics(rows)
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
            result.traces = _log(cfg, result, start_ns, uri=identity.uri)
    print(run_table(aggregates, summary))
    return result


async def _evaluate_repeats(
    cfg: DictConfig,
    parts: Components,
    repeats: int,
    done: dict[str, list[QuestionRow]],
    journal: Journal,
) -> list[QuestionRow]:
    """Every repeat in one event loop (HTTP clients are bound to the loop that opened them)."""
    rows: list[QuestionRow] = []
    for repeat in range(repeats):
        llm = parts.steps if repeat == 0 else steps_from_config(cfg, repeat)
        evaluator = evaluator_for(cfg, parts, llm)

        def record(case: EvalCase, found: list[QuestionRow], r: int = repeat) -> None:
            journal.append(case_key(r, case.id), found)

        prefix = f"{repeat}:"
        rows += await evaluator.run(
            parts.dataset,
            done={k.removeprefix(prefix): v for k, v in done.items() if k.startswith(prefix)},
            on_case=record,
            repeat=repeat,
        )
    return rows


def _log(cfg: DictConfig, result: RunResult, start_ns: int, uri: str | None) -> int:
    """Results, table and traces into the open run."""
    tracking.log_results(result.rows, result.aggregates, result.summary)
    traces = tracking.log_traces(result.rows, start_ns) if cfg.tracking.traces else 0
    print(f"logged MLflow run {result.run_id} ({traces} traces) to {uri}")
    return traces


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
            return identity
        identity._check_resumable(wanted)
        identity.resume_id = identity.journal_name = wanted
        return identity

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
            yield journal, None
            journal.close(remove=True)
            return
        parent = (
            tracking.parent_run(self.experiment_id, sweep_id, f"sweep {self.cfg.experiment.name}")
            if sweep_id and self.resume_id is None
            else None
        )
        with tracking.start(name, parent, tags, run_id=self.resume_id) as active:
            run_id = str(active.info.run_id)
            journal = Journal(folder, self.journal_name or run_id).open()
            print(f"MLflow run {run_id} (if interrupted: experiment.resume={run_id})", flush=True)
            if self.resume_id is None:
                tracking.log_config(self.config)
            yield journal, run_id
        journal.close(remove=True)


def run_tags(
    cfg: DictConfig, identity: RunIdentity, strategy: RetrievalStrategy, llm: Steps
) -> dict[str, str]:
    """What the dashboard and the gate filter runs by, plus versions that explain numbers."""
    return {
        "caprag.strategy": strategy.name,
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


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Hydra entry point: resolve the config, run it, exit 2 with a clear message on bad input."""
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
    return result.mean("recall_at_k")


if __name__ == "__main__":
    main()
