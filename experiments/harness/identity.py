"""Which MLflow run and journal a run writes (new or resumed), its name in a sweep, its tags."""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from caprag.errors import CapragError
from caprag.llm.usage import PRICE_TABLE_VERSION
from caprag.retrieval.retrievers import RETRIEVERS
from caprag.steps import Steps, prompt_versions
from caprag.strategies import RetrievalStrategy
from experiments.harness import cluster
from experiments.harness.data import Dataset
from experiments.harness.journal import Journal, config_hash
from experiments.results import row, tracking


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

    def parent(self, sweep_id: str) -> str:
        """The sweep's parent run (taken over from a killed sweep of the same command)."""
        assert self.experiment_id is not None
        name = sweep_name(self.cfg, sweep_id, self.dataset.name)
        return tracking.parent_run(self.experiment_id, sweep_id, name, sweep_key(sweep_id))

    def finished_in_sweep(self, sweep_id: str | None) -> str | None:
        """The run of this config that a killed earlier attempt of this sweep finished (the
        sweep run again keeps it as it is), if there is one."""
        if self.experiment_id is None or not sweep_id or self.resume_id is not None:
            return None
        return tracking.finished_child(self.experiment_id, self.parent(sweep_id), self.config_hash)

    @contextlib.contextmanager
    def open(
        self,
        name: str,
        sweep_id: str | None,
        tags: dict[str, str],
        setup: Mapping[str, str] | None = None,
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
        parent = self.parent(sweep_id) if sweep_id and self.resume_id is None else None
        with tracking.start(name, parent, tags, run_id=self.resume_id) as active:
            run_id = str(active.info.run_id)
            journal = Journal(folder, self.journal_name or run_id).open()
            tracking.tag_journal(journal.path)
            print(f"MLflow run {run_id} (if interrupted: experiment.resume={run_id})", flush=True)
            if self.resume_id is None:
                tracking.log_config({**self.config, "resolved": dict(setup or {})})
            with _kept_on_failure(journal):
                yield journal, run_id
        journal.close(remove=True)


def _sweep_command(sweep_dir: str | Path) -> list[str]:
    """The overrides a Hydra sweep was started with, as typed: the sweeper's `params` and the
    command line's, read from the `multirun.yaml` Hydra saves in the sweep folder before any job
    starts (empty when absent)."""
    saved = Path(sweep_dir) / "multirun.yaml"
    if not saved.is_file():
        return []
    loaded = OmegaConf.load(saved)
    hydra_cfg = loaded.get("hydra") if isinstance(loaded, DictConfig) else None
    if not isinstance(hydra_cfg, DictConfig):
        return []
    params = OmegaConf.select(hydra_cfg, "sweeper.params") or {}
    given = [f"{key}={value}" for key, value in params.items()]
    return given + [str(o) for o in OmegaConf.select(hydra_cfg, "overrides.task") or []]


def sweep_key(sweep_dir: str | Path) -> str:
    """What identifies a sweep across attempts: a hash of its command's overrides (empty when
    the sweep folder has no `multirun.yaml`: then each attempt is a sweep of its own)."""
    given = _sweep_command(sweep_dir)
    if not given:
        return ""
    return hashlib.sha256(json.dumps(sorted(given)).encode()).hexdigest()[:16]


def swept(sweep_dir: str | Path) -> list[str]:
    """The overrides a Hydra sweep varies (`strategy=single,multi-hop`, `k=range(5,20,5)`), as
    typed (empty when the sweep folder has no `multirun.yaml`)."""
    given = _sweep_command(sweep_dir)
    if not given:
        return []
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
    """The retriever a run searched with: its kind, and the embedding for kinds that embed
    (bm25, dense-minilm, hybrid-wordllama)."""
    index = cfg.retriever.index
    kind = str(index.get("kind") or "dense")
    return RETRIEVERS.choose(kind).label(str(index.get("embedding") or "minilm"))


def resolved_setup(
    cfg: DictConfig, parts: Any, strategy: RetrievalStrategy, given: Sequence[str] | None
) -> dict[str, str]:
    """What the run really uses, defaults resolved: strategy (and whether the command line
    chose it), retriever, k, how the corpus links its passages, and adaptive's calibration with
    the data it was fitted on. Printed at the start, logged as `resolved.*` params."""
    setup = {
        "strategy": strategy.name,
        "strategy_from": "given"
        if given is None or "strategy" in given
        else "the default: choose with strategy=...",
        "retriever": retriever_label(cfg),
        "k": str(cfg.retriever.k),
        "links": parts.dataset.links,
    }
    if given is None:
        setup.pop("strategy_from")
    calibration = getattr(strategy, "calibration", None)
    if hasattr(strategy, "calibration"):
        name = str(cfg.strategy.get("calibration"))
        setup["calibration"] = parts.dataset.calibration if name == "auto" else name
        setup["calibration_fitted_on"] = (
            calibration.fitted_on if calibration is not None else "none (the weighted heuristic)"
        )
    return setup


def describe_setup(setup: Mapping[str, str]) -> str:
    """The resolved setup in one line: 'strategy multi-hop (default ...), retriever ...'."""
    parts = [f"strategy {setup['strategy']}"]
    if setup.get("strategy_from", "given") != "given":
        parts[0] += f" ({setup['strategy_from']})"
    parts += [f"retriever {setup['retriever']}", f"k={setup['k']}", f"links={setup['links']}"]
    if "calibration" in setup:
        parts.append(
            f"calibration {setup['calibration']} (fitted on {setup['calibration_fitted_on']})"
        )
    return ", ".join(parts)


def run_tags(
    cfg: DictConfig,
    identity: RunIdentity,
    strategy: RetrievalStrategy,
    llm: Steps,
    setup: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """What the dashboard and the gate filter runs by, plus versions that explain numbers."""
    resolved = {f"caprag.{k}": v for k, v in (setup or {}).items() if k in ("links", "calibration")}
    return {
        **resolved,
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
        "caprag.schema": row.SCHEMA,
        "caprag.repeats": str(max(1, int(cfg.experiment.repeats))),
        **{f"caprag.prompt.{k}": v for k, v in prompt_versions().items()},
        **{str(k): str(v) for k, v in (cfg.experiment.tags or {}).items()},
    }


cluster.quiet_launcher_schema_warning()
