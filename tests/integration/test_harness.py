"""The harness through Hydra's compose API: every config member builds; run(cfg) end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import DictConfig

from caprag.config import ENV_NAMES, PROJECT_ROOT
from caprag.errors import ConfigError
from caprag.steps import ROLES, Steps
from caprag.strategies import RetrievalStrategy
from experiments.harness.build import steps_from_config
from experiments.harness.data import Dataset
from experiments.harness.run import run
from experiments.results.row import rows_of
from tests.conftest import FIXTURE_BOOKS, FIXTURE_QUESTIONS

CONF = PROJECT_ROOT / "conf"
GROUPS = ("strategy", "llm", "retriever", "dataset", "judge")


def fixture_overrides(tmp: Path, questions: Path = FIXTURE_QUESTIONS) -> list[str]:
    return [
        f"paths.corpus={FIXTURE_BOOKS}",
        f"paths.questions={questions}",
        f"paths.store={tmp / 'store'}",
        f"paths.cache={tmp / 'llm-cache.sqlite'}",
        f"paths.journals={tmp / 'journals'}",
        f"tracking.uri=sqlite:///{tmp / 'mlruns.db'}",
        "experiment.progress=false",
    ]


def make_cfg(tmp: Path, *overrides: str, questions: Path = FIXTURE_QUESTIONS) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[*fixture_overrides(tmp, questions), *overrides])


def members(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize(("group", "option"), [(g, m) for g in GROUPS for m in members(g)])
def test_every_config_group_member_instantiates(
    group: str, option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    # dataset=jsonl has no default file (path: ???): give it a shipped benchmark file.
    path = PROJECT_ROOT / "datasets" / "benchmarks" / "squad_v1.1_dev_single.jsonl"
    extra = [f"dataset.path={path}"] if (group, option) == ("dataset", "jsonl") else []
    cfg = make_cfg(tmp_path, f"{group}={option}", *extra)
    if group == "llm":
        steps = steps_from_config(cfg)
        assert isinstance(steps, Steps)
        assert steps.backend == ("offline" if option == "offline" else "llm")
        return
    adaptive = (group, option) == ("strategy", "adaptive")
    # adaptive's `calibration: auto` is the dataset's choice, as build_components resolves it
    options = {"calibration": cfg.dataset.calibration} if adaptive else {}
    built = (
        instantiate(cfg[group], **options)
        if group != "retriever"
        else instantiate(cfg.retriever.index)
    )
    if group == "strategy":
        index = instantiate(cfg.retriever.index)
        strategy = built(retriever=index, steps=steps_from_config(cfg), k=3)
        assert isinstance(strategy, RetrievalStrategy)
    elif group == "dataset":
        assert isinstance(built, Dataset) and built.cases
    elif group == "retriever":
        assert built.search("torch", 1)
    elif group == "judge":
        assert built is None if option == "none" else hasattr(built, "score")


def test_steps_mix_per_step_from_hydra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    cfg = make_cfg(tmp_path, "llm=openai", "analyzer=rule", "confidence=rule")
    kinds = steps_from_config(cfg).kinds()
    assert kinds == {
        "expander": "llm",
        "analyzer": "rule",
        "generator": "llm",
        "rewriter": "llm",
        "classifier": "llm",
        "confidence": "rule",
        "reasoner": "llm",
        "asker": "llm",
    }
    offline = steps_from_config(make_cfg(tmp_path, "generator=rule", "classifier=auto"))
    assert set(offline.kinds().values()) == {"rule"}
    with pytest.raises(ConfigError, match="generator=llm needs a language model"):
        steps_from_config(make_cfg(tmp_path, "generator=llm"))
    with pytest.raises(ConfigError, match="analyzer='neural': use one of auto, rule, llm"):
        steps_from_config(make_cfg(tmp_path, "llm=openai", "analyzer=neural"))
    # One list of roles: a config key each (all auto) and the API's CAPRAG_<ROLE> variables.
    assert {role: make_cfg(tmp_path)[role] for role in ROLES} == dict.fromkeys(ROLES, "auto")
    assert {role: ENV_NAMES[role] for role in ROLES} == {r: f"CAPRAG_{r.upper()}" for r in ROLES}


@pytest.mark.parametrize("preset", members("experiment"))
def test_experiment_presets_compose(preset: str, tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, f"experiment={preset}")
    assert cfg.experiment.name == preset


def test_cluster_launcher_configs_exist() -> None:
    for name, install in (("ray", "--group cluster"), ("submitit_slurm", "pip install")):
        text = (CONF / "hydra" / "launcher" / f"{name}.yaml").read_text()
        assert "_target_: hydra_plugins." in text and install in text


@pytest.mark.slow
def test_run_end_to_end_is_logged_and_read_back(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, "dataset=all", "strategy=multi-hop", "retriever.k=2")
    result = run(cfg)
    assert result.summary["questions"] == 9 and result.summary["failed"] == 0
    cross = next(r for r in result.rows if r.question_id == "t-cb-1")
    assert cross.values["recall_at_k"] == 1.0 and cross.values["hops"] >= 2
    assert cross.values["recall_hop1"] < cross.values["recall_hop2"]
    refusal = next(r for r in result.rows if r.set == "unanswerable")
    assert "recall_at_k" in refusal.missing and "correct_refusal" in refusal.values

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns.db'}")
    logged = mlflow.get_run(result.run_id)
    assert logged.data.params["strategy._target_"] == "caprag.strategies.MultiHopStrategy"
    assert logged.data.params["retriever.k"] == "2"
    assert logged.data.tags["caprag.prompt.analyze"] == "analyze-v4"
    assert len(logged.data.tags["caprag.dataset_hash"]) == 16
    assert logged.data.metrics["recall_at_k"] == pytest.approx(result.mean("recall_at_k"))
    assert logged.data.metrics["correct_refusal.coverage"] == pytest.approx(1 / 9)
    table = mlflow.load_table("questions.json", run_ids=[result.run_id])
    assert sorted(table["question_id"]) == sorted(r.question_id for r in result.rows)
    # Each question's row is in the table whole, beside its scalars: it reads back as it was.
    assert rows_of(table) == result.rows
    assert table.set_index("question_id").loc["t-cb-1", "recall_at_k"] == next(
        r.values["recall_at_k"] for r in result.rows if r.question_id == "t-cb-1"
    )
    traces = mlflow.search_traces(run_id=result.run_id, return_type="list")
    assert len(traces) == 9
    spans = {s.name for t in traces for s in t.data.spans}
    assert {"rewrite", "retrieve", "hop 1", "hop 2", "generate"} <= spans


@pytest.mark.slow
def test_failures_are_isolated_and_coverage_stated(tmp_path: Path) -> None:
    cfg = make_cfg(
        tmp_path,
        "dataset=single_book",
        "++llm._target_=tests.fakes.flaky_steps",
        "experiment.question_timeout_s=30",
        "tracking.enabled=false",
        "experiment.ragas=false",
    )
    result = run(cfg)
    status = {r.question_id: (r.status, r.error) for r in result.rows}
    assert status["t-sb-1"] == ("failed", "timed out after 30s")
    assert status["t-sb-2"][0] == "failed" and "StructuredOutputError" in status["t-sb-2"][1]
    assert status["t-sb-3"] == ("ok", "")
    recall = result.aggregates["recall_at_k"]
    assert (recall.n, recall.total) == (1, 3)
    assert sum(recall.missing_reasons.values()) == 2
    assert result.summary["failed"] == 2


def run_cli(*args: str, cwd: Path = PROJECT_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "experiments.run", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
        env={"PATH": "/usr/bin:/bin"},
    )


def test_unknown_strategy_lists_the_choices(tmp_path: Path) -> None:
    done = run_cli(*fixture_overrides(tmp_path), "strategy=nope")
    assert done.returncode != 0
    assert "Could not find 'strategy/nope'" in done.stderr
    assert "multi-hop" in done.stderr and "multi-question" in done.stderr


def test_unknown_dataset_lists_the_choices(tmp_path: Path) -> None:
    done = run_cli(*fixture_overrides(tmp_path), "dataset=nope")
    assert "Could not find 'dataset/nope'" in done.stderr and "cross_book" in done.stderr


def test_broken_dataset_line_fails_before_any_question(tmp_path: Path) -> None:
    questions = tmp_path / "questions"
    questions.mkdir()
    for file in FIXTURE_QUESTIONS.glob("*.jsonl"):
        (questions / file.name).write_text(file.read_text())
    lines = (questions / "cross_book.jsonl").read_text().splitlines()
    lines[1] = lines[1][:40]
    (questions / "cross_book.jsonl").write_text("\n".join(lines) + "\n")
    overrides = fixture_overrides(tmp_path, questions)
    done = run_cli(*overrides, "dataset=cross_book")
    assert done.returncode == 2
    assert f"error: {questions / 'cross_book.jsonl'}:2: not valid JSON" in done.stderr
    assert "questions:" not in done.stderr and "ingest" not in done.stderr


def test_openai_without_key_fails_before_any_question(tmp_path: Path) -> None:
    done = run_cli(*fixture_overrides(tmp_path), "llm=openai")
    assert done.returncode == 2
    assert "needs an API key: set OPENAI_API_KEY" in done.stderr
    assert "questions:" not in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_sweep_makes_a_parent_run_with_a_child_per_config(launcher: str, tmp_path: Path) -> None:
    done = run_cli(
        "-m",
        *fixture_overrides(tmp_path),
        "strategy=multi-hop,multi-question",
        "dataset=single_book",
        "pipeline.history_pairs=10",  # set, not swept: the parent's name leaves it out
        f"tracking.traces={launcher == 'basic'}",  # the description links traces when written
        "experiment.ragas=false",
        f"hydra/launcher={launcher}",
        f"hydra.sweep.dir={tmp_path / 'multirun'}",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns.db'}")
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    parents = [r for r in runs if r.data.tags.get("caprag.role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(parents) == 1
    # The parent run names what the sweep varies, as typed, and the dataset.
    assert parents[0].info.run_name == "sweep strategy=multi-hop,multi-question · single_book"
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert sorted(c.data.tags["caprag.strategy"] for c in children) == [
        "multi-hop",
        "multi-question",
    ]
    # The parent's description (its page in the MLflow UI) is the verdict the sweep printed, then
    # each run's worst question of each set: tags, where its gold went, a link to its trace.
    note = parents[0].data.tags["mlflow.note.content"]
    assert note.startswith("**Verdict (2 runs; per set")
    printed = done.stdout.split("Verdict (2 runs")[1].splitlines()[1]
    assert f"- {printed.strip()}" in note
    assert "**Each run's worst question per set**" in note and "*single_book*" in note
    worst = note.split("*single_book*")[1]
    assert "**multi-hop" in worst and "**multi-question" in worst
    assert "found by hop" in worst or "never retrieved" in worst
    linked = "](#/experiments/" in worst and "/traces?selectedEvaluationId=tr-" in worst
    assert linked == (launcher == "basic")
    assert f"description of MLflow run {parents[0].info.run_id}" in done.stdout
