"""An offline run logs its main metrics per question set, type and gold hop count to MLflow, and
the report and summary break the runs down the same way."""

from __future__ import annotations

import statistics
from pathlib import Path

import mlflow
import pytest
from mlflow.utils.validation import validate_param_and_metric_name

from experiments.cli import runs_report, summary
from experiments.harness.run import run
from experiments.results.slices import metric_name
from tests.integration.test_harness import make_cfg


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str], list]:
    tmp = tmp_path_factory.mktemp("slices")
    uri = f"sqlite:///{tmp / 'mlruns.db'}"
    ids, rows = [], []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        for strategy in ("multi-hop", "single"):
            cfg = make_cfg(
                tmp, "dataset=all", f"strategy={strategy}", "retriever.k=2", "tracking.traces=false"
            )
            result = run(cfg, sweep_id="slices-test")
            assert result.run_id is not None
            ids.append(result.run_id)
            rows.append(result.rows)
    return uri, ids, rows


def test_run_logs_recall_per_set_type_and_gold_hops(logged: tuple[str, list[str], list]) -> None:
    uri, ids, rows = logged
    mlflow.set_tracking_uri(uri)
    metrics = mlflow.get_run(ids[0]).data.metrics
    cross = [r.values["recall_at_k"] for r in rows[0] if r.set == "cross_book"]
    assert metrics["recall_at_k/cross_book"] == pytest.approx(statistics.fmean(cross))
    assert metrics["questions/cross_book"] == len(cross)
    assert metrics["correct_refusal/unanswerable"] == pytest.approx(
        statistics.fmean(r.values["correct_refusal"] for r in rows[0] if r.set == "unanswerable")
    )
    factual = [
        r.values["recall_at_k"]
        for r in rows[0]
        if r.query_type == "factual" and "recall_at_k" in r.values
    ]
    assert metrics["recall_at_k/type/factual"] == pytest.approx(statistics.fmean(factual))
    two = [r.values["recall_at_k"] for r in rows[0] if len(r.gold_ids) == 2]
    assert metrics["recall_at_k/gold_hops/2"] == pytest.approx(statistics.fmean(two))
    assert "recall_at_k" in metrics and "recall_at_k.coverage" in metrics  # overall unchanged
    # searchable and comparable in MLflow like any metric
    found = mlflow.search_runs(
        filter_string="metrics.`recall_at_k/cross_book` >= 0", output_format="list"
    )
    assert {r.info.run_id for r in found} == set(ids)


def test_mlflow_ui_reads_cost_per_1000_questions_and_the_question_sets_as_datasets(
    logged: tuple[str, list[str], list],
) -> None:
    uri, ids, _ = logged
    mlflow.set_tracking_uri(uri)
    run = mlflow.get_run(ids[0])
    metrics = run.data.metrics
    assert metrics["cost_per_1k_usd"] == pytest.approx(metrics["cost_usd"] * 1000)
    assert metrics["cost_per_1k_usd/cross_book"] == pytest.approx(
        metrics["cost_usd/cross_book"] * 1000
    )
    inputs = {d.dataset.name: d for d in run.inputs.dataset_inputs}
    assert set(inputs) == {"single_book", "cross_book", "follow_up", "unanswerable"}
    tags = {t.key: t.value for t in inputs["cross_book"].tags}
    assert tags["mlflow.data.context"] == "evaluation"
    found = mlflow.search_runs(
        filter_string="datasets.name = 'cross_book'", output_format="list"
    )  # the filter the README's MLflow section gives
    assert set(ids) <= {r.info.run_id for r in found}


def test_report_and_summary_break_runs_down(
    logged: tuple[str, list[str], list],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    uri, ids, _ = logged
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert runs_report.main([*ids, "--name", "slices", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "slices.md").read_text()
    assert "## By question set" in text and "## By question type" in text
    assert "## By gold hops" in text
    by_set = text.split("## By question set")[1].split("##")[0]
    assert "| cross_book" in by_set and "| unanswerable" in by_set
    by_type = text.split("## By question type")[1].split("##")[0]
    assert "| decision" in by_type and "| strategic" in by_type
    assert summary.main(ids) == 0
    printed = capsys.readouterr().out
    assert "## By question set" in printed and "## By question type" in printed
    verdict = printed.split("Verdict (")[1].splitlines()
    assert len(verdict) <= 10, "the summary ends with a verdict of at most ten lines"
    assert any("cross_book" in line and "cost ×" in line for line in verdict)


def test_slice_names_of_odd_set_names_are_valid_mlflow_metric_names() -> None:
    for odd in ("a=b", "..", "x/y", "über set", ""):
        name = metric_name("f1", "set", odd)
        assert validate_param_and_metric_name(name) and ":" not in name, name
        assert name.count("/") == 1
