"""MLflow traces written while a run goes on: real timestamps, order, a failing writer, the end of
a run, and a file store."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest

from caprag.config import PROJECT_ROOT
from experiments.harness.run import run
from experiments.results import traces
from experiments.results.row import QuestionRow
from tests.integration.test_harness import make_cfg

MS = 1_000_000


def make_target(tmp_path: Path, uri: str | None = None) -> traces.Target:
    uri = uri or f"sqlite:///{tmp_path / 'mlruns.db'}"
    client = mlflow.MlflowClient(uri)
    experiment_id = client.create_experiment("traces", artifact_location=(tmp_path / "a").as_uri())
    run_id = client.create_run(experiment_id).info.run_id
    return traces.Target(uri, experiment_id, run_id)


def make_row(number: int, started_ns: int) -> QuestionRow:
    """A two-hop answered question, as the evaluator records it."""
    at = started_ns / 1e9
    call = {
        "step": "analyze",
        "model": "m",
        "latency_s": 0.002,
        "started_at": at + 0.003,
        "messages": [{"role": "user", "content": "enough?"}],
    }
    generate = {"step": "generate", "model": "m", "latency_s": 0.001, "started_at": at + 0.0115}
    return QuestionRow(
        case_id=f"c{number}",
        question_id=f"q{number}",
        set="cross_book",
        query_type="factual",
        turn=1,
        question=f"question {number}?",
        gold_answer="gold",
        answer="answer",
        main_question=f"question {number}?",
        context_ids=["core/p1"],
        started_ns=started_ns,
        timings={"rewrite": 0.001, "retrieve": 0.01, "generate": 0.002, "total": 0.02},
        hops=[
            {"hop": 1, "queries": ["q"], "documents": [], "usage": [call], "latency_s": 0.004},
            {"hop": 2, "queries": ["r"], "documents": [], "usage": [], "latency_s": 0.003},
        ],
        calls=[call, {**generate, "reply": "answer"}],
    )


def search(target: traces.Target) -> list[mlflow.entities.Trace]:
    mlflow.set_tracking_uri(target.uri)
    return mlflow.search_traces(
        locations=[target.experiment_id], run_id=target.run_id, return_type="list"
    )


@pytest.mark.slow
def test_a_run_s_traces_carry_each_question_s_real_times(tmp_path: Path) -> None:
    before = time.time_ns()
    cfg = make_cfg(tmp_path, "dataset=all", "experiment.ragas=false", "experiment.concurrency=1")
    result = run(cfg)
    after = time.time_ns()
    answered = {f"{r.repeat}:{r.question_id}": r for r in result.rows if r.status == "ok"}
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns.db'}")
    found = mlflow.search_traces(run_id=result.run_id, return_type="list")
    assert result.traces == len(found) == len(answered) == 9  # all there when run() returns
    starts = []
    for trace in found:
        row = answered[trace.info.tags[traces.CASE_TAG]]
        assert before <= row.started_ns <= after
        root = next(s for s in trace.data.spans if s.parent_id is None)
        assert root.start_time_ns == row.started_ns
        end = row.started_ns + int(row.timings["total"] * 1e9)
        for span in trace.data.spans:
            assert row.started_ns <= span.start_time_ns <= span.end_time_ns <= root.end_time_ns
            assert span.end_time_ns <= max(end, root.end_time_ns) <= after
        by_name = {s.name: s for s in trace.data.spans}
        assert (
            by_name["rewrite"].start_time_ns
            <= by_name["retrieve"].start_time_ns
            <= by_name["generate"].start_time_ns
        )
        for call, span in zip(
            row.calls or [], [s for s in trace.data.spans if s.name.startswith("llm ")], strict=True
        ):
            assert span.name == f"llm {call.step}"
            assert span.start_time_ns == pytest.approx((call.started_at or 0) * 1e9, abs=MS)
        starts.append((row.started_ns, root.end_time_ns))
    starts.sort()
    # One question at a time: each trace starts after the one before it ended.
    assert all(b[0] >= a[1] - MS for a, b in itertools.pairwise(starts))


@pytest.mark.slow
def test_the_writer_writes_traces_in_the_order_questions_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    order = tmp_path / "order.txt"
    real = traces.write_traces

    def recording(rows: list[QuestionRow], target: traces.Target) -> list[str]:
        with order.open("a") as handle:  # the writer process appends here
            handle.writelines(f"{row.question_id}\n" for row in rows)
        return real(rows, target)

    monkeypatch.setattr(traces, "write_traces", recording)
    target = make_target(tmp_path)
    now = time.time_ns()
    rows = [make_row(n, now + n * 50 * MS) for n in range(12)]
    writer = traces.TraceWriter()
    writer.bind(target)
    for at in range(0, 12, 3):
        writer.submit(rows[at : at + 3])
    assert writer.close(rows) == 12
    assert order.read_text().split() == [row.question_id for row in rows]
    found = search(target)
    assert sorted(t.info.tags[traces.CASE_TAG] for t in found) == sorted(
        f"0:q{n}" for n in range(12)
    )
    trace = next(t for t in found if t.info.tags[traces.CASE_TAG] == "0:q3")
    assert trace.info.request_time == rows[3].started_ns // MS
    names = [s.name for s in sorted(trace.data.spans, key=lambda s: s.start_time_ns)]
    assert set(names[:2]) == {"q3 · cross_book", "rewrite"}
    assert names.index("hop 1") < names.index("llm analyze") < names.index("hop 2")
    assert names.index("hop 2") < names.index("generate") < names.index("llm generate")
    assert {s.name for s in trace.data.spans} >= {"retrieve", "hop 1", "hop 2"}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["raises", "dies"])
def test_a_failing_writer_is_reported_and_its_traces_written_at_close(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    parent = os.getpid()
    real = traces.write_traces

    def failing(rows: list[QuestionRow], target: traces.Target) -> list[str]:
        if os.getpid() != parent:  # only in the writer process
            if how == "dies":
                os._exit(3)
            raise OSError("disk full")
        return real(rows, target)

    monkeypatch.setattr(traces, "write_traces", failing)
    target = make_target(tmp_path)
    rows = [make_row(n, time.time_ns()) for n in range(4)]
    writer = traces.TraceWriter()
    writer.bind(target)
    writer.submit(rows)
    assert writer.close(rows) == 4
    err = capfd.readouterr().err
    if how == "raises":
        assert "the trace writer could not write 4 traces: OSError('disk full')" in err
    else:
        assert "the trace writer ended with exit code 3" in err
    assert "4 traces were not written by the trace writer: writing them now" in err
    cases = [t.info.tags[traces.CASE_TAG] for t in search(target)]
    assert sorted(cases) == ["0:q0", "0:q1", "0:q2", "0:q3"]


@pytest.mark.slow
def test_writing_a_trace_again_replaces_it(tmp_path: Path) -> None:
    target = make_target(tmp_path)
    rows = [make_row(n, time.time_ns()) for n in range(3)]
    traces.write_traces(rows[:2], target)
    traces.write_traces(rows, target)
    found = search(target)
    assert sorted(t.info.tags[traces.CASE_TAG] for t in found) == ["0:q0", "0:q1", "0:q2"]
    assert all(len(t.data.spans) == 8 for t in found)


@pytest.mark.slow
def test_a_file_store_gets_whole_traces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 opens one only when asked
    target = make_target(tmp_path, uri=str(tmp_path / "mlruns"))
    rows = [make_row(n, time.time_ns()) for n in range(2)]
    writer = traces.TraceWriter()
    writer.bind(target)
    writer.submit(rows)
    assert writer.close(rows) == 2
    found = search(target)
    assert sorted(t.info.tags[traces.CASE_TAG] for t in found) == ["0:q0", "0:q1"]
    assert {s.name for s in found[0].data.spans} >= {"rewrite", "hop 2", "llm generate"}


@pytest.mark.slow
def test_close_looks_up_only_the_traces_the_writer_did_not_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lookups: list[traces.Target] = []
    real = traces.traced_cases

    def counting(target: traces.Target) -> set[str]:
        lookups.append(target)  # only this process looks up; the writer reports what it wrote
        return real(target)

    monkeypatch.setattr(traces, "traced_cases", counting)
    target = make_target(tmp_path)
    rows = [make_row(n, time.time_ns()) for n in range(5)]
    writer = traces.TraceWriter()
    writer.bind(target)
    writer.submit(rows)
    assert writer.close(rows) == 5
    assert lookups == []  # every trace reported written: no search at the end

    # A resumed run: two traces were written by the killed process, three are new.
    again = traces.TraceWriter()
    again.bind(target)
    more = [make_row(n, time.time_ns()) for n in range(5, 8)]
    again.submit(more)
    assert again.close(rows[:2] + more) == 5
    assert lookups == [target]  # the two it did not write are looked up, and found
    cases = sorted(t.info.tags[traces.CASE_TAG] for t in search(target))
    assert cases == [f"0:q{n}" for n in range(8)]


WRITER_DIES_WITH_ROWS_QUEUED = """
import os, sys, time
ROWS = 12
from caprag.config import PROJECT_ROOT
from experiments.results import traces
from tests.integration.test_traces import make_row, make_target
from pathlib import Path

parent = os.getpid()
real = traces.write_traces

def dies(rows, target):
    if os.getpid() != parent:
        os._exit(3)  # the writer dies at its first write
    return real(rows, target)

traces.write_traces = dies
target = make_target(Path(sys.argv[1]))
rows = []
for n in range(ROWS):
    row = make_row(n, time.time_ns())
    row.answer = "x" * 50_000  # together far more than a pipe holds (64 KiB)
    rows.append(row)
writer = traces.TraceWriter()
writer.bind(target)
for row in rows:
    writer.submit([row])
print("traces", writer.close(rows), flush=True)
"""


@pytest.mark.slow
def test_a_writer_that_dies_mid_run_with_rows_queued_does_not_hold_the_harness(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WRITER_DIES_WITH_ROWS_QUEUED, str(tmp_path)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=600,  # only catches a harness that never exits
    )
    assert done.returncode == 0, done.stderr
    assert "traces 12" in done.stdout
    assert "the trace writer ended with exit code 3" in done.stderr
    assert "traces were not written by the trace writer: writing them now" in done.stderr
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    experiment = mlflow.MlflowClient(uri).get_experiment_by_name("traces")
    assert experiment is not None
    mlflow.set_tracking_uri(uri)
    found = mlflow.search_traces(locations=[experiment.experiment_id], return_type="list")
    assert len({t.info.tags[traces.CASE_TAG] for t in found}) == len(found) == 12


def test_a_kept_writer_serves_run_after_run_and_reports_each_run_s_traces(
    tmp_path: Path,
) -> None:
    writer = traces.TraceWriter(keep=True)
    try:
        for attempt in range(2):
            target = make_target(tmp_path / str(attempt))
            writer.bind(target)
            rows = [make_row(n, time.time_ns()) for n in range(3 + attempt)]
            writer.submit(rows)
            assert writer.close(rows) == len(rows)
            assert writer._process.is_alive()  # kept for the next run
            assert {(target.run_id, traces.case_of(r)) for r in rows} <= writer._written
            assert len(search(target)) == len(rows)
    finally:
        writer.stop()
    assert writer._process.exitcode == 0
    assert not writer._alive()


@pytest.mark.slow
def test_runs_in_one_process_share_one_writer_and_a_dead_one_is_replaced(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    def traced_run(name: str) -> tuple[int, int]:
        cfg = make_cfg(tmp_path / name, "dataset=single_book", "experiment.ragas=false")
        result = run(cfg)
        mlflow.set_tracking_uri(f"sqlite:///{tmp_path / name / 'mlruns.db'}")
        found = mlflow.search_traces(run_id=result.run_id, return_type="list")
        assert result.traces == len(found) == sum(r.status == "ok" for r in result.rows) > 0
        return traces.shared().pid, len(found)

    first, _ = traced_run("one")
    second, _ = traced_run("two")
    assert first == second  # the second run forked no writer
    os.kill(first, 9)  # a writer that died between runs
    traces.shared()._process.join(30)
    third, _ = traced_run("three")
    assert third != first
    assert "the trace writer ended with exit code -9" in capfd.readouterr().err
