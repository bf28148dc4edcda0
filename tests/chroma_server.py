"""A real `chroma run` server on a free loopback port, as the Chroma server tests start it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

START_DEADLINE_S = 180.0
"""Only a hang guard: a loaded 2-core machine may take long to start the server."""


def chroma_cli() -> Path:
    """The `chroma` command the chromadb package installs beside this interpreter."""
    return Path(sys.executable).parent / "chroma"


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def chroma_server(folder: Path) -> Iterator[str]:
    """Run `chroma run --path folder` on 127.0.0.1 until the block ends; yields its URL."""
    cli = chroma_cli()
    if not cli.exists():
        pytest.skip(f"the chroma command is not installed at {cli} (it comes with chromadb)")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (folder / "server.log").open("wb")
    process = subprocess.Popen(
        [str(cli), "run", "--path", str(folder / "db"), "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"chroma run exited with {process.returncode}: "
                    + (folder / "server.log").read_text(errors="replace")[-2000:]
                )
            try:
                if httpx.get(f"{url}/api/v2/heartbeat", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"chroma run did not answer on {url} in {START_DEADLINE_S}s")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
