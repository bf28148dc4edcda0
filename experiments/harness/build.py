"""Builders: the objects a run is made of, from config (`_target_` + instantiate), dependencies
passed in. Nothing here runs a question."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from caprag.errors import CapragError, ConfigError
from caprag.llm import StructuredClient
from caprag.retrieval.books import Book, corpus_library, library_of, load_books
from caprag.retrieval.hybrid import RRF_K
from caprag.retrieval.retrievers import RETRIEVERS, Index, make_index
from caprag.serve.services import Pipeline
from caprag.steps import ROLES, Steps, Wording, build_steps, rule_steps
from caprag.steps.analyze import Links
from caprag.steps.base import NEUTRAL
from caprag.strategies import RetrievalStrategy, Retriever
from caprag.text import DEFAULT_REFUSAL
from experiments.harness.benchmarks import pool_notice
from experiments.harness.data import Dataset
from experiments.harness.dryrun import (
    client_config,
    estimate_price_model,
)
from experiments.harness.evaluate import Evaluator
from experiments.harness.reuse import RowCache, run_fingerprint
from experiments.results.questions import DatasetError
from experiments.scoring.question import Scorer


def build_index(
    corpus: str | Path,
    store: str | Path,
    embedding: str = "minilm",
    chunk_chars: int = 420,
    ingest: bool = True,
    progress: bool = True,
    books: Sequence[Book] | None = None,
    kind: str = "dense",
    rrf_k: int = RRF_K,
) -> Index:
    """Open the passage index and bring it up to date (unchanged books skipped).

    `kind`: a registered retriever (`caprag.retrieval.retrievers.RETRIEVERS`): dense (embedded
    chunks in Chroma), bm25 (lexical, in `<store>/bm25/`), hybrid (both, fused by reciprocal rank
    with constant `rrf_k`) or one a plugin adds. `books` (a benchmark's own corpus) replaces the
    books under `corpus`, which is then not read.
    """
    if books is not None and not all(isinstance(book, Book) for book in books):
        raise ConfigError(
            "build_index(books=...) needs Book objects; through hydra.utils.instantiate pass them "
            "as experiments.harness.data.BookCorpus (a list of dataclasses is turned into configs)"
        )
    if kind not in RETRIEVERS:
        expected = " | ".join(RETRIEVERS)
        raise ConfigError(f"retriever kind={kind!r} is not allowed: expected {expected}")
    if isinstance(rrf_k, bool) or not isinstance(rrf_k, int) or rrf_k < 1:
        raise ConfigError(f"retriever rrf_k={rrf_k!r} is not allowed: expected a whole number >= 1")
    index = make_index(kind, store, embedding, child_chars=chunk_chars, rrf_k=rrf_k)
    if ingest:
        index.ingest(load_books(corpus) if books is None else books, progress=progress)
    return index


@dataclass
class Components:
    """What a run is made of, built from config; the LLM is rebuilt per repeat (its seed)."""

    dataset: Dataset
    steps: Steps
    scorers: list[Scorer]
    index: Index
    make_strategy: Callable[..., RetrievalStrategy]

    def strategy(
        self, steps: Steps, k: int, retriever: Retriever | None = None
    ) -> RetrievalStrategy:
        """The configured strategy over the index (or a narrower retriever) and the steps."""
        try:
            return self.make_strategy(retriever=retriever or self.index, steps=steps, k=k)
        except ConfigError:
            raise  # an option its model refused: already one line naming it
        except ValueError as exc:  # a plugin strategy's own check of its arguments
            raise ConfigError(f"strategy: {exc}") from None


def instantiate_or_raise(cfg: DictConfig, what: str, **overrides: Any) -> Any:
    """instantiate() that surfaces our own errors instead of Hydra's wrapper."""
    try:
        return instantiate(cfg, **overrides)
    except InstantiationException as exc:
        cause = exc.__cause__
        if isinstance(cause, CapragError | DatasetError | FileNotFoundError | ValueError):
            raise cause from None
        raise CapragError(f"cannot build {what}: {exc}") from exc


def wording_of(cfg: DictConfig, dataset: Dataset) -> Wording:
    """How the steps speak of this dataset's corpus: `dataset.library` (else the words its books'
    titles share: `caprag.text.library_name`) and `pipeline.refusal`."""
    library = dataset.library
    if library is None:
        books = dataset.books
        library = library_of(books) if books else corpus_library(str(cfg.retriever.index.corpus))
    return Wording(library=library, refusal=str(cfg.pipeline.get("refusal") or DEFAULT_REFUSAL))


def steps_from_config(
    cfg: DictConfig, repeat: int = 0, links: Links = "citations", wording: Wording = NEUTRAL
) -> Steps:
    """The configured steps: each role (expander, analyzer, ...) by its rule or by the `llm`
    group's client; a client with a seed gets experiment.seed + repeat. An `llm._target_` (tests,
    benchmarks) builds the whole Steps itself."""
    if "_target_" in cfg.llm:
        return instantiate_or_raise(cfg.llm, "the steps")
    settings = client_config(cfg)
    client: StructuredClient | None = None
    rewrite_client: StructuredClient | None = None
    if settings:
        seeded = {"seed": int(cfg.experiment.seed) + repeat} if "seed" in settings else {}
        client = instantiate_or_raise(settings, "the LLM client", **seeded)
        rewrite_model = cfg.llm.get("rewrite_model")
        if rewrite_model and rewrite_model != client.model:
            rewrite_client = instantiate_or_raise(
                settings, "the rewrite client", model=rewrite_model, **seeded
            )
    choices = {role: str(cfg.get(role) or "auto") for role in ROLES}
    return build_steps(
        client,
        rewrite_client=rewrite_client,
        price_model=str(cfg.llm.get("price_model") or "gpt-4o-mini"),
        choices=choices,
        links=links,
        wording=wording,
    )


def import_metric_modules(cfg: DictConfig) -> None:
    """Import the modules named in `experiment.metric_modules`: each registers its metrics
    (experiments.results.metrics.register), so this process computes and shows them."""
    for name in OmegaConf.select(cfg, "experiment.metric_modules", default=None) or ():
        try:
            importlib.import_module(str(name))
        except ImportError as exc:
            raise ConfigError(f"experiment.metric_modules: cannot import {name!r} ({exc})") from exc


def build_components(cfg: DictConfig, *, llm: bool = True) -> Components:
    """Everything the run needs, in the order that fails fastest on bad input.

    `llm=False` (the dry run) builds the offline stand-in instead of the configured backend, so
    nothing can reach a paid endpoint.
    """
    # 0. Metrics of other modules (+experiment.metric_modules=[...]) register themselves.
    import_metric_modules(cfg)
    # 1. The questions: a broken line fails here, before any question runs.
    dataset: Dataset = instantiate_or_raise(cfg.dataset, "the dataset")
    # 2. The LLM and judge: a missing key fails here.
    wording = wording_of(cfg, dataset)
    model = (
        steps_from_config(cfg, links=dataset.links, wording=wording)
        if llm
        else rule_steps(estimate_price_model(cfg), dataset.links, wording)
    )
    scorers: list[Scorer] = []
    if llm and cfg.experiment.get("ragas", True):
        from experiments.scoring.ragas_metrics import OfflineRagas

        scorers.append(OfflineRagas())
    judge = instantiate_or_raise(cfg.judge, "the judge") if llm else None
    if judge is not None:
        scorers.append(judge)
    # 3. The index (ingests new or changed books; a benchmark brings its own), then the strategy.
    if dataset.books:  # a benchmark: say what it will index before the embedding starts
        options = cfg.retriever.index
        kind, embedding = str(options.get("kind", "dense")), str(options.get("embedding", ""))
        print(pool_notice(dataset, kind, embedding), flush=True)
    index: Index = instantiate_or_raise(
        cfg.retriever.index, "the retriever", **dataset.index_overrides(cfg.retriever.index.store)
    )
    # 4. Every gold passage must be one the index can return: a typo fails here, not as recall 0.
    corpus = "the benchmark's own corpus" if dataset.books else str(cfg.retriever.index.corpus)
    dataset.check_gold_passages(index.parents().keys(), corpus)
    make_strategy = instantiate_or_raise(
        cfg.strategy, "the strategy", **corpus_options(cfg, dataset)
    )
    return Components(dataset, model, scorers, index, make_strategy)


def corpus_options(cfg: DictConfig, dataset: Dataset) -> dict[str, str]:
    """What a strategy takes from the dataset: adaptive's `calibration: auto` becomes the
    calibration the dataset names (fitted on other data)."""
    if str(cfg.strategy.get("calibration")) == "auto":
        return {"calibration": dataset.calibration}
    return {}


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
    llm = (
        parts.steps
        if repeat == 0
        else steps_from_config(cfg, repeat, parts.dataset.links, wording_of(cfg, parts.dataset))
    )
    return evaluator_for(cfg, parts, llm)


def row_cache(cfg: DictConfig, parts: Components, config: Mapping[str, Any]) -> RowCache | None:
    """The cache of finished rows (experiment.cache=true, an index that reports its books), in
    the LLM response cache's file."""
    manifest = getattr(parts.index, "manifest", None)
    if not cfg.experiment.cache or manifest is None:
        return None
    return RowCache(Path(cfg.paths.cache), run_fingerprint(config, manifest()))
