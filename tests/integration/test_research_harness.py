"""Research-grade harness: response cache, resume after kill -9, cost dry run, repeats."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
from omegaconf import DictConfig

from caprag.config import PROJECT_ROOT
from experiments.harness.journal import Journal, config_hash
from experiments.harness.run import run
from experiments.results.row import QuestionRow, rows_of
from experiments.support.openai_stub import StubServer
from tests.conftest import FIXTURE_BOOKS
from tests.integration.test_harness import FIXTURE_QUESTIONS, make_cfg

HANG_S = 600  # only catches a hang

pytestmark = pytest.mark.slow


def research_cfg(tmp: Path, *overrides: str) -> DictConfig:
    return make_cfg(
        tmp,
        f"paths.cache={tmp / 'llm-cache.sqlite'}",
        f"paths.journals={tmp / 'journals'}",
        "experiment.ragas=false",
        "tracking.traces=false",
        *overrides,
    )


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> StubServer:
    with StubServer() as server:
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        yield server


def test_identical_rerun_makes_no_llm_call(tmp_path: Path, stub: StubServer) -> None:
    cfg = research_cfg(tmp_path, "llm=openai", "dataset=curated", "strategy=multi-question")
    first = run(cfg)
    calls_first = stub.requests
    assert calls_first == sum(r.values["llm_calls"] for r in first.rows) > 0
    assert all(r.values["llm_calls_cached"] == 0 for r in first.rows)

    stub.reset()
    second = run(cfg)
    assert stub.requests == 0
    assert [r.answer for r in second.rows] == [r.answer for r in first.rows]
    # The strategy's cost stays comparable; what was really spent is zero.
    assert second.mean("tokens") == first.mean("tokens")
    assert second.mean("llm_calls_cached") == second.mean("llm_calls")
    assert second.mean("cost_usd_spent") == 0.0

    stub.reset()
    run(
        research_cfg(
            tmp_path,
            "llm=openai",
            "dataset=curated",
            "strategy=multi-question",
            "experiment.cache=false",
        )
    )
    assert stub.requests == calls_first


def test_cache_key_includes_seed_and_model(tmp_path: Path, stub: StubServer) -> None:
    base = ("llm=openai", "dataset=single_book", "strategy=multi-question")
    run(research_cfg(tmp_path, *base))
    stub.reset()
    run(research_cfg(tmp_path, *base, "experiment.seed=7"))
    assert stub.requests > 0, "another seed is another call"
    stub.reset()
    run(research_cfg(tmp_path, *base, "llm.client.model=gpt-4.1-nano"))
    assert stub.requests > 0, "another model is another call"


def test_dry_run_calls_no_llm_and_prints_estimates(
    tmp_path: Path, stub: StubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = research_cfg(
        tmp_path, "llm=openai", "dataset=all", "experiment.dry_run=true", "strategy=multi-hop"
    )
    result = run(cfg)
    out = capsys.readouterr().out
    assert stub.requests == 0
    assert result.rows == [] and result.estimate is not None
    estimate = result.estimate
    assert estimate.questions == 9 and estimate.follow_ups == 2
    # Worst case of multi-hop with 3 hops: 2 analyses + 1 generation per question, + rewrites.
    assert estimate.worst_calls_total() == 3 * 9 + 2
    assert estimate.calls <= estimate.worst_calls_total()
    worst = estimate.worst_tokens()
    assert worst is not None and worst[1] == (3 * 9 + 2) * 512
    assert "no LLM was called" in out and "worst case" in out and "gpt-4o-mini" in out
    assert not (tmp_path / "mlruns.db").exists(), "a dry run logs no MLflow run"


def test_repeats_give_every_question_once_per_repeat(tmp_path: Path) -> None:
    result = run(
        research_cfg(tmp_path, "dataset=curated", "experiment.repeats=3", "tracking.enabled=false")
    )
    by_repeat = [sorted(r.question_id for r in result.rows if r.repeat == k) for k in range(3)]
    assert by_repeat[0] == by_repeat[1] == by_repeat[2] and len(by_repeat[0]) == 5
    assert result.aggregates["recall_at_k"].total == 15


def test_repeats_send_each_call_once_with_their_own_seed(tmp_path: Path, stub: StubServer) -> None:
    cfg = research_cfg(
        tmp_path,
        "llm=openai",
        "dataset=curated",
        "experiment.repeats=2",
        "experiment.concurrency=8",
        "experiment.seed=5",
        "tracking.enabled=false",
    )
    result = run(cfg)
    assert stub.requests == sum(r.values["llm_calls"] for r in result.rows) > 0
    seeds = {body.get("seed") for body in stub.bodies}
    assert seeds == {5, 6}


def test_config_hash_ignores_only_what_does_not_change_rows() -> None:
    config = {
        "strategy": {"max_hops": 3},
        "experiment": {"concurrency": 4, "resume": "auto"},
        "paths": {"corpus": "books", "store": "/a"},
        "tracking": {"uri": "x"},
    }
    same = {
        "strategy": {"max_hops": 3},
        "experiment": {"concurrency": 16, "resume": "never"},
        "paths": {"corpus": "books", "store": "/b"},
        "tracking": {"uri": "y"},
    }
    other = {**config, "strategy": {"max_hops": 2}}
    other_corpus = {**config, "paths": {"corpus": "elsewhere", "store": "/a"}}
    assert config_hash(config, "d1") == config_hash(same, "d1")
    assert config_hash(config, "d1") != config_hash(other, "d1")
    assert config_hash(config, "d1") != config_hash(other_corpus, "d1")
    assert config_hash(config, "d1") != config_hash(config, "d2")


def test_journal_skips_a_torn_line_and_appends_after_it(tmp_path: Path) -> None:
    from experiments.results.row import QuestionRow

    row = QuestionRow(
        case_id="c1", question_id="q1", set="single_book", query_type="factual", turn=1,
        question="Q?", gold_answer="A",
    )  # fmt: skip
    journal = Journal(tmp_path, "run").open()
    journal.append("0:c1", [row])
    journal.close()
    with journal.path.open("a") as handle:
        handle.write('{"case": "0:c2", "rows": [')  # the kill hit mid-write
    reopened = Journal(tmp_path, "run")
    assert list(reopened.done()) == ["0:c1"]
    reopened.open().append("0:c2", [row])
    assert list(reopened.done()) == ["0:c1", "0:c2"]
    assert reopened.busy()
    reopened.close()
    assert not reopened.busy()


def _harness_args(tmp: Path) -> list[str]:
    return [
        f"paths.corpus={FIXTURE_BOOKS}",
        f"paths.questions={FIXTURE_QUESTIONS}",
        f"paths.store={tmp / 'store'}",
        f"paths.journals={tmp / 'journals'}",
        f"tracking.uri=sqlite:///{tmp / 'mlruns.db'}",
        "experiment.progress=false",
        "experiment.ragas=false",
        "dataset=all",
        "experiment.concurrency=1",
        # The first run answers the 3 single-book questions, then stalls until killed; the
        # resumed run (the same configuration) goes through once the test removed the hold.
        "++llm._target_=tests.fakes.stalling_steps",
        "++llm.answers=3",
        f"++llm.hold={tmp / 'hold'}",
    ]


def _harness(tmp: Path, *extra: str, hold: bool = True) -> subprocess.Popen[str]:
    """The CLI in its own process; with `hold` it stalls after the single-book questions."""
    if hold:
        (tmp / "hold").touch()
    else:
        (tmp / "hold").unlink(missing_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "experiments.run", *_harness_args(tmp), *extra],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for_lines(folder: Path, lines: int, process: subprocess.Popen[str]) -> Path:
    """Poll the journal until it holds `lines` cases (a hang guard bounds the wait)."""
    guard = time.monotonic() + HANG_S
    while time.monotonic() < guard:
        for file in folder.glob("*.jsonl"):
            if file.read_text().count("\n") >= lines:
                return file
        assert process.poll() is None, "the run ended before it could be killed"
        time.sleep(0.1)
    raise AssertionError(f"the run journaled nothing in {HANG_S} s")


def test_kill_9_then_resume_runs_every_question_exactly_once(tmp_path: Path) -> None:
    # 1. A real harness process, killed with SIGKILL after two cases are journaled.
    first = _harness(tmp_path)
    journal = _wait_for_lines(tmp_path / "journals", 2, first)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=HANG_S)
    out_first = first.stdout.read() if first.stdout else ""
    assert first.returncode == -signal.SIGKILL
    run_id = journal.stem
    done_before = [json.loads(line) for line in journal.read_text().splitlines()]
    assert 2 <= len(done_before) < 7, out_first
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns.db'}")
    assert mlflow.get_run(run_id).info.status == "RUNNING"

    # 2. Resume it by id: only the missing questions are asked, the run ends complete.
    second = _harness(tmp_path, f"experiment.resume={run_id}", hold=False)
    out, _ = second.communicate(timeout=HANG_S)
    assert second.returncode == 0, out
    assert f"resuming run {run_id}" in out
    finished = mlflow.get_run(run_id)
    assert finished.info.status == "FINISHED"
    mlflow.set_experiment(experiment_id=finished.info.experiment_id)  # load_table looks there
    table = mlflow.load_table("questions.json", run_ids=[run_id])
    ids = list(table["question_id"])
    assert len(ids) == len(set(ids)) == 9 == finished.data.metrics["questions"]
    # Journaled questions were not asked again: their rows are the killed process's rows.
    logged = {row.question_id: row for row in rows_of(table)}
    for entry in done_before:
        for row in entry["rows"]:
            assert logged[row["question_id"]] == QuestionRow.model_validate(row)
    assert not journal.exists(), "a complete run leaves no journal"


def test_resume_refuses_a_run_of_another_config(tmp_path: Path) -> None:
    first = _harness(tmp_path)
    journal = _wait_for_lines(tmp_path / "journals", 1, first)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=HANG_S)
    other = _harness(tmp_path, f"experiment.resume={journal.stem}", "strategy=single", hold=False)
    out, _ = other.communicate(timeout=HANG_S)
    assert other.returncode == 2
    assert "another configuration" in out and journal.stem in out


def test_a_run_that_raised_is_resumed_by_the_same_process_while_its_traceback_lives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import experiments.results.aggregate as aggregate_module  # what run() aggregates with

    cfg = make_cfg(tmp_path, "dataset=single_book", "experiment.ragas=false")
    real = aggregate_module.aggregate

    def fails_once(rows: object) -> object:
        monkeypatch.setattr(aggregate_module, "aggregate", real)
        raise RuntimeError("the results could not be aggregated")

    monkeypatch.setattr(aggregate_module, "aggregate", fails_once)
    with pytest.raises(RuntimeError) as failed:
        run(cfg)
    # `failed` keeps the traceback (and with it the journal) alive, as a notebook cell would.
    assert failed.traceback
    capsys.readouterr()
    result = run(cfg)  # experiment.resume=auto: the same run, its answered questions kept
    out = capsys.readouterr().out
    assert "resuming run" in out
    assert result.rows and all(row.status == "ok" for row in result.rows)
