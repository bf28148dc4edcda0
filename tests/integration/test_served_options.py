"""The API serves a strategy with the options its own environment variables set (one name per
option of one strategy, `caprag.options`), says which on /health, and refuses a bad one in one
line before it opens the index."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from caprag.config import load_settings
from caprag.errors import ConfigError
from caprag.serve.api import create_app
from caprag.serve.services import build_pipeline
from tests.conftest import FIXTURE_BOOKS


def served(tmp_path: Path, strategy: str) -> dict[str, object]:
    settings = load_settings(
        retrieval_strategy=strategy,
        corpus=FIXTURE_BOOKS,
        chroma_dir=tmp_path / "store",
        decision_log="off",
        retriever="bm25",
    )
    with TestClient(create_app(build_pipeline(settings)), base_url="http://127.0.0.1") as client:
        health = client.get("/health")
        answered = client.post("/api/ask", json={"question": "What does Rapid Strike do?"})
    assert health.status_code == 200 and answered.status_code == 200, answered.text
    return dict(health.json())


def test_a_strategy_is_served_with_the_options_its_variables_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAPRAG_IRCOT_MAX_STEPS", "2")
    monkeypatch.setenv("CAPRAG_MULTI_HOP_MAX_HOPS", "5")  # multi-hop's: IRCoT does not read it
    health = served(tmp_path, "ircot")
    assert health["strategy"] == "ircot"
    assert health["options"] == {"max_steps": 2, "follow_k": 2, "reason_k": 5}


def test_a_bad_served_option_fails_in_one_line_before_the_index_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAPRAG_ITER_RETGEN_ROUNDS", "abc")
    settings = load_settings(
        retrieval_strategy="iter-retgen", corpus=FIXTURE_BOOKS, chroma_dir=tmp_path / "store"
    )
    with pytest.raises(ConfigError) as error:
        build_pipeline(settings)
    assert str(error.value) == (
        "CAPRAG_ITER_RETGEN_ROUNDS='abc' is not allowed: expected a whole number of at least 1 "
        "(retrieve-then-generate rounds, one search each)"
    )
    assert not (tmp_path / "store").exists()
