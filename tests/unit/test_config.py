"""Settings: strategy choice and validation at start-up."""

from __future__ import annotations

import pytest

from caprag.config import load_settings
from caprag.errors import ConfigError, MissingAPIKeyError
from caprag.serve.services import build_strategy, steps_from_settings
from caprag.strategies import STRATEGIES, MultiHopStrategy, MultiQuestionStrategy
from caprag.strategies.base import Retriever


class NoRetriever:
    def search(self, query: str, k: int) -> list:  # type: ignore[type-arg]
        return []


def strategy_for_env() -> object:
    settings = load_settings()
    retriever: Retriever = NoRetriever()
    return build_strategy(
        settings.retrieval_strategy, retriever, steps_from_settings(settings), settings
    )


def test_unset_strategy_is_multi_hop() -> None:
    assert isinstance(strategy_for_env(), MultiHopStrategy)


def test_multi_question_env_selects_multi_question(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRIEVAL_STRATEGY", "multi-question")
    assert isinstance(strategy_for_env(), MultiQuestionStrategy)


def test_invalid_strategy_fails_naming_allowed_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRIEVAL_STRATEGY", "invalid-value")
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert "RETRIEVAL_STRATEGY='invalid-value'" in message
    for name in ("multi-hop", "multi-question", "single"):
        assert f"'{name}'" in message


def test_the_allowed_strategies_are_the_registered_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRIEVAL_STRATEGY", "invalid-value")
    with pytest.raises(ConfigError) as info:
        load_settings()
    allowed = str(info.value).split("Input should be ", 1)[1]
    assert allowed == STRATEGIES.allowed()
    for name in STRATEGIES:
        monkeypatch.setenv("RETRIEVAL_STRATEGY", name)
        assert load_settings().retrieval_strategy == name


def test_offline_is_the_default_backend() -> None:
    steps = steps_from_settings(load_settings())
    assert steps.backend == "offline"
    assert set(steps.kinds().values()) == {"rule"}


def test_openai_without_key_is_refused_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPRAG_LLM", "openai")
    with pytest.raises(MissingAPIKeyError, match="OPENAI_API_KEY"):
        load_settings()


def test_bad_k_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPRAG_K", "0")
    with pytest.raises(ConfigError, match="CAPRAG_K='0'"):
        load_settings()
