"""The Ask page offers a retriever and a strategy a plugin registered (CAPRAG_PLUGINS), beside the
built-in ones, and answers with them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_BOOKS
from tests.dashboard.test_app import PAGES, open_page, texts
from tests.integration.test_plugins import plugin_unloaded_after


@pytest.fixture
def plugin_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """CAPRAG_PLUGINS names the toy plugin; the page imports it, and no later test sees it."""
    monkeypatch.setenv("CAPRAG_PLUGINS", "tests.toy_plugin")
    monkeypatch.setenv("CAPRAG_CORPUS", str(FIXTURE_BOOKS))
    monkeypatch.setenv("CAPRAG_CHROMA_DIR", str(tmp_path / "chroma"))
    with plugin_unloaded_after():
        yield


@pytest.mark.usefixtures("plugin_env")
def test_ask_page_offers_and_uses_a_plugins_retriever_and_strategy(
    empty_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = open_page(PAGES[3], empty_store, monkeypatch)
    retrievers = at.selectbox(key="ask_retriever")
    shown = ["dense (embeddings)", "bm25 (lexical)", "hybrid (RRF)", "toy (keywords)"]
    assert retrievers.options == shown  # as the select box shows them
    assert "toy: query words a passage has, in memory" in str(retrievers.help)
    strategies = at.selectbox(key="ask_strategy").options
    assert strategies[0] == "multi-hop" and {"single", "adaptive", "toy-keywords"} <= set(
        strategies
    )
    at.selectbox(key="ask_retriever").set_value("toy")
    at.selectbox(key="ask_strategy").set_value("toy-keywords")
    at.text_area(key="ask_question").set_value("How long does a torch burn?")
    at.button(key="ask_go").click().run(timeout=180)
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "toy-keywords · 1 hop(s) · toy retriever" in texts(at)
    assert "A torch burns for one hour" in texts(at)
