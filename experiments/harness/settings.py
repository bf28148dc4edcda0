"""Every harness setting checked against what it allows, before anything is built or run."""

from __future__ import annotations

import math
import os
import re
from typing import Any

from omegaconf import DictConfig, OmegaConf

from caprag.errors import ConfigError

URI_FORMS = (
    "sqlite:///PATH, file:PATH, a plain folder path, http(s)://HOST[:PORT], "
    "postgresql|mysql|mssql://USER@HOST/DB or databricks"
)

DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")
"""SQLAlchemy stores MLflow opens (with or without a driver: postgresql+psycopg2://...)."""

WORKERS_AUTO = "auto"
"""experiment.workers=auto (experiments.harness.workers.AUTO: that module is not imported here)."""

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
    value = OmegaConf.select(cfg, "experiment.workers", default=WORKERS_AUTO)
    if value != WORKERS_AUTO and (
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
