"""One registry of metrics: a metric registered in one module is computed, logged, tabled, compared
and offered everywhere; a name nobody registered still reads; every built-in one is registered."""

from __future__ import annotations

import importlib
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from caprag.errors import ConfigError
from experiments.cli import compare, gate
from experiments.cli.summary import slice_sections
from experiments.dashboard import data
from experiments.harness.build import import_metric_modules
from experiments.harness.evaluate import score_with
from experiments.harness.run import run
from experiments.results import metrics as registry
from experiments.results.aggregate import aggregate
from experiments.results.metrics import Metric, NotScored
from experiments.results.row import QuestionRow
from experiments.results.runs import load_run
from experiments.results.tables import compare_table, run_table
from experiments.results.tracking import mlflow
from experiments.scoring import regressions
from experiments.scoring.significance import compare_runs, render_table, verdict
from tests.integration.test_harness import fixture_overrides, make_cfg

TOY_HEADING = "toy: answer length (words)"


def question_row(question_id: str, **values: float) -> QuestionRow:
    """An answered question's row with these metric values."""
    return QuestionRow(
        case_id=question_id, question_id=question_id, set="s", query_type="factual", turn=1,
        question="q?", gold_answer="a", values=dict(values),
    )  # fmt: skip


@pytest.fixture
def toy() -> Iterator[Metric]:
    """The toy metric of tests/toy_metric.py, registered for one test only."""
    module = importlib.import_module("tests.toy_metric")
    metric = registry.register(module.TOY)  # again: an earlier test may have unregistered it
    yield metric
    registry.unregister(metric.name)


@pytest.mark.slow
def test_a_metric_registered_in_one_module_shows_everywhere(
    toy: Metric, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    ids = {}
    for strategy in ("single", "multi-hop"):
        cfg = make_cfg(
            tmp_path, "dataset=all", f"strategy={strategy}", "retriever.k=2",
            "tracking.traces=false", "experiment.ragas=false",
        )  # fmt: skip
        result = run(cfg, sweep_id="toy-metric")
        assert result.run_id is not None
        ids[strategy] = result.run_id
    # 1. computed per answered question; an unanswerable one keeps its reason
    answered = next(r for r in result.rows if r.gold_ids)
    assert answered.values["toy"] == len(answered.answer.split())
    refusal = next(r for r in result.rows if r.set == "unanswerable")
    assert (
        "toy" not in refusal.values
        and refusal.missing["toy"] == "no gold passages (unanswerable question)"
    )
    # every metric the run produced is registered (none falls back), the toy among them
    produced = set(result.aggregates) | set(result.summary)
    assert {name for name in produced if not registry.known(name)} == set()
    # 2. aggregated and printed in the run table with its label and unit
    toy_agg = result.aggregates["toy"]
    assert toy_agg.coverage == f"{len(result.rows) - 1}/{len(result.rows)}"
    printed = capsys.readouterr().out.splitlines()
    toy_line = [line for line in printed if line.startswith(f"| {TOY_HEADING} ")][-1]  # multi-hop
    assert f" {toy.display(toy_agg.mean)} " in toy_line and f" {toy_agg.coverage} " in toy_line
    assert TOY_HEADING in run_table(result.aggregates, result.summary)
    # 3. logged to MLflow, overall and per slice (it is `sliced`)
    mlflow.set_tracking_uri(uri)
    logged = mlflow.get_run(ids["multi-hop"]).data.metrics
    assert logged["toy"] == pytest.approx(toy_agg.mean)
    assert "toy/single_book" in logged and "toy.coverage" in logged
    # 4. the summary and report tables
    runs = [load_run(ids["single"]), load_run(ids["multi-hop"])]
    assert TOY_HEADING in compare_table([(r.label, r.metrics, r.coverage()) for r in runs])
    assert any(TOY_HEADING in line for line in slice_sections(runs))
    # 5. `python -m experiments.compare --metrics toy`, and in the default comparison (headline)
    assert (
        compare.main([ids["single"], ids["multi-hop"], "--metrics", "toy", "--resamples", "200"])
        == 0
    )
    out = capsys.readouterr().out
    assert any(line.startswith(TOY_HEADING) for line in out.splitlines())
    assert "(lower is better for toy: answer length)" in out
    tables = [run.questions for run in runs]
    defaults = compare_runs(*tables, n_resamples=200)
    assert "toy" in [c.metric for c in defaults]
    assert TOY_HEADING in render_table(defaults) and "toy: answer length" in verdict(defaults)
    # 6. the dashboard's metric choices and tables, the Regressions page's metrics
    frame = data.runs_frame(mlflow.search_runs(search_all_experiments=True))
    choices = data.metric_choices(frame)
    assert "toy" in choices and choices.index("toy") < choices.index("recall_at_k/cross_book")
    assert TOY_HEADING in data.metric_table(frame).index
    assert "toy" in regressions.metrics_of(*tables)
    changed = regressions.compare(*tables, "toy")
    assert set(changed["change"]) <= set(regressions.CHANGES)
    # 7. the gate reads its label and direction (which metrics it gates stays its own choice)
    monkeypatch.setitem(gate.TOLERANCES, "toy", gate.Tolerance(relative=0.1))
    rows, found = gate.compare({"run": {"toy": 10.0}}, {"run": {"toy": 12.0}})
    assert found == 1 and rows == [
        ["run", TOY_HEADING, "10.0", "12.0", "+2.0", "11.0", "REGRESSION"]
    ]


def test_a_name_nobody_registered_still_reads() -> None:
    mystery = registry.get("mystery_score")
    assert (mystery.label, mystery.heading, mystery.higher_is_better) == (
        "mystery_score", "mystery_score", None,
    )  # fmt: skip
    assert mystery.display(0.5) == "0.500" and mystery.display(None) == "—"
    slice_of_cost = registry.get("cost_usd/cross_book")
    assert slice_of_cost.heading == "cost · cross_book (USD per 1,000 questions)"
    assert slice_of_cost.display(0.000267) == "$0.267"  # as cost: per 1,000 questions
    # the run table lists it after the registered ones
    rows = [
        question_row("q1", recall_at_k=1.0, mystery_score=0.5),
        question_row("q2", recall_at_k=0.0, mystery_score=0.25),
    ]
    table = run_table(aggregate(rows), {"questions": 2.0, "failed": 0.0}).splitlines()
    names = [line.split("|")[1].strip() for line in table[2:]]
    assert names.index("gold-passage recall@k") < names.index("mystery_score")
    assert "| mystery_score " in table[names.index("mystery_score") + 2]
    assert "0.375" in table[names.index("mystery_score") + 2]
    # a page offers it after the registered metrics; one run can neither beat another on it
    frame = pd.DataFrame({"recall_at_k": [1.0], "mystery_score": [0.5], "questions": [2.0]})
    assert data.metric_choices(frame) == ["recall_at_k", "mystery_score"]
    assert data.metric_table(frame.assign(label="a"), ["mystery_score"]).index.tolist() == [
        "mystery_score"
    ]
    per_question = pd.DataFrame(
        {"question_id": ["q1", "q2", "q3"], "mystery_score": [0.1, 0.2, 0.3]}
    )
    assert regressions.metrics_of(per_question, per_question) == []
    compared = compare_runs(
        per_question, per_question.assign(mystery_score=[0.9, 0.8, 0.7]), ["mystery_score"]
    )
    assert compared[0].better() == ""  # no direction: a difference, not a winner
    assert "mystery_score" in render_table(compared)


def test_every_builtin_metric_is_registered_once_with_a_label() -> None:
    built_in = registry.all()
    assert len({m.name for m in built_in}) == len(built_in)
    assert len({m.label for m in built_in}) == len(built_in), "two metrics share a label"
    assert all(m.label and m.description for m in built_in)
    always = {"recall_at_k", "precision_at_k", "mrr", "exact_match", "f1", "tokens", "cost_usd"}
    assert always <= {m.name for m in registry.always()}
    cost = registry.get("cost_usd")
    assert (cost.heading, cost.display(0.000256), cost.higher_is_better) == (
        "cost (USD per 1,000 questions)", "$0.256", False,
    )  # fmt: skip
    assert cost.display_total(0.0123) == "0.012300" and cost.total_heading == "total cost (USD)"
    assert registry.get("latency_s").heading == "latency (s)"
    assert registry.get("prompt_tokens").heading == "prompt tokens"  # the label names its unit
    with pytest.raises(ValueError, match="cannot be a metric name"):
        registry.register(Metric("recall_at_k/cross_book", "a slice"))


def test_a_scorer_that_fails_leaves_a_reason_and_not_a_zero() -> None:
    def broken(*_args: object) -> float:
        raise ZeroDivisionError("no words")

    row = question_row("q")
    for name, score in (
        ("broken", broken),
        ("refused", lambda *_: NotScored("does not apply here")),
        ("silent", lambda *_: None),
        ("counted", lambda *_: 3),
    ):
        score_with(Metric(name, name, score=score), None, None, 5, row)  # type: ignore[arg-type]
    assert row.values == {"counted": 3.0}
    assert row.missing == {
        "broken": "ZeroDivisionError: no words",
        "refused": "does not apply here",
    }
    assert not any(math.isnan(v) for v in row.values.values())


def test_metric_modules_are_imported_or_refused_by_name() -> None:
    import_metric_modules(OmegaConf.create({"experiment": {}}))  # none asked for: nothing to do
    cfg = OmegaConf.create({"experiment": {"metric_modules": ["tests.no_such_metrics"]}})
    with pytest.raises(
        ConfigError, match=r"experiment.metric_modules: cannot import 'tests.no_such"
    ):
        import_metric_modules(cfg)


@pytest.mark.slow
def test_a_metric_module_named_in_the_config_is_computed_by_the_command(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "experiments.run", *fixture_overrides(tmp_path),
            "dataset=single_book", "strategy=single", "tracking.enabled=false",
            "experiment.ragas=false", "+experiment.metric_modules=[tests.toy_metric]",
        ],
        capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin"},
        cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert any(line.startswith(f"| {TOY_HEADING} ") for line in done.stdout.splitlines())
