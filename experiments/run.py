"""`python -m experiments.run strategy=multi-hop [...]`: one experiment (or a sweep with -m).

`main` is a thin Hydra shell; `run(cfg)` does the work and is what tests call.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from caprag.errors import CapragError
from caprag.llm import LLM
from caprag.llm.usage import PRICE_TABLE_VERSION
from caprag.prompts import prompt_versions
from caprag.services import Pipeline
from caprag.store import PassageIndex
from caprag.strategies import RetrievalStrategy
from experiments import tracking
from experiments.data import Dataset
from experiments.evaluate import (
    Aggregate,
    Evaluator,
    QuestionRow,
    Scorer,
    aggregate,
    summary_metrics,
)
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

    def mean(self, metric: str) -> float | None:
        """The aggregate mean of a metric (None when no question has it)."""
        agg = self.aggregates.get(metric)
        return agg.mean if agg else None


def _build(cfg: DictConfig, what: str) -> Any:
    """instantiate() that surfaces our own errors instead of Hydra's wrapper."""
    try:
        return instantiate(cfg)
    except InstantiationException as exc:
        cause = exc.__cause__
        if isinstance(cause, CapragError | DatasetError | FileNotFoundError | ValueError):
            raise cause from None
        raise CapragError(f"cannot build {what}: {exc}") from exc


def build_components(
    cfg: DictConfig,
) -> tuple[Dataset, LLM, list[Scorer], PassageIndex, RetrievalStrategy]:
    """Everything the run needs, in the order that fails fastest on bad input."""
    # 1. The questions: a broken line fails here, before any question runs.
    dataset: Dataset = _build(cfg.dataset, "the dataset")
    # 2. The LLM and judge: a missing key fails here.
    llm: LLM = _build(cfg.llm, "the LLM backend")
    scorers: list[Scorer] = []
    if cfg.experiment.get("ragas", True):
        from experiments.ragas_metrics import OfflineRagas

        scorers.append(OfflineRagas())
    judge = _build(cfg.judge, "the judge")
    if judge is not None:
        scorers.append(judge)
    # 3. The index (ingests new or changed books), then the strategy with its dependencies.
    index: PassageIndex = _build(cfg.retriever.index, "the retriever")
    make_strategy = _build(cfg.strategy, "the strategy")
    strategy: RetrievalStrategy = make_strategy(retriever=index, llm=llm, k=cfg.retriever.k)
    return dataset, llm, scorers, index, strategy


def run(cfg: DictConfig, sweep_id: str | None = None) -> RunResult:
    """Run one configuration end to end and log it to MLflow (unless tracking.enabled=false)."""
    dataset, llm, scorers, index, strategy = build_components(cfg)
    parents = index.parents()
    evaluator = Evaluator(
        pipeline=Pipeline(
            strategy,
            llm,
            rewrite_follow_ups=cfg.pipeline.rewrite,
            history_window=cfg.pipeline.history_pairs,
        ),
        k=cfg.retriever.k,
        scorers=scorers,
        concurrency=cfg.experiment.concurrency,
        question_timeout_s=cfg.experiment.question_timeout_s,
        progress=cfg.experiment.progress,
        reference_text=lambda pid: parents[pid].text if pid in parents else "",
        section_of={pid: doc.section for pid, doc in parents.items()},
    )
    variant = f" power={cfg.strategy.power}" if "power" in cfg.strategy else ""
    name = f"{cfg.experiment.name}:{strategy.name}{variant}:{dataset.name}:{llm.backend}"
    raw = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(raw, dict)
    config = {str(k): v for k, v in raw.items()}
    print(f"run {name}: {dataset.questions} questions, k={cfg.retriever.k}", flush=True)
    start_ns = time.time_ns()
    rows = asyncio.run(evaluator.run(dataset))
    aggregates = aggregate(rows)
    summary = summary_metrics(rows)
    result = RunResult(name, strategy.name, dataset.name, rows, aggregates, summary, config=config)
    if cfg.tracking.enabled:
        result.run_id, result.traces = _log(cfg, result, dataset, llm, sweep_id, start_ns)
    print(run_table(aggregates, summary))
    return result


def _log(
    cfg: DictConfig,
    result: RunResult,
    dataset: Dataset,
    llm: LLM,
    sweep_id: str | None,
    start_ns: int,
) -> tuple[str, int]:
    uri = tracking.tracking_uri(cfg.tracking.uri)
    experiment_id = tracking.use_experiment(uri, cfg.tracking.experiment_name)
    parent = (
        tracking.parent_run(experiment_id, sweep_id, f"sweep {cfg.experiment.name}")
        if (sweep_id)
        else None
    )
    tags = {
        "caprag.strategy": result.strategy,
        "caprag.dataset": result.dataset,
        "caprag.dataset_hash": dataset.content_hash,
        "caprag.llm": llm.backend,
        "caprag.model": llm.model,
        "caprag.experiment": str(cfg.experiment.name),
        "caprag.git_commit": tracking.git_commit(),
        "caprag.price_table": PRICE_TABLE_VERSION,
        "caprag.schema": "1",
        **{f"caprag.prompt.{k}": v for k, v in prompt_versions().items()},
        **{str(k): str(v) for k, v in (cfg.experiment.tags or {}).items()},
    }
    with tracking.start(result.name, parent, tags) as active:
        tracking.log_config(result.config)
        tracking.log_results(result.rows, result.aggregates, result.summary)
        traces = tracking.log_traces(result.rows, start_ns) if cfg.tracking.traces else 0
        run_id = str(active.info.run_id)
    print(f"logged MLflow run {run_id} ({traces} traces) to {uri}")
    return run_id, traces


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Hydra entry point: resolve the config, run it, exit 2 with a clear message on bad input."""
    sweep_id = None
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        sweep_id = str(HydraConfig.get().sweep.dir)
    try:
        result = run(cfg, sweep_id=sweep_id)
    except (CapragError, DatasetError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    return result.mean("recall_at_k")


if __name__ == "__main__":
    main()
