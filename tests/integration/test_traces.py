"""MLflow traces written while a run goes on: real timestamps, order, a failing writer, the end of
a run, and a file store."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import mlflow
import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from caprag.config import PROJECT_ROOT
from caprag.errors import CapragError
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


# The writer is a spawned process: what it should do differently in a test is a module-level
# function it imports by name (`TraceWriter(write=...)`), told where to report by environment.


def recording_write(
    rows: list[QuestionRow], target: traces.Target, earlier: Any = None
) -> list[traces.Written]:
    """Write, after noting the order rows came in (the writer process appends to the file)."""
    with Path(os.environ["CAPRAG_TEST_ORDER"]).open("a") as handle:
        handle.writelines(f"{row.question_id}\n" for row in rows)
    return traces.write_traces(rows, target, earlier)


def failing_write(
    rows: list[QuestionRow], target: traces.Target, earlier: Any = None
) -> list[traces.Written]:
    raise OSError("disk full")


def dying_write(
    rows: list[QuestionRow], target: traces.Target, earlier: Any = None
) -> list[traces.Written]:
    os._exit(3)


def even_only_write(
    rows: list[QuestionRow], target: traces.Target, earlier: Any = None
) -> list[traces.Written]:
    """Write the traces of even-numbered questions only, yet report every row written."""
    written = traces.write_traces(
        [row for row in rows if int(row.question_id[-1]) % 2 == 0], target, earlier
    )
    return written + [
        traces.Written(target.run_id, traces.case_of(row), "lost")
        for row in rows
        if int(row.question_id[-1]) % 2
    ]


_commits = [0]


def _count_commit(_connection: Any) -> None:
    _commits[0] += 1


def counting_write(
    rows: list[QuestionRow], target: traces.Target, earlier: Any = None
) -> list[traces.Written]:
    """Write, counting every commit of every SQLAlchemy engine in the writer process (SQLAlchemy's
    public event API: reads, deletes and tags count too), and append `traces commits` to a file."""
    if not event.contains(Engine, "commit", _count_commit):
        event.listen(Engine, "commit", _count_commit)
    before = _commits[0]
    written = traces.write_traces(rows, target, earlier)
    with Path(os.environ["CAPRAG_TEST_COMMITS"]).open("a") as handle:
        handle.write(f"{len(written)} {_commits[0] - before}\n")
    return written


def scored_row(number: int, started_ns: int) -> QuestionRow:
    """A row of today's shape: 8 spans and 34 assessments (30 scores, 2 metrics it could not
    compute, the gold answer and the gold passages)."""
    row = make_row(number, started_ns)
    row.values = {f"metric_{m:02d}": m / 30 for m in range(30)}
    row.missing = {"faithfulness": "no judge", "answer_relevancy": "no judge"}
    row.gold_ids = ["core/p1", "core/p2"]
    return row


@pytest.mark.slow
def test_the_writer_writes_traces_in_the_order_questions_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    order = tmp_path / "order.txt"
    monkeypatch.setenv("CAPRAG_TEST_ORDER", str(order))
    target = make_target(tmp_path)
    now = time.time_ns()
    rows = [make_row(n, now + n * 50 * MS) for n in range(12)]
    writer = traces.TraceWriter(write=recording_write)
    writer.bind(target)
    for at in range(0, 12, 3):
        writer.submit(rows[at : at + 3])
    counted = writer.close(rows)
    assert counted.complete and counted.expected == 12
    assert order.read_text().split() == [row.question_id for row in rows]
    found = search(target)
    assert sorted(t.info.tags[traces.CASE_TAG] for t in found) == sorted(
        f"0:q{n}" for n in range(12)
    )
    trace = next(t for t in found if t.info.tags[traces.CASE_TAG] == "0:q3")
    # MLflow's trace list: the question's real request time and execution time.
    assert trace.info.request_time == rows[3].started_ns // MS
    root = next(s for s in trace.data.spans if s.parent_id is None)
    assert trace.info.execution_duration == (root.end_time_ns - root.start_time_ns) // MS
    assert trace.info.execution_duration >= rows[3].timings["total"] * 1000 - 1
    names = [s.name for s in sorted(trace.data.spans, key=lambda s: s.start_time_ns)]
    assert set(names[:2]) == {"q3 · cross_book", "rewrite"}
    assert names.index("hop 1") < names.index("llm analyze") < names.index("hop 2")
    assert names.index("hop 2") < names.index("generate") < names.index("llm generate")
    assert {s.name for s in trace.data.spans} >= {"retrieve", "hop 1", "hop 2"}


@pytest.mark.slow
def test_the_writer_commits_at_most_three_times_a_trace_with_every_span_and_assessment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commits = tmp_path / "commits.txt"
    monkeypatch.setenv("CAPRAG_TEST_COMMITS", str(commits))
    target = make_target(tmp_path)
    now = time.time_ns()
    rows = [scored_row(n, now + n * MS) for n in range(60)]
    writer = traces.TraceWriter(write=counting_write)
    writer.bind(target)
    for at in range(0, len(rows), 6):
        writer.submit(rows[at : at + 6])
    counted = writer.close(rows)
    assert counted.complete
    assert not counted.listed  # each batch was read back as it was written, not again at the end
    batches = [tuple(map(int, line.split())) for line in commits.read_text().splitlines()]
    written = sum(n for n, _ in batches)
    assert written == len(rows)
    assert sum(c for _, c in batches) <= 3 * written, batches
    found = search(target)
    assert len(found) == len(rows)
    for trace in found:
        assert len(trace.data.spans) == 8
        assert len(trace.info.assessments) == 34
        root = next(s for s in trace.data.spans if s.parent_id is None)
        assert all(root.start_time_ns <= s.start_time_ns for s in trace.data.spans)
        assert trace.info.trace_metadata["mlflow.sourceRun"] == target.run_id


@pytest.mark.slow
@pytest.mark.parametrize("how", ["raises", "dies"])
def test_a_failing_writer_is_reported_and_its_traces_written_at_close(
    how: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    target = make_target(tmp_path)
    rows = [make_row(n, time.time_ns()) for n in range(4)]
    writer = traces.TraceWriter(write=failing_write if how == "raises" else dying_write)
    writer.bind(target)
    writer.submit(rows)
    assert writer.close(rows).complete
    err = capfd.readouterr().err
    if how == "raises":
        assert "the trace writer could not write 4 traces: OSError('disk full')" in err
    else:
        assert "the trace writer ended with exit code 3" in err
    assert "4 of 4 traces incomplete (4 no trace): writing them again" in err
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
    assert writer.close(rows).complete
    found = search(target)
    assert sorted(t.info.tags[traces.CASE_TAG] for t in found) == ["0:q0", "0:q1"]
    assert {s.name for s in found[0].data.spans} >= {"rewrite", "hop 2", "llm generate"}


@pytest.mark.slow
def test_the_count_back_finds_what_the_store_lacks_and_writes_only_that_again(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    target = make_target(tmp_path)
    rows = [scored_row(n, time.time_ns()) for n in range(6)]
    writer = traces.TraceWriter(write=even_only_write)  # q1, q3, q5 reported but never sent
    writer.bind(target)
    writer.submit(rows)
    writer.finish()
    writer.stop()
    before = traces.trace_ids(target)
    assert sorted(before) == ["0:q0", "0:q2", "0:q4"]
    # q2's trace loses its assessments' worth: a shorter trace of the same case replaces it.
    short = scored_row(2, time.time_ns())
    short.values, short.missing, short.gold_ids = {}, {}, []
    traces.write_traces([short], target)
    before = traces.trace_ids(target)
    counted = traces.count_back(target, rows)
    assert counted.reasons == {"no trace": 3, "assessments": 1}
    assert counted.line() == "4 of 6 traces incomplete (1 assessments, 3 no trace)"
    assert traces.repair(target, rows).complete
    after = traces.trace_ids(target)
    assert sorted(after) == [f"0:q{n}" for n in range(6)]
    assert after["0:q0"] == before["0:q0"] and after["0:q4"] == before["0:q4"]  # kept
    assert after["0:q2"] != before["0:q2"]  # written again
    assert "4 of 6 traces incomplete" in capfd.readouterr().err


@pytest.mark.slow
def test_a_run_whose_traces_cannot_be_written_fails_with_one_line_and_the_same_command_mends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = make_cfg(tmp_path, "dataset=all", "experiment.ragas=false", "experiment.progress=true")
    # The writer loses the odd questions' traces and this process cannot write them either.
    lossy = traces.TraceWriter(keep=True, write=even_only_write)
    monkeypatch.setattr(traces, "_shared", lossy)
    monkeypatch.setattr(traces, "write_traces", lambda rows, target, earlier=None: [])
    with pytest.raises(CapragError) as failed:
        run(cfg)
    message = str(failed.value)
    assert re.fullmatch(
        r"run \w+: \d of 9 traces incomplete \(\d no trace\); its rows and metrics are logged "
        r"and it is tagged caprag.traces_missing: run the same command again to write the "
        r"missing traces",
        message,
    ), message
    out, err = capsys.readouterr()
    assert re.search(  # the run's time split: answering, then what recording spent on what
        r"time: answering [\d.]+ s \(9 questions, \d+ q/s\); recording [\d.]+ s after the last "
        r"answer \(results [\d.]+ s; \d traces: [\d.]+ s for the writer's last ones, [\d.]+ s to "
        r"count them back\)",
        out,
    ), out
    assert "traces: 100%" in err and "trace/s" in err  # the export's progress bar
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns.db'}")
    (killed,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert killed.info.status == "FAILED"
    assert killed.data.tags["caprag.traces_missing"] in message
    assert killed.data.metrics["questions"] == 9  # its rows and metrics are logged
    kept = {
        t.info.tags[traces.CASE_TAG]: t.info.trace_id
        for t in mlflow.search_traces(run_id=killed.info.run_id, return_type="list")
    }
    assert 0 < len(kept) < 9

    lossy.stop()
    monkeypatch.undo()
    again = run(make_cfg(tmp_path, "dataset=all", "experiment.ragas=false"))
    assert again.run_id == killed.info.run_id  # resumed, nothing asked again
    finished = mlflow.get_run(killed.info.run_id)
    assert finished.info.status == "FINISHED"
    assert "caprag.traces_missing" not in finished.data.tags
    after = {
        t.info.tags[traces.CASE_TAG]: t.info.trace_id
        for t in mlflow.search_traces(run_id=killed.info.run_id, return_type="list")
    }
    assert len(after) == 9
    assert {case: after[case] for case in kept} == kept  # only the missing ones were written


WRITER_DIES_WITH_ROWS_QUEUED = """
import sys, time
ROWS = 12
from experiments.results import traces
from tests.integration.test_traces import dying_write, make_row, make_target
from pathlib import Path

target = make_target(Path(sys.argv[1]))
rows = []
for n in range(ROWS):
    row = make_row(n, time.time_ns())
    row.answer = "x" * 50_000  # together far more than a pipe holds (64 KiB)
    rows.append(row)
writer = traces.TraceWriter(write=dying_write)  # the writer dies at its first write
writer.bind(target)
for row in rows:
    writer.submit([row])
counted = writer.close(rows)
print("traces", counted.expected - len(counted.missing), flush=True)
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
    assert "12 of 12 traces incomplete (12 no trace): writing them again" in done.stderr
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
            counted = writer.close(rows)
            assert counted.complete and counted.expected == len(rows)
            assert writer._process.is_alive()  # kept for the next run
            assert writer.written(target.run_id) == len(rows)
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
