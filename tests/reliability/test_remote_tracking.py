"""Bounded waits on an MLflow tracking server over HTTP.

Probe: `tracking.uri=http://127.0.0.1:9` (nothing listening) was still retrying after 300 s with
no error; an MLflow server killed mid-run left the harness hanging more than 420 s after every
question was answered and journaled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from caprag.config import PROJECT_ROOT
from experiments.perf.cluster_demo import mlflow_server, running
from experiments.results import tracking
from experiments.support.openai_stub import StubServer
from experiments.support.servers import free_port
from tests.conftest import FIXTURE_BOOKS, FIXTURE_QUESTIONS

HANG_S = 600  # only catches a hang


def harness_args(tmp: Path, uri: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "experiments.run",
        f"paths.corpus={FIXTURE_BOOKS}",
        f"paths.questions={FIXTURE_QUESTIONS}",
        f"paths.store={tmp / 'store'}",
        f"paths.journals={tmp / 'journals'}",
        f"paths.cache={tmp / 'cache.sqlite'}",
        f"tracking.uri={uri}",
        f"hydra.run.dir={tmp / 'outputs'}",
        "retriever=wordllama",
        "experiment.progress=false",
        "experiment.ragas=false",
        "dataset=single_book",
        "experiment.limit=2",
        *extra,
    ]


def test_a_closed_port_is_one_error_line_and_exit_2(tmp_path: Path) -> None:
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done = subprocess.run(
        harness_args(tmp_path, uri),
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: MLflow tracking server {uri} is unreachable ([Errno 111] Connection refused); "
        "start it, or set tracking.uri to a reachable server (tracking.enabled=false runs "
        "without MLflow)"
    ]
    assert "run " not in done.stdout  # no question was asked


def test_the_retry_budget_is_set_for_every_mlflow_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("MAX_RETRIES", "BACKOFF_FACTOR", "TIMEOUT"):
        monkeypatch.delenv(f"MLFLOW_HTTP_REQUEST_{name}", raising=False)
    from mlflow.environment_variables import (
        MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR,
        MLFLOW_HTTP_REQUEST_MAX_RETRIES,
        MLFLOW_HTTP_REQUEST_TIMEOUT,
    )

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "7")
    tracking.bound_requests()
    assert MLFLOW_HTTP_REQUEST_MAX_RETRIES.get() == tracking.RETRIES == 3
    assert MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR.get() == 1
    assert MLFLOW_HTTP_REQUEST_TIMEOUT.get() == tracking.TIMEOUT_S == 10
    with pytest.raises(tracking.TrackingUnavailableError, match=r"tracking\.retries=-1"):
        tracking.bound_requests(-1, 10)


class GatedStub(StubServer):
    """The model stub, holding every request until `gate` is set (`arrived` says one came)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.arrived = threading.Event()
        self.gate = threading.Event()

    def enter(self) -> None:
        self.arrived.set()
        self.gate.wait(HANG_S)
        super().enter()


@pytest.mark.slow
def test_a_server_killed_mid_run_ends_the_run_with_one_line_saying_what_is_journaled(
    tmp_path: Path,
) -> None:
    service = mlflow_server(tmp_path / "mlflow")
    (tmp_path / "mlflow").mkdir()
    with running([service]), GatedStub() as model:
        harness = subprocess.Popen(
            harness_args(
                tmp_path,
                service.address,
                "llm=openai",
                f"llm.client.base_url={model.base_url}",
                "llm.client.api_key_env=CAPRAG_TEST_KEY",
                "tracking.retries=1",
            ),
            cwd=PROJECT_ROOT,
            env={**os.environ, "CAPRAG_TEST_KEY": "test-key", "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert model.arrived.wait(HANG_S), "the run asked its first question"
            assert service.process is not None
            os.killpg(service.process.pid, signal.SIGKILL)  # the server dies mid-run
            service.process.wait(HANG_S)
            model.gate.set()
            released = time.monotonic()
            out, err = harness.communicate(timeout=HANG_S)
            # Reported, not asserted (load decides it): the wait after the server died.
            print(f"harness ended {time.monotonic() - released:.1f} s after the gate opened")
        finally:
            model.gate.set()
            if harness.poll() is None:
                harness.kill()
                harness.communicate()
    assert harness.returncode == 2, out + err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    (line,) = errors
    assert line.startswith(f"error: MLflow tracking server {service.address} stopped answering")
    journal = next((tmp_path / "journals").rglob("*.jsonl"))
    assert f"the questions answered so far are journaled in {journal}" in line
    assert "gave up after 1 retries" in line and "rerun the same command" in line
    assert len(journal.read_text().splitlines()) >= 2  # both questions answered and kept
