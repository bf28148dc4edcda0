"""`python -m experiments.compare` against a real MLflow store: two logged runs compared, Markdown
and chosen metrics, unknown runs and runs without a table refused."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from experiments.cli import compare
from experiments.results.tracking import mlflow, use_experiment
from tests.unit.test_significance import synthetic_pair

TAGS = {"caprag.strategy": "multi-hop", "caprag.llm": "offline"}


@dataclass(frozen=True)
class LoggedRuns:
    uri: str
    baseline: str
    better: str
    copy: str
    no_table: str


@pytest.fixture(scope="module")
def logged_runs(tmp_path_factory: pytest.TempPathFactory) -> LoggedRuns:
    """A SQLite store with a baseline, a clearly better run (2 repeats), a copy, and a bare run."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('significance') / 'mlruns.db'}"
    experiment = use_experiment(uri, "significance-test")
    a, b = synthetic_pair(n=60, shift=0.1, repeats=2, seed=4)
    ids = {}
    for name, rows in (("baseline", a), ("better", b), ("copy", a)):
        with mlflow.start_run(experiment_id=experiment, run_name=name, tags=TAGS) as run:
            mlflow.log_table(rows, artifact_file="questions.json")
            ids[name] = run.info.run_id
    with mlflow.start_run(experiment_id=experiment, run_name="no-table") as bare:
        mlflow.log_metrics({"questions": 3.0, "failed": 3.0})
    return LoggedRuns(uri, ids["baseline"], ids["better"], ids["copy"], bare.info.run_id)


@pytest.fixture
def store_env(logged_runs: LoggedRuns, monkeypatch: pytest.MonkeyPatch) -> LoggedRuns:
    """The CLI pointed at the store (MLflow's own env settings restored afterwards)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", logged_runs.uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", "")
    return logged_runs


def output_row(out: str, metric: str) -> list[str]:
    """The cells of a metric's row (the metric's heading first, as one cell)."""
    line = next(line for line in out.splitlines() if line.startswith(f"{metric} "))
    return [metric, *line.removeprefix(metric).split()]


def test_cli_compares_two_logged_runs(store_env: LoggedRuns, capsys) -> None:
    assert compare.main([store_env.baseline, store_env.better, "--resamples", "2000"]) == 0
    out = capsys.readouterr().out
    assert f"A = baseline · multi-hop (offline) · {store_env.baseline}" in out
    assert "60 questions paired; 0 only in A, 0 only in B (A: 120 rows, B: 120 rows" in out
    assert out.splitlines()[4].split() == ["metric", "A", "B", "B", "−", "A", "95%", "CI", "p", "n"]
    f1 = output_row(out, "token F1")
    low, high = float(f1[4].strip("[,")), float(f1[5].rstrip("]"))
    assert f1[3].startswith("+") and 0.0 < low < 0.1 < high  # B is 0.1 better on every question
    assert f1[6] == "<0.001" and f1[7] == "60"
    assert "B better on gold-passage recall@k, token F1" in out
    assert "A better on tokens" in out
    assert compare.main([store_env.baseline, store_env.copy]) == 0
    out = capsys.readouterr().out
    assert output_row(out, "token F1")[3:6] == ["0.000", "[0.000,", "0.000]"]
    assert output_row(out, "token F1")[6] == "1.000"
    assert "no significant difference on gold-passage recall@k, token F1, tokens" in out


def test_cli_markdown_and_chosen_metrics(store_env: LoggedRuns, capsys) -> None:
    argv = [store_env.baseline, store_env.better, "--metrics", "f1,mrr", "--markdown"]
    assert compare.main([*argv, "--resamples", "500", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "| metric   | A     | B     | B − A  | 95% CI" in out
    mrr = next(line for line in out.splitlines() if line.startswith("| MRR "))
    assert "run A did not log it; run B did not log it" in mrr
    assert "(500 draws, seed 3)" in out


def test_cli_rejects_an_unknown_run_and_a_run_without_a_table(store_env: LoggedRuns, capsys):
    assert compare.main([store_env.baseline, "0" * 32]) == 2
    assert f"error: no run '{'0' * 32}' in the MLflow store {store_env.uri}" in (
        capsys.readouterr().err
    )
    assert compare.main([store_env.no_table, store_env.baseline]) == 2
    err = capsys.readouterr().err
    assert f"error: run {store_env.no_table} has no per-question table (questions.json)" in err
    with pytest.raises(SystemExit) as exit_info:
        compare.main([store_env.baseline, store_env.better, "--resamples", "0"])
    assert exit_info.value.code == 2


def test_set_compares_one_question_set_and_names_the_sets_when_unknown(
    store_env: LoggedRuns, capsys
) -> None:
    a, b = synthetic_pair(n=60, shift=0.1, seed=5)
    ids = []
    for name, rows in (("a-sets", a), ("b-sets", b)):
        rows = rows.assign(set=["cross_book" if i % 3 else "single_book" for i in range(len(rows))])
        experiment = mlflow.get_experiment_by_name("significance-test").experiment_id
        with mlflow.start_run(experiment_id=experiment, run_name=name, tags=TAGS) as run:
            mlflow.log_table(rows, artifact_file="questions.json")
            ids.append(run.info.run_id)
    assert compare.main([*ids, "--set", "single_book", "--resamples", "500"]) == 0
    out = capsys.readouterr().out
    assert "question set: single_book" in out
    assert "20 questions paired" in out
    assert compare.main([*ids, "--set", "follow_up"]) == 2
    err = capsys.readouterr().err
    assert "no question of set 'follow_up' in the run; its sets: cross_book, single_book" in err
