"""The entry points compose and validate the config before MLflow, LangChain, Chroma, RAGAS or
pandas is imported: a typo'd override, `--help` and a bad setting fail or answer from Hydra, the
settings schema and nothing heavier. Checked from Python's own import log (`-X importtime`), not
from a clock (how long they take: `make bench startup`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from caprag.config import PROJECT_ROOT

HEAVY = ("mlflow", "langchain", "langchain_core", "langchain_openai", "chromadb", "ragas", "pandas")
HANG_S = 600  # only catches a hang; each command takes seconds


def imported(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run `python -X importtime -m experiments.run ARGS`: (the process, top-level packages it
    imported)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "experiments.run", *args],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=HANG_S,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
    )
    names = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "caprag" in names and "hydra" in names, done.stderr[-2000:]  # the log was read
    return done, names


@pytest.mark.parametrize(
    ("args", "code", "said"),
    [
        (("strategy=multi-hopp",), 1, "Could not find 'strategy/multi-hopp'"),
        (("experiment.concurency=4",), 2, "did you mean 'concurrency'?"),
        (("retriever.k=0", "tracking.enabled=false"), 2, "error: retriever.k=0 is not allowed"),
        (("+experiment.repeets=2",), 2, "did you mean 'repeats'?"),
        (("--help",), 0, "Powered by Hydra"),
    ],
)
def test_the_harness_answers_bad_input_and_help_before_importing_heavy_libraries(
    args: tuple[str, ...], code: int, said: str
) -> None:
    done, names = imported(*args)
    assert done.returncode == code, done.stderr[-2000:]
    assert said in done.stdout + done.stderr
    assert not names & set(HEAVY), sorted(names & set(HEAVY))
