"""A real `chroma run` server on a free loopback port, as the Chroma server tests start it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from experiments.support.servers import free_port, running

__all__ = [
    "START_DEADLINE_S",
    "chroma_cli",
    "chroma_process",
    "chroma_server",
    "free_port",
    "ingest_cli",
]

START_DEADLINE_S = 600.0
"""Only a hang guard: a loaded 2-core machine may take long to start the server."""


def chroma_cli() -> Path:
    """The `chroma` command the chromadb package installs beside this interpreter."""
    return Path(sys.executable).parent / "chroma"


@contextmanager
def chroma_server(folder: Path) -> Iterator[str]:
    """Run `chroma run --path folder` on 127.0.0.1 until the block ends; yields its URL."""
    with chroma_process(folder) as (url, _):
        yield url


@contextmanager
def chroma_process(folder: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`chroma_server`, yielding its URL and its process (a test may stop and resume it)."""
    cli = chroma_cli()
    if not cli.exists():
        pytest.skip(f"the chroma command is not installed at {cli} (it comes with chromadb)")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [str(cli), "run", "--path", str(folder / "db"), "--host", "127.0.0.1"]
    with running(
        [*command, "--port", str(port)],
        f"{url}/api/v2/heartbeat",
        dict(os.environ),
        folder / "server.log",
        START_DEADLINE_S,
    ) as process:
        yield url, process


def ingest_cli(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`python -m caprag.ingest` on the fixture books with WordLlama and `env` (a hang guard)."""
    from caprag.config import PROJECT_ROOT
    from tests.conftest import FIXTURE_BOOKS

    return subprocess.run(
        [sys.executable, "-m", "caprag.ingest", str(FIXTURE_BOOKS)],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env={**os.environ, "CAPRAG_EMBEDDING": "wordllama", **env},
        timeout=600,
    )
