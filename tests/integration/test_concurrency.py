"""A run asks and answers the same at any number of questions in flight: `llm=openai` against the
OpenAI-protocol stub on 127.0.0.1, through run(cfg), at concurrency 1, 16 and 64."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir

from caprag.config import PROJECT_ROOT
from experiments.harness.run import run
from experiments.perf.openai_stub import StubServer

CONF = PROJECT_ROOT / "conf"
TIMING = {"latency_s", "timings", "started_ns", "started_at"}
"""Fields that hold times: the only ones allowed to differ between the runs."""


def untimed(value: Any) -> Any:
    """The value with every timing field left out, at any depth."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def answered(tmp: Path, concurrency: int) -> tuple[list[Any], list[str], int]:
    """Rows (untimed), request bodies (sorted) and the most requests in flight at once."""
    hold = concurrency if concurrency > 1 else 0  # held until that many are in flight at once
    with StubServer(hold_until=hold, hold_s=120) as stub:
        overrides = [
            f"paths.store={tmp / 'store'}",
            f"paths.journals={tmp / f'journals-{concurrency}'}",
            f"paths.cache={tmp / 'llm-cache.sqlite'}",
            "tracking.enabled=false",
            "experiment.progress=false",
            "experiment.resume=never",
            "experiment.cache=false",
            "llm=openai",
            f"llm.client.base_url={stub.base_url}",
            "llm.client.api_key_env=CAPRAG_TEST_KEY",
            "retriever=wordllama",
            "dataset=curated",
            "experiment.limit_per_set=40",
            f"experiment.concurrency={concurrency}",
        ]
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
        result = run(cfg)
        bodies = sorted(json.dumps(body, sort_keys=True) for body in stub.bodies)
        return (
            [untimed(row.model_dump(mode="json")) for row in result.rows],
            bodies,
            stub.max_in_flight,
        )


def test_rows_and_requests_are_the_same_at_1_16_and_64_in_flight(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("CAPRAG_TEST_KEY", "test-key")
    one, one_sent, _ = answered(tmp_path, 1)
    assert len(one) == 80 and all(row["status"] == "ok" for row in one)
    assert len(one_sent) >= 2 * len(one)  # an analysis and an answer per question at least
    for level in (16, 64):
        rows, sent, in_flight = answered(tmp_path, level)
        assert in_flight >= level, f"never {level} requests in flight at once"
        assert sent == one_sent
        assert rows == one
