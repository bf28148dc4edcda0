"""`python -m experiments.cluster_demo` (make cluster-demo) on a few questions: the sweep runs as
Ray tasks on a Ray head, its runs, per-question tables and traces are in the MLflow server, the
index is in the Chroma server, and every server is stopped afterwards (also when the sweep
fails)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import chromadb
import mlflow
import pytest
from chromadb.config import Settings
from mlflow import MlflowClient

from caprag.config import PROJECT_ROOT
from experiments.results.tracking import TABLE
from tests.conftest import sigint_as_in_a_terminal

pytestmark = pytest.mark.cluster

QUESTIONS = 2
DEADLINE_S = 1800.0
"""Only catches a hang: the demo took ~2.5 min on a loaded 2-core machine."""


def demo(workdir: Path, *args: str) -> tuple[subprocess.Popen[str], Path]:
    log = workdir / "demo.log"
    workdir.mkdir(parents=True)
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "experiments.cluster_demo",
                "--workdir",
                str(workdir),
                *args,
            ],
            cwd=PROJECT_ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=sigint_as_in_a_terminal,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    return process, log


def wait_for(process: subprocess.Popen[str], log: Path, text: str) -> str:
    deadline = time.monotonic() + DEADLINE_S
    while text not in (output := log.read_text()):
        assert process.poll() is None, f"the demo exited with {process.returncode}:\n{output}"
        assert time.monotonic() < deadline, f"no {text!r} in {DEADLINE_S:.0f}s:\n{output}"
        time.sleep(1)
    return output


def addresses(output: str) -> dict[str, tuple[str, int]]:
    found = dict(re.findall(r"^(Ray|Chroma|MLflow): (\S+)$", output, re.MULTILINE))
    assert set(found) == {"Ray", "Chroma", "MLflow"}, output
    out = {}
    for name, address in found.items():
        parts = urlsplit(address if "://" in address else f"tcp://{address}")
        assert parts.hostname == "127.0.0.1" and parts.port is not None
        out[name] = (parts.hostname, parts.port)
    return out


def assert_closed(where: dict[str, tuple[str, int]]) -> None:
    for name, (host, port) in where.items():
        with socket.socket() as sock:
            sock.settimeout(5)
            assert sock.connect_ex((host, port)) != 0, f"{name} still listens on {host}:{port}"


def test_the_sweep_runs_on_ray_against_both_servers_and_everything_stops(tmp_path: Path) -> None:
    process, log = demo(
        tmp_path / "demo", "--limit", str(QUESTIONS), "--serve", "retriever=wordllama"
    )
    try:
        output = wait_for(process, log, "press Ctrl-C to stop them")
        where = addresses(output)
        # The three jobs were Ray tasks (the Hydra Ray launcher), not local processes.
        assert "Ray Launcher is launching 3 jobs" in output
        assert len(set(re.findall(r"\(_run_job pid=(\d+)", output))) >= 2
        header = re.search(r"^\| metric +\|(.+)\|$", output, re.MULTILINE)
        assert header is not None, output  # the comparison table (in the order the runs started)
        assert sorted(c.strip() for c in header.group(1).split("|")) == [
            "multi-hop (offline)",
            "multi-question (offline)",
            "single (offline)",
        ]

        # Each run, its per-question table and its traces are in the MLflow server.
        host, port = where["MLflow"]
        client = MlflowClient(f"http://{host}:{port}")
        mlflow.set_tracking_uri(client.tracking_uri)  # load_table searches the global URI's runs
        experiment = client.get_experiment_by_name("caprag")
        assert experiment is not None
        runs = client.search_runs(
            [experiment.experiment_id], "tags.`caprag.experiment` = 'cluster-demo'"
        )
        children = [r for r in runs if r.data.tags.get("caprag.role") != "sweep"]
        assert sorted(r.data.tags["caprag.strategy"] for r in children) == [
            "multi-hop",
            "multi-question",
            "single",
        ]
        assert len({r.data.tags["mlflow.parentRunId"] for r in children}) == 1
        for run in children:
            assert run.info.status == "FINISHED"
            assert run.data.metrics["questions"] == QUESTIONS
            table = client.load_table(experiment.experiment_id, TABLE, run_ids=[run.info.run_id])
            assert len(table) == QUESTIONS
            assert table["status"].eq("ok").all()
            traces = client.search_traces(
                locations=[experiment.experiment_id], run_id=run.info.run_id
            )
            assert len(traces) == QUESTIONS

        # The index is in the Chroma server (no local store was written).
        host, port = where["Chroma"]
        chroma = chromadb.HttpClient(host, port, settings=Settings(anonymized_telemetry=False))
        names = [c.name for c in chroma.list_collections()]
        children_of_index = [n for n in names if n.startswith("children-wordllama")]
        parents_of_index = [n for n in names if n.startswith("parents-wordllama")]
        assert len(children_of_index) == len(parents_of_index) == 1, names
        assert chroma.get_collection(children_of_index[0]).count() > 0
        assert chroma.get_collection(parents_of_index[0]).count() > 0
        assert not (tmp_path / "demo" / "store").exists()
    finally:
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=DEADLINE_S)
    output = log.read_text()
    assert code == 0, output
    assert "stopped everything this demo started" in output
    assert_closed(where)


def test_a_failed_sweep_still_stops_every_server(tmp_path: Path) -> None:
    process, log = demo(tmp_path / "demo", "--limit", "1", "no_such_setting=1")
    code = process.wait(timeout=DEADLINE_S)
    output = log.read_text()
    assert code == 1, output
    assert "Could not override 'no_such_setting'" in output
    assert "error: the sweep failed" in output
    assert_closed(addresses(output))
