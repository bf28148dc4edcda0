"""Bounded waits on a Chroma server (issue 32, point 3): chromadb's client waits for ever, so a
server that accepts connections and never answers (stopped, stuck) used to hang every job. Each
request now waits at most CAPRAG_CHROMA_TIMEOUT_S and the job ends with one line naming the
server. No test asserts a duration: the bound is a setting, the subprocess timeout a hang guard."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from caprag.errors import VectorStoreError
from caprag.retrieval.chroma_server import TIMEOUT_VARIABLE
from experiments.harness.build import build_index
from tests.chroma_server import chroma_process, ingest_cli
from tests.conftest import FIXTURE_BOOKS

HANG_GUARD_S = 600.0


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A port that accepts connections (the kernel's backlog) and never answers a request."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_a_server_that_never_answers_ends_the_job_with_one_line(silent_server: str) -> None:
    done = ingest_cli({"CAPRAG_CHROMA_URL": silent_server, TIMEOUT_VARIABLE: "2"})
    assert done.returncode == 2, done.stderr
    assert f"the Chroma server at {silent_server} (connect): no answer within 2 s" in done.stderr
    assert TIMEOUT_VARIABLE in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("value", ["0", "-3", "soon", "inf"])
def test_a_bad_timeout_is_a_settings_error(silent_server: str, value: str) -> None:
    done = ingest_cli({"CAPRAG_CHROMA_URL": silent_server, TIMEOUT_VARIABLE: value})
    assert done.returncode == 2, done.stderr
    assert f"{TIMEOUT_VARIABLE}={value!r}: expected seconds above 0" in done.stderr


def test_a_server_stopped_mid_run_is_an_error_not_a_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ingested and answering, then SIGSTOPped (its port still accepts connections): the next
    search and ingest end with VectorStoreError; resumed, the same index answers again."""
    monkeypatch.setenv(TIMEOUT_VARIABLE, "3")
    with chroma_process(tmp_path) as (url, process):
        index = build_index(FIXTURE_BOOKS, url, embedding="wordllama", progress=False)
        assert index.search("torch", 1)
        os.kill(process.pid, signal.SIGSTOP)
        try:
            with pytest.raises(
                VectorStoreError, match=f"Chroma server at {url}.*no answer within 3 s"
            ):
                index.search("torch", 1)
        finally:
            os.kill(process.pid, signal.SIGCONT)
        assert index.search("torch", 1)  # the same client goes on once the server answers
