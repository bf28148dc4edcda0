"""Start a local server for a test or benchmark, wait until it is healthy, always stop it."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

from caprag.config import PROJECT_ROOT


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running(
    command: Sequence[str],
    health_url: str,
    env: dict[str, str],
    log_path: Path,
    ready_timeout_s: float = 300.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `command` until the block ends; ready when `health_url` answers 200 (bounded wait).
    The block gets the process."""
    with log_path.open("w") as log:
        process = subprocess.Popen(
            list(command), cwd=PROJECT_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + ready_timeout_s
            while True:
                if process.poll() is not None:
                    tail = log_path.read_text()[-2000:]
                    raise RuntimeError(f"{command[0]} exited with {process.returncode}: {tail}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(health_url, timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{health_url} was not ready in {ready_timeout_s:.0f}s")
                time.sleep(0.5)
            yield process
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


@contextlib.contextmanager
def openai_stub(*options: str) -> Iterator[tuple[str, int]]:
    """`python -m experiments.openai_stub` with these options in its own process (no GIL shared
    with the harness): (base URL, pid) once it answers."""
    port = free_port()
    command = [sys.executable, "-m", "experiments.openai_stub", "--port", str(port), *options]
    log_path = Path(tempfile.gettempdir()) / f"caprag-stub-{port}.log"
    with running(command, f"http://127.0.0.1:{port}/stats", dict(os.environ), log_path) as stub:
        yield f"http://127.0.0.1:{port}/v1", stub.pid
