"""A canary API key, used by a real harness run (llm=openai, judge=openai) and by the API, appears
in no file either writes and in no response or output.

Probe: the key was stored in clear on every llm=openai / judge=openai run (MLflow params
`llm.api_key`, `judge.api_key`, config.json); a provider error that echoed it landed in
questions.json and in the API's 502 body; it was part of the resume hash, so a rotated key could
not resume.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from fastapi.testclient import TestClient

from caprag.config import PROJECT_ROOT, load_settings
from caprag.retrieval.store import PassageIndex
from caprag.secrets import REDACTED, redact, redact_config
from caprag.serve.api import create_app
from caprag.serve.services import Pipeline, steps_from_settings
from caprag.strategies import STRATEGIES
from experiments.harness.journal import config_hash
from experiments.support.openai_stub import StubServer
from tests.conftest import FIXTURE_BOOKS, FIXTURE_QUESTIONS

CANARY = "canary-7f3a9c1e5d2b4a60"  # not shaped like a provider key: found by its variable
ECHO = {"status": 401, "echo_key": True}


def files_holding(folder: Path, secret: str) -> list[str]:
    needle = secret.encode()
    return [
        str(path.relative_to(folder))
        for path in folder.rglob("*")
        if path.is_file() and needle in path.read_bytes()
    ]


def harness_command(work: Path, *overrides: str) -> list[str]:
    """`python -m experiments.run` on the fixture books, everything it writes under `work`."""
    return [
        sys.executable,
        "-m",
        "experiments.run",
        f"paths.corpus={FIXTURE_BOOKS}",
        f"paths.questions={FIXTURE_QUESTIONS}",
        f"paths.store={work / 'store'}",
        f"paths.journals={work / 'journals'}",
        f"paths.cache={work / 'llm-cache.sqlite'}",
        f"tracking.uri=sqlite:///{work / 'mlruns.db'}",
        f"hydra.run.dir={work / 'outputs'}",
        "retriever=wordllama",
        "+judge.embedding=wordllama",
        "experiment.progress=false",
        "experiment.concurrency=1",
        "dataset=single_book",
        *overrides,
    ]


@pytest.mark.slow
def test_a_harness_run_with_a_model_and_a_judge_stores_the_key_nowhere(tmp_path: Path) -> None:
    work = tmp_path / "work"
    # The first requests are refused with an error that repeats the key (as providers do).
    with StubServer([ECHO, ECHO]) as stub:
        env = {
            **os.environ,
            "OPENAI_API_KEY": CANARY,
            "OPENAI_BASE_URL": stub.base_url,
            "PYTHONUNBUFFERED": "1",
        }
        done = subprocess.run(
            harness_command(work, "experiment.limit=3", "llm=openai", "judge=openai"),
            cwd=PROJECT_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        requests = stub.requests
    assert done.returncode == 0, done.stdout + done.stderr
    assert requests > 2, "the run reached the model"
    assert CANARY not in done.stdout + done.stderr
    assert files_holding(work, CANARY) == []
    mlflow.set_tracking_uri(f"sqlite:///{work / 'mlruns.db'}")
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    params = run.data.params
    assert params["llm.client.api_key_env"] == "OPENAI_API_KEY"
    assert params["judge.api_key_env"] == "OPENAI_API_KEY"
    assert not [k for k in params if k.endswith(".api_key")]
    mlflow.set_experiment(experiment_id=run.info.experiment_id)
    table = mlflow.load_table("questions.json", run_ids=[run.info.run_id])
    errors = " ".join(str(e) for e in table["error"] if isinstance(e, str))
    assert "Incorrect API key provided: Bearer [redacted]" in errors  # the echo was kept, blanked


def test_the_api_never_echoes_the_key(
    fixture_index: PassageIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    with StubServer([ECHO]) as stub:
        settings = load_settings(llm="openai", openai_base_url=stub.base_url)
        steps = steps_from_settings(settings)
        app = create_app(Pipeline(STRATEGIES["single"](fixture_index, steps, k=2), steps))
        with TestClient(app, raise_server_exceptions=False, base_url="http://127.0.0.1") as client:
            refused = client.post("/api/ask", json={"question": "What does Rapid Strike do?"})
            answered = client.post("/api/ask", json={"question": "What does Rapid Strike do?"})
            health = client.get("/health")
    assert refused.status_code == 502
    assert "Incorrect API key provided" in refused.json()["error"]
    assert answered.status_code == 200
    for response in (refused, answered, health):
        assert CANARY not in response.text


def test_a_rotated_key_resumes_the_same_run() -> None:
    def config(key: str) -> dict[str, object]:
        return {"llm": {"client": {"model": "m", "api_key": key}}, "judge": {"api_key": key}}

    assert config_hash(config("old-key-123456"), "d") == config_hash(config("new-key-654321"), "d")
    assert config_hash(config("old-key-123456"), "d") != config_hash(config("old-key-123456"), "e")


def test_redaction_of_configs_and_texts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOME_SERVICE_TOKEN", "tok-abcdef-123456")
    redacted = redact_config(
        {"llm": {"api_key": "x" * 20, "api_key_env": "OPENAI_API_KEY", "max_output_tokens": 512}}
    )
    assert redacted == {
        "llm": {"api_key": REDACTED, "api_key_env": "OPENAI_API_KEY", "max_output_tokens": 512}
    }
    assert redact("bad token tok-abcdef-123456!") == f"bad token {REDACTED}!"
    assert redact("key sk-proj-ABCDEFGHIJKLMNOPQRST") == f"key {REDACTED}"
    assert redact("nothing secret here") == "nothing secret here"
