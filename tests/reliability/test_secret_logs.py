"""The API key appears in no log line, console output, stored reply or response, even when the
endpoint echoes it in a 401 (as OpenAI does) or a model reply repeats it.

Probe: a `judge=openai` run whose endpoint echoed the key printed it to stdout and Hydra's
`run.log` (`[instructor.v2.retry][ERROR] - API call failed ... Incorrect API key provided: ...`);
a model reply repeating the key was stored unredacted in trace spans, the LLM cache, the decision
log and the chat store, and returned by `/api/ask` and `/chat`.
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from fastapi.testclient import TestClient

from caprag.config import PROJECT_ROOT, load_settings
from caprag.retrieval.store import PassageIndex
from caprag.secrets import REDACTED, RedactingFilter, install_log_redaction
from caprag.serve.api import create_app
from caprag.serve.checkpoint import open_checkpointer
from caprag.serve.decision_log import DecisionLog
from caprag.serve.services import Pipeline, retention_from_settings, steps_from_settings
from caprag.strategies import STRATEGIES
from experiments.support.openai_stub import StubServer
from tests.reliability.test_secrets import harness_command

CANARY = "canary-9d41b7e2c0a35f18"  # not shaped like a provider key: found by its variable
ECHO = {"status": 401, "echo_key": True}
REPEAT = {"fill_tool": f"the key is {CANARY} as you asked"}


def files_holding(folder: Path, secret: str) -> list[str]:
    needle = secret.encode()
    return [
        str(path.relative_to(folder))
        for path in folder.rglob("*")
        if path.is_file() and needle in path.read_bytes()
    ]


@pytest.mark.slow
def test_a_judge_refused_with_the_key_and_replies_repeating_it_leave_it_nowhere(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    # The model's replies repeat the key; the judge's endpoint refuses every call with an error
    # that repeats it (instructor logs each refusal at ERROR, through Hydra's handlers).
    with StubServer([REPEAT] * 12) as model, StubServer(default=ECHO) as judge:
        env = {
            **os.environ,
            "OPENAI_API_KEY": CANARY,
            "OPENAI_BASE_URL": judge.base_url,
            "PYTHONUNBUFFERED": "1",
        }
        done = subprocess.run(
            harness_command(
                work,
                "experiment.limit=2",
                "llm=openai",
                f"llm.client.base_url={model.base_url}",
                "judge=openai",
            ),
            cwd=PROJECT_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        asked, judged = model.requests, judge.requests
    assert done.returncode == 0, done.stdout + done.stderr
    assert asked > 2 and judged > 2, "the run reached the model and the judge"
    output = done.stdout + done.stderr
    assert CANARY not in output
    (run_log,) = (work / "outputs").glob("*.log")
    assert files_holding(work, CANARY) == []
    mlflow.set_tracking_uri(f"sqlite:///{work / 'mlruns.db'}")
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    mlflow.set_experiment(experiment_id=run.info.experiment_id)
    table = mlflow.load_table("questions.json", run_ids=[run.info.run_id])
    assert CANARY not in table.to_json()
    assert REDACTED in table.to_json()  # the repeated key was kept, blanked
    # the refusals were seen: logged, or recorded as the reason a judge score is missing
    assert "Incorrect API key provided" in run_log.read_text() + output + table.to_json()


def test_a_reply_repeating_the_key_is_blanked_everywhere_it_goes(
    fixture_index: PassageIndex, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    log_file = tmp_path / "decisions.db"
    chat_file = tmp_path / "chat.db"
    with StubServer([REPEAT] * 8) as stub:
        settings = load_settings(llm="openai", openai_base_url=stub.base_url)
        steps = steps_from_settings(settings)
        pipeline = Pipeline(
            STRATEGIES["single"](fixture_index, steps, k=2),
            steps,
            open_saver=functools.partial(
                open_checkpointer, f"sqlite:{chat_file}", retention_from_settings(settings)
            ),
            decision_log=DecisionLog(log_file),
        )
        app = create_app(pipeline)
        with TestClient(app, base_url="http://127.0.0.1") as client:
            asked = client.post("/api/ask", json={"question": "What does Rapid Strike do?"})
            thread = asked.json()["thread_id"]
            page = client.get(f"/?thread_id={thread}")
    assert asked.status_code == 200, asked.text
    assert REDACTED in asked.json()["answer"]
    for response in (asked, page):
        assert CANARY not in response.text
    assert chat_file.exists() and log_file.exists()
    assert files_holding(tmp_path, CANARY) == []


def test_the_log_filter_blanks_messages_arguments_and_tracebacks(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    handler = logging.StreamHandler(sys.stderr)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        install_log_redaction()
        child = logging.getLogger("instructor.v2.retry")  # propagates: root handler filters it
        child.error("API call failed: Incorrect API key provided: Bearer %s", CANARY)
        try:
            raise RuntimeError(f"refused {CANARY}")
        except RuntimeError:
            logging.getLogger("openai._base_client").exception("request failed")
        logging.getLogger("httpx").warning({"key": CANARY})
    finally:
        root.removeHandler(handler)
    err = capsys.readouterr().err
    assert CANARY not in err
    assert err.count(REDACTED) == 3
    assert any(isinstance(f, RedactingFilter) for f in handler.filters)
