"""Questions in flight and worker processes (experiment.concurrency, experiment.workers), through
run(cfg) as users call it, with `llm=openai` against the OpenAI-protocol stub on 127.0.0.1: a run
asks and answers the same at 1, 16 and 64 in flight, in one process or two; the LLM response
cache is shared between the workers; a killed worker stops the run and the resumed run asks only
what was not journaled; bad values are refused by name."""

from __future__ import annotations

import gc
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from caprag.config import PROJECT_ROOT
from caprag.errors import ConfigError
from experiments.harness import workers
from experiments.harness.journal import Journal
from experiments.harness.run import run
from experiments.harness.workers import WorkerError, WorkerPool
from experiments.support.openai_stub import StubServer
from tests.conftest import FIXTURE_BOOKS, FIXTURE_QUESTIONS

CONF = PROJECT_ROOT / "conf"
TIMING = {"latency_s", "timings", "started_ns", "started_at"}
"""Fields that hold times: the only ones allowed to differ between the runs."""

pytestmark = pytest.mark.slow


def untimed(value: Any) -> Any:
    """The value with every timing field left out, at any depth."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def compose_cfg(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def stub_overrides(tmp: Path, stub: StubServer, name: str) -> list[str]:
    """llm=openai against the stub; every file of the run under `tmp`, the journal and the
    response cache per run `name`."""
    return [
        f"paths.store={tmp / 'store'}",
        f"paths.journals={tmp / f'journals-{name}'}",
        f"paths.cache={tmp / f'cache-{name}.sqlite'}",
        "tracking.enabled=false",
        "experiment.progress=false",
        "experiment.resume=never",
        "llm=openai",
        f"llm.client.base_url={stub.base_url}",
        "llm.client.api_key_env=CAPRAG_TEST_KEY",
        "retriever=wordllama",
        "dataset=curated",
        "experiment.limit_per_set=40",
    ]


def answered(
    tmp: Path, concurrency: int, count: int, *extra: str
) -> tuple[list[Any], list[str], int]:
    """Rows (untimed), request bodies (sorted) and the most requests in flight at once."""
    hold = concurrency if concurrency > 1 else 0  # held until that many are in flight at once
    with StubServer(hold_until=hold) as stub:
        name = f"{concurrency}-{count}"
        cfg = compose_cfg(
            *stub_overrides(tmp, stub, name),
            "experiment.cache=false",
            f"experiment.concurrency={concurrency}",
            f"experiment.workers={count}",
            *extra,
        )
        result = run(cfg)
        bodies = sorted(json.dumps(body, sort_keys=True) for body in stub.bodies)
        return (
            [untimed(row.model_dump(mode="json")) for row in result.rows],
            bodies,
            stub.max_in_flight,
        )


def test_rows_and_requests_are_the_same_at_1_16_and_64_in_flight_in_one_process_or_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAPRAG_TEST_KEY", "test-key")
    one, one_sent, _ = answered(tmp_path, 1, 1)
    assert len(one) == 80 and all(row["status"] == "ok" for row in one)
    assert len(one_sent) >= 2 * len(one)  # an analysis and an answer per question at least
    for level in (16, 64):
        for count in (1, 2):
            rows, sent, in_flight = answered(tmp_path, level, count)
            # Two workers together keep the whole concurrency in flight, not half of it.
            assert in_flight >= level, f"never {level} requests in flight with {count} worker(s)"
            assert sent == one_sent
            assert rows == one  # values, contexts, answers, every call as sent, in dataset order


def test_workers_share_the_response_cache_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAPRAG_TEST_KEY", "test-key")
    with StubServer() as stub:
        common = [
            *stub_overrides(tmp_path, stub, "shared"),
            "experiment.cache=true",
            "experiment.concurrency=16",
            "experiment.workers=2",
        ]
        first = run(compose_cfg(*common))
        asked = stub.requests
        assert asked >= 2 * len(first.rows) and first.summary["failed"] == 0
        # Another config (no RAGAS) is no reused row, but every call is one the two workers
        # wrote into the one cache file at once: the rerun asks the model nothing.
        stub.reset()
        again = run(compose_cfg(*common, "experiment.ragas=false"))
    assert stub.requests == 0
    assert "reused_cases" in again.summary and again.summary["reused_cases"] == 0
    assert [r.answer for r in again.rows] == [r.answer for r in first.rows]
    assert all(r.values["llm_calls_cached"] == r.values["llm_calls"] for r in again.rows)


def _fixture_cfg(tmp: Path, stub: StubServer, *extra: str) -> DictConfig:
    """The fixture books with the default dense retriever (MiniLM on ONNX Runtime, Chroma)."""
    return compose_cfg(
        f"paths.corpus={FIXTURE_BOOKS}",
        f"paths.questions={FIXTURE_QUESTIONS}",
        f"paths.store={tmp / 'store'}",
        f"paths.cache={tmp / 'cache.sqlite'}",
        "tracking.enabled=false",
        "experiment.progress=false",
        "experiment.cache=false",
        "experiment.ragas=false",
        "llm=openai",
        f"llm.client.base_url={stub.base_url}",
        "llm.client.api_key_env=CAPRAG_TEST_KEY",
        "dataset=all",
        "experiment.concurrency=2",
        *extra,
    )


def test_a_killed_worker_stops_the_run_and_resume_asks_only_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAPRAG_TEST_KEY", "test-key")
    pools: list[WorkerPool] = []
    original_init = WorkerPool.__init__

    def keep(self: WorkerPool, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        pools.append(self)

    monkeypatch.setattr(WorkerPool, "__init__", keep)
    with StubServer() as stub:
        reference = run(_fixture_cfg(tmp_path, stub, f"paths.journals={tmp_path / 'ref'}"))
        assert reference.summary["failed"] == 0
        cases = len({row.case_id for row in reference.rows})
        assert cases >= 6

        # The second journaled case kills worker 2 like kill -9 (or the OOM killer) would.
        journals = tmp_path / "journals"
        cfg = _fixture_cfg(tmp_path, stub, f"paths.journals={journals}", "experiment.workers=2")
        real_append = Journal.append
        appended: list[str] = []

        def append_then_kill(self: Journal, key: str, rows: list[Any]) -> None:
            real_append(self, key, rows)
            appended.append(key)
            if len(appended) == 2:
                os.kill(pools[-1].workers[1].process.pid, signal.SIGKILL)

        monkeypatch.setattr(Journal, "append", append_then_kill)
        stub.reset()
        with pytest.raises(WorkerError) as info:
            run(cfg)
        message = str(info.value)
        pid = pools[-1].workers[1].process.pid
        assert f"worker 2 (pid {pid}) ended with exit code -9 (killed by SIGKILL)" in message
        assert "experiment.resume=auto" in message
        del info  # its traceback holds the failed run's journal (and so its lock)
        gc.collect()
        assert not any(w.process.is_alive() for w in pools[-1].workers), "a worker was left"
        monkeypatch.setattr(Journal, "append", real_append)
        (journal_file,) = journals.glob("*.jsonl")
        journaled = Journal(journals, journal_file.stem).done()
        assert 2 <= len(journaled) < cases
        assert f"the {len(journaled)} cases finished so far (of {cases}) are kept" in message

        stub.reset()
        resumed = run(cfg)
    assert resumed.resumed == sum(len(rows) for rows in journaled.values())
    assert [untimed(r.model_dump(mode="json")) for r in resumed.rows] == [
        untimed(r.model_dump(mode="json")) for r in reference.rows
    ]
    # Only the questions the journal did not have were asked again, each once.
    done_ids = {row.question_id for rows in journaled.values() for row in rows}
    expected_calls = sum(
        row.values["llm_calls"] for row in reference.rows if row.question_id not in done_ids
    )
    assert stub.requests == expected_calls
    assert not list(journals.glob("*.jsonl"))  # the finished run removed its journal


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("0", "0"),
        ("-2", "-2"),
        ("many", "'many'"),
        ("1.5", "1.5"),
        ("true", "true"),
        ("null", "null"),
    ],
)
def test_a_bad_workers_value_is_refused_by_name(value: str, shown: str, tmp_path: Path) -> None:
    cfg = compose_cfg(
        f"paths.store={tmp_path / 'store'}",
        "tracking.enabled=false",
        f"experiment.workers={value}",
    )
    with pytest.raises(ConfigError) as info:
        run(cfg)
    assert str(info.value) == (
        f"experiment.workers={shown} is not allowed: expected auto or a whole number of at "
        "least 1 (processes that answer the questions)"
    )
    assert not (tmp_path / "store").exists()  # refused before anything was built


@pytest.mark.parametrize(
    ("concurrency", "cores", "wanted", "count"),
    [
        (4, 2, "auto", 1),
        (15, 8, "auto", 1),
        (16, 2, "auto", 2),
        (64, 2, "auto", 2),
        (64, 16, "auto", 8),
        (24, 16, "auto", 3),
        (3, 2, 4, 3),  # never more workers than questions in flight
        (16, 2, 1, 1),
    ],
)
def test_auto_and_explicit_worker_counts(
    concurrency: int, cores: int, wanted: object, count: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workers, "usable_cores", lambda: cores)
    cfg = compose_cfg(f"experiment.concurrency={concurrency}", f"experiment.workers={wanted}")
    assert workers.worker_count(cfg) == count
    assert sum(workers.shares(concurrency, count)) == concurrency
