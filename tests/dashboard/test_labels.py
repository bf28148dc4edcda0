"""Human labels on a real MLflow store: stored as human feedback on the question's trace, tied to
the run, read back per question (the latest one; a judge's feedback of the same name is not a
human label)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from mlflow.entities import AssessmentSource, AssessmentSourceType

from experiments.results import traces
from experiments.results.labels import LABEL, Label, labels_of, log_label
from experiments.results.row import QuestionRow
from experiments.results.tracking import mlflow, use_experiment


def question(qid: str) -> QuestionRow:
    return QuestionRow(
        case_id=qid, question_id=qid, set="cross_book", query_type="factual", turn=1,
        question=f"What is {qid}?", gold_answer="x", started_ns=time.time_ns(),
        timings={"total": 0.1},
    )  # fmt: skip


def test_labels_round_trip_through_mlflow(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    experiment = use_experiment(uri, "caprag")
    with mlflow.start_run(experiment_id=experiment) as run:
        pass
    run_id = run.info.run_id
    rows = [question("q1"), question("q2")]
    traces.write_traces(rows, traces.Target(uri, experiment, run_id, "multi-hop"))
    target = traces.Target(uri, experiment, run_id, "multi-hop")
    cases = {traces.case_of(r): r.question_id for r in rows}
    q1 = traces.find_trace(target, traces.case_of(rows[0]))
    assert q1 is not None
    log_label(q1, run_id, "gold not retrieved", by="ann")
    log_label(q1, run_id, "cited but not followed", note="hop 2 missed it", by="ann")
    mlflow.log_feedback(  # a judge's feedback under the same name: not a human label
        trace_id=q1, name=LABEL, value="judge says so",
        source=AssessmentSource(source_type=AssessmentSourceType.LLM_JUDGE, source_id="judge"),
    )  # fmt: skip
    found = labels_of(experiment, run_id, cases)
    assert set(found) == {"q1"}
    assert found["q1"].text() == "cited but not followed: hop 2 missed it"
    assert found["q1"].by == "ann"
    (trace,) = [t for t in mlflow.search_traces(locations=[experiment], return_type="list")
                if t.info.trace_id == q1]  # fmt: skip
    human = [a for a in trace.info.assessments if a.source.source_type == "HUMAN"]
    assert {a.metadata.get("mlflow.assessment.sourceRunId") for a in human} == {run_id}
    with pytest.raises(ValueError, match="needs a reason"):
        log_label(q1, run_id, "  ")
    assert Label("timeout").text() == "timeout"
