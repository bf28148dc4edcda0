"""Faults of the model endpoint and of the process, probed against a real OpenAI-protocol server
on 127.0.0.1 and a real harness process killed with SIGKILL.

Probes: truncated JSON bodies and empty `choices` were not retried (13/20 and 9/20 questions
failed); a hung endpoint held an API request 243 s; a kill -9 during trace logging gave 116
traces for 96 questions after resume (and, with traces written while the run goes on, questions
journaled but not yet traced must get their trace on resume).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import mlflow
import pytest

from caprag.config import PROJECT_ROOT
from caprag.errors import LLMCallError, LLMTimeoutError
from caprag.llm import StepFailedError, build_openai_client
from caprag.retrieval.store import PassageIndex
from caprag.serve.services import Pipeline
from caprag.steps.analyze import ANALYZE, SufficiencyDecision, prompt_values
from caprag.strategies import STRATEGIES
from experiments.support.openai_stub import StubServer
from tests.conftest import FIXTURE_BOOKS, FIXTURE_QUESTIONS
from tests.fakes import openai_steps

GOOD = {"args": {"sufficient": True, "new_queries": [], "reasoning": "enough"}}
GOOD_JSON = {"content": '{"sufficient": true, "new_queries": [], "reasoning": "enough"}'}
METHODS = ["function_calling", "json_schema"]


def analyze(base_url: str, method: str, **client: object) -> tuple[SufficiencyDecision, object]:
    llm = build_openai_client(
        "m", api_key="k", base_url=base_url, structured_method=method, max_retries=0, **client
    )
    values = prompt_values("What does Rapid Strike do?", [], [], 3)
    return asyncio.run(llm.structured("analyze", ANALYZE, SufficiencyDecision, **values))


def good(method: str) -> dict[str, object]:
    return GOOD if method == "function_calling" else GOOD_JSON


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    "fault",
    [
        {"cut_body": {"args": {"sufficient": True, "new_queries": ["a long query"]}}},
        {"cut_body": {"content": '{"sufficient": true, "new_queries": []}'}},
        {"empty_choices": True},
    ],
    ids=["cut-tool-call", "cut-content", "empty-choices"],
)
def test_an_unreadable_reply_is_retried_like_any_unparseable_one(
    method: str, fault: dict[str, object]
) -> None:
    with StubServer([fault], default=good(method)) as stub:
        decision, usage = analyze(stub.base_url, method)
    assert decision.sufficient
    assert usage.attempts == 2  # type: ignore[attr-defined]
    assert stub.requests == 2


def test_unreadable_on_every_attempt_is_a_recorded_step_failure_not_an_endpoint_error() -> None:
    with StubServer(default={"empty_choices": True}) as stub, pytest.raises(StepFailedError) as e:
        analyze(stub.base_url, "function_calling")
    assert stub.requests == 3
    assert e.value.usage.attempts == 3
    assert "unreadable reply" in (e.value.usage.error or "")


def test_faulty_replies_no_longer_fail_questions(fixture_index: PassageIndex) -> None:
    """Every other reply faulty (cut bodies and empty choices): each question still answered."""
    faults = [{"cut_body": GOOD}, {"empty_choices": True}] * 6
    replies = [r for fault in faults for r in (fault, {"fill_tool": "Rapid Strike"})]
    with StubServer(replies, default={"fill_tool": "Rapid Strike"}) as stub:
        steps = openai_steps(api_key="k", base_url=stub.base_url)
        pipeline = Pipeline(STRATEGIES["multi-hop"](fixture_index, steps, k=2), steps)
        results = [
            asyncio.run(pipeline.ask(q))
            for q in ("What does Rapid Strike do?", "How much does Arcane Aptitude cost?") * 3
        ]
    assert all(r.answer and not r.answer_error for r in results)
    assert sum(u.attempts - 1 for r in results for u in r.usage) >= 6  # faults were retried


def test_a_hung_endpoint_is_a_timeout_within_the_bound_not_a_hang() -> None:
    with StubServer(default={"hang": True}) as stub, pytest.raises(LLMTimeoutError) as e:
        analyze(stub.base_url, "function_calling", timeout_s=0.5)
    assert "did not finish" in str(e.value)
    assert isinstance(e.value, LLMCallError)


def test_a_provider_error_that_echoes_the_key_does_not_carry_it() -> None:
    canary = "sk-canary-0123456789abcdefghij"
    with StubServer(default={"status": 401, "echo_key": True}) as stub:
        llm = build_openai_client("m", api_key=canary, base_url=stub.base_url, max_retries=0)
        values = prompt_values("q", [], [], 3)
        with pytest.raises(LLMCallError) as e:
            asyncio.run(llm.structured("analyze", ANALYZE, SufficiencyDecision, **values))
    assert "Incorrect API key provided" in str(e.value)
    assert canary not in str(e.value)


_sent: list[Any] = []


def write_four_then_kill_the_harness(rows: Any, target: Any, earlier: Any = None) -> Any:
    """In the trace writer (spawned by the harness): write the first four traces only; once six or
    more questions were journaled and sent, kill the harness like kill -9 and end."""
    from experiments.results import traces

    written = traces.write_traces(rows[: max(0, 4 - len(_sent))], target, earlier)
    _sent.extend(rows)
    if len(_sent) >= 6:
        os.kill(os.getppid(), signal.SIGKILL)
        os._exit(0)
    return written


KILL_DURING_TRACES = textwrap.dedent(
    """
    import sys
    import caprag  # telemetry opt-outs first
    from experiments.results import traces
    from tests.reliability.test_faults import write_four_then_kill_the_harness

    # The harness's kept writer, started with the writing function above (the writer is a
    # spawned process: it imports the function by name).
    traces._shared = traces.TraceWriter(keep=True, write=write_four_then_kill_the_harness)
    from experiments.harness.run import main
    sys.argv = ["experiments.run", *sys.argv[1:]]
    main()
    """
)


@pytest.mark.slow
def test_kill_9_while_writing_traces_then_resume_gives_one_trace_per_question(
    tmp_path: Path,
) -> None:
    args = [
        f"paths.corpus={FIXTURE_BOOKS}",
        f"paths.questions={FIXTURE_QUESTIONS}",
        f"paths.store={tmp_path / 'store'}",
        f"paths.journals={tmp_path / 'journals'}",
        f"paths.cache={tmp_path / 'cache.sqlite'}",
        f"tracking.uri=sqlite:///{tmp_path / 'mlruns.db'}",
        "retriever=wordllama",
        "experiment.progress=false",
        "experiment.ragas=false",
        "dataset=all",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = subprocess.run(
        [sys.executable, "-c", KILL_DURING_TRACES, *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert first.returncode == -signal.SIGKILL, first.stdout + first.stderr
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns.db'}")
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert run.info.status == "RUNNING"
    assert (
        len(
            mlflow.search_traces(
                locations=[run.info.experiment_id], run_id=run.info.run_id, return_type="list"
            )
        )
        == 4
    )

    second = subprocess.run(
        [sys.executable, "-m", "experiments.run", *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert second.returncode == 0, second.stdout + second.stderr
    resumed = re.search(rf"resuming run {run.info.run_id}: (\d+) of 9", second.stdout)
    assert resumed is not None, second.stdout
    assert int(resumed.group(1)) >= 6  # journaled questions whose trace was not written
    assert "traces incomplete" not in second.stderr  # the writer wrote them
    finished = mlflow.get_run(run.info.run_id)
    assert finished.info.status == "FINISHED"
    traces = mlflow.search_traces(
        locations=[run.info.experiment_id], run_id=run.info.run_id, return_type="list"
    )
    cases = [t.info.tags["caprag.case"] for t in traces]
    assert len(cases) == len(set(cases)) == int(finished.data.metrics["questions"]) == 9


def test_a_plain_text_call_retries_an_unreadable_reply() -> None:
    from caprag.steps.rewrite import REWRITE

    with StubServer([{"empty_choices": True}], default={"content": "standalone"}) as stub:
        llm = build_openai_client("m", api_key="k", base_url=stub.base_url, max_retries=0)
        text, _usage = asyncio.run(llm.text("rewrite", REWRITE, question="q", history="h"))
    assert text == "standalone"
    assert stub.requests == 2


def test_a_hung_endpoint_answers_504_from_the_api_within_the_configured_bound(
    fixture_index: PassageIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe: a hung endpoint held an API request 243 s (60 s x 4 attempts + backoff)."""
    from fastapi.testclient import TestClient

    from caprag.config import load_settings
    from caprag.serve.api import create_app
    from caprag.serve.services import steps_from_settings

    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("CAPRAG_LLM_TIMEOUT_S", "0.5")
    with StubServer(default={"hang": True}) as stub:
        steps = steps_from_settings(load_settings(llm="openai", openai_base_url=stub.base_url))
        app = create_app(Pipeline(STRATEGIES["single"](fixture_index, steps, k=2), steps))
        with TestClient(app, base_url="http://127.0.0.1") as client:
            reply = client.post("/api/ask", json={"question": "What does Rapid Strike do?"})
    assert reply.status_code == 504
    assert "did not finish within 0.5 s" in reply.json()["error"]
