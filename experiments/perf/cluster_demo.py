"""`python -m experiments.cluster_demo` (`make cluster-demo`): the strategy sweep on real engines.

Starts a Ray head, a Chroma server and an MLflow tracking server on 127.0.0.1 (free ports, data in
--workdir), runs `-m strategy=single,multi-question,multi-hop hydra/launcher=ray` against them,
prints the comparison and where to look, and stops everything it started, also on Ctrl-C or
failure. Needs the `cluster` dependency group (`uv sync --frozen --inexact --group cluster`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import httpx

from caprag import disable_telemetry
from caprag.config import PROJECT_ROOT
from experiments.support.servers import free_port

STRATEGIES = "single,multi-question,multi-hop"
DEFAULT_WORKDIR = PROJECT_ROOT / ".caprag" / "cluster-demo"
RAY_OBJECT_STORE_BYTES = 100 * 1024 * 1024
"""Ray's default (30 % of RAM) is far more than a sweep that passes configs and rows needs."""
READY_TIMEOUT_S = 600.0
"""Bound on a server's start-up; MLflow's took ~15 s idle and ~45 s on a loaded 2-core machine."""
STOP_GRACE_S = 45.0
"""Seconds a server has to exit after SIGTERM (a Ray head drains its node) before SIGKILL."""


class DemoError(Exception):
    """A server did not start, or the sweep failed."""


def _bin(name: str) -> str:
    """A console script of this environment (the one running this module)."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else name


@dataclass
class Service:
    """A server process this demo starts in its own process group and always stops."""

    name: str
    command: list[str]
    address: str
    log: Path
    ready: Callable[[Service], bool]
    stop_signal_group: bool = True
    """SIGTERM the whole group (servers), or only the leader (`ray start --block` stops its own)."""
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self, env: dict[str, str]) -> None:
        """Start the process; its output goes to the log file."""
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                self.command,
                cwd=PROJECT_ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches the demo, which stops these in order
            )

    def check(self) -> bool:
        """Ready to serve; raise when the process has already exited."""
        assert self.process is not None
        if self.process.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise DemoError(f"{self.name} exited with {self.process.returncode}:\n{tail}")
        return self.ready(self)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL to the process group after STOP_GRACE_S."""
        process = self.process
        if process is None:
            return
        group = process.pid  # start_new_session: the group id is the leader's pid
        with contextlib.suppress(ProcessLookupError):
            if self.stop_signal_group:
                os.killpg(group, signal.SIGTERM)
            else:
                process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=STOP_GRACE_S)
        # Whatever of the group outlived its leader (server workers) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)


def _http_ok(url: str) -> Callable[[Service], bool]:
    def ready(_: Service) -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    return ready


def _log_says(text: str) -> Callable[[Service], bool]:
    def ready(service: Service) -> bool:
        return text in service.log.read_text(errors="replace")

    return ready


def ray_head(workdir: Path, temp_dir: Path, num_cpus: int) -> Service:
    """`ray start --head --block`: the head stays in the foreground and stops its own processes
    on SIGTERM (no `ray stop`, which would stop every Ray on the machine)."""
    port = free_port()
    command = [
        _bin("ray"),
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        f"--num-cpus={num_cpus}",
        f"--object-store-memory={RAY_OBJECT_STORE_BYTES}",
        "--disable-usage-stats",
        "--include-dashboard=false",
        # Ports Ray otherwise takes at fixed numbers (two heads on one machine would collide).
        f"--ray-client-server-port={free_port()}",
        f"--dashboard-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--temp-dir={temp_dir}",
    ]
    return Service(
        "Ray head",
        command,
        f"127.0.0.1:{port}",
        workdir / "ray.log",
        _log_says("will now block forever"),
        stop_signal_group=False,
    )


def chroma_server(workdir: Path) -> Service:
    """`chroma run` with its data in workdir/chroma."""
    port = free_port()
    command = [_bin("chroma"), "run", "--path", str(workdir / "chroma")]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    return Service(
        "Chroma", command, url, workdir / "chroma.log", _http_ok(f"{url}/api/v2/heartbeat")
    )


def mlflow_server(workdir: Path) -> Service:
    """`mlflow server` with a SQLite store and artifacts served from workdir/artifacts."""
    port = free_port()
    command = [
        _bin("mlflow"),
        "server",
        "--backend-store-uri",
        f"sqlite:///{workdir / 'mlflow.db'}",
        "--artifacts-destination",
        str(workdir / "artifacts"),
        "--serve-artifacts",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    url = f"http://127.0.0.1:{port}"
    return Service("MLflow", command, url, workdir / "mlflow.log", _http_ok(f"{url}/health"))


def service_env() -> dict[str, str]:
    """This environment with every usage report off (Ray's and MLflow's job runner too)."""
    disable_telemetry()
    return {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",  # no job-runner processes (unused here)
    }


@contextlib.contextmanager
def running(services: Sequence[Service], timeout_s: float = READY_TIMEOUT_S) -> Iterator[None]:
    """Start every service at once, wait until all are ready, stop all (in reverse) at the end."""
    env = service_env()
    try:
        for service in services:
            service.start(env)
        deadline = time.monotonic() + timeout_s
        waiting = list(services)
        while waiting:
            waiting = [s for s in waiting if not s.check()]
            if waiting and time.monotonic() > deadline:
                names = ", ".join(s.name for s in waiting)
                raise DemoError(f"{names} not ready in {timeout_s:.0f}s (logs: {waiting[0].log})")
            if waiting:
                time.sleep(0.5)
        yield
    finally:
        for service in reversed(services):
            print(f"stopping {service.name} ({service.address})", flush=True)
            service.stop()


def sweep_command(
    workdir: Path, chroma: str, mlflow: str, limit: int | None, extra: Sequence[str]
) -> list[str]:
    """The Hydra sweep: three strategies as Ray tasks, the index and the runs on the servers."""
    command = [
        sys.executable,
        "-m",
        "experiments.run",
        "-m",
        f"strategy={STRATEGIES}",
        "hydra/launcher=ray",
        f"retriever.index.store={chroma}",
        f"tracking.uri={mlflow}",
        "experiment.name=cluster-demo",
        "experiment.progress=false",
        f"paths.journals={workdir / 'journals'}",
        f"paths.cache={workdir / 'llm-cache.sqlite'}",
        f"hydra.sweep.dir={workdir / 'multirun'}/${{now:%Y-%m-%d_%H-%M-%S}}",
    ]
    if limit is not None:
        command.append(f"experiment.limit={limit}")
    return command + list(extra)


def where_to_look(ray: Service, chroma: Service, mlflow: Service, workdir: Path) -> str:
    """The addresses while the servers run, and how to reopen the data after they stop."""
    return "\n".join(
        [
            "Where to look:",
            f"  MLflow UI and tracking server: {mlflow.address}",
            f"  Dashboard: MLFLOW_TRACKING_URI={mlflow.address} CAPRAG_MLFLOW_UI={mlflow.address}"
            " make dashboard   → http://127.0.0.1:8501",
            f"  Chroma server: {chroma.address} (collections children-*, parents-*, manifest-*)",
            f"  Ray head: {ray.address} (RAY_ADDRESS={ray.address} ray status)",
            f"  Files: {workdir} (mlflow.db, artifacts/, chroma/, multirun/, *.log)",
            "After the servers stop: uv run mlflow ui --backend-store-uri "
            f"sqlite:///{workdir / 'mlflow.db'} --artifacts-destination {workdir / 'artifacts'}"
            " --host 127.0.0.1 --port 5000",
        ]
    )


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the demo the way Ctrl-C does: servers stopped


def main(argv: list[str] | None = None) -> int:
    """Run the demo; 0 when the sweep and the summary succeeded."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.cluster_demo",
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog="Other arguments are Hydra overrides for the sweep (e.g. retriever=wordllama).",
    )
    parser.add_argument("--limit", type=int, default=None, help="the first N questions only")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="servers' data")
    parser.add_argument("--num-cpus", type=int, default=os.cpu_count() or 2, help="Ray's CPUs")
    parser.add_argument(
        "--serve", action="store_true", help="keep the servers up after the sweep until Ctrl-C"
    )
    args, extra = parser.parse_known_args(argv)
    if shutil.which(_bin("ray")) is None:
        print(
            "error: ray is not installed: uv sync --frozen --inexact --group cluster "
            "(or make cluster-demo)",
            file=sys.stderr,
        )
        return 2
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    # Ray's socket paths must stay short (108 bytes): its session folder goes under /tmp.
    ray_tmp = Path(tempfile.mkdtemp(prefix="caprag-ray-"))
    ray, chroma, mlflow = (
        ray_head(workdir, ray_tmp, args.num_cpus),
        chroma_server(workdir),
        mlflow_server(workdir),
    )
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        print(
            "starting a Ray head, a Chroma server and an MLflow server on 127.0.0.1 …", flush=True
        )
        with running([ray, chroma, mlflow]):
            print(
                f"Ray: {ray.address}\nChroma: {chroma.address}\nMLflow: {mlflow.address}",
                flush=True,
            )
            env = {**service_env(), "RAY_ADDRESS": ray.address, "PYTHONUNBUFFERED": "1"}
            command = sweep_command(workdir, chroma.address, mlflow.address, args.limit, extra)
            print("$ " + " ".join(command[1:]), flush=True)
            if subprocess.run(command, cwd=PROJECT_ROOT, env=env, check=False).returncode != 0:
                raise DemoError("the sweep failed (its output is above)")
            summary = [sys.executable, "-m", "experiments.summary"]
            env["MLFLOW_TRACKING_URI"] = mlflow.address
            if subprocess.run(summary, cwd=PROJECT_ROOT, env=env, check=False).returncode != 0:
                raise DemoError("the summary failed (its output is above)")
            print("\n" + where_to_look(ray, chroma, mlflow, workdir), flush=True)
            if args.serve:
                print("Servers up; press Ctrl-C to stop them.", flush=True)
                with contextlib.suppress(KeyboardInterrupt):
                    while True:
                        time.sleep(3600)
    except KeyboardInterrupt:
        print("interrupted: stopped the servers", file=sys.stderr, flush=True)
        return 130
    except DemoError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    print("stopped everything this demo started", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
