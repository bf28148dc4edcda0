"""The offline backend: deterministic and needs no network."""

from __future__ import annotations

import socket

import pytest

from caprag.serve.services import Pipeline
from caprag.steps import rule_steps
from caprag.steps.generate import extract_answer
from caprag.steps.rewrite import rewrite_with_history
from caprag.strategies import STRATEGIES
from caprag.text import DEFAULT_REFUSAL
from tests.fakes import MemoryRetriever


async def run_all(index: MemoryRetriever, question: str) -> list[object]:
    outputs: list[object] = []
    for name in sorted(STRATEGIES):
        llm = rule_steps()
        result = await Pipeline(STRATEGIES[name](index, llm, k=3), llm).ask(question, "t")
        outputs.append(
            (
                result.answer,
                [s.passage_id for s in result.sources],
                [h.model_dump(exclude={"latency_s", "usage"}) for h in result.hops],
                result.prompt_tokens,
                result.completion_tokens,
            )
        )
    return outputs


async def test_same_input_same_output(books: MemoryRetriever) -> None:
    question = "What penalty does the second attack of a Flurry suffer?"
    assert await run_all(books, question) == await run_all(books, question)


async def test_runs_with_the_network_unreachable(
    books: MemoryRetriever, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("network disabled by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    outputs = await run_all(books, "How many stamina points does a short rest restore?")
    assert all("3 stamina points" in str(o) for o in outputs)


def test_refuses_when_nothing_matches(books: MemoryRetriever) -> None:
    docs = books.search("What is the capital of the moon kingdom?", 3)
    refused = extract_answer("What is the capital of the moon kingdom?", docs)
    assert (refused.answer, refused.refused) == (DEFAULT_REFUSAL, True)
    worded = extract_answer("What is the capital of the moon kingdom?", docs, "Not in the books.")
    assert (worded.answer, worded.refused) == ("Not in the books.", True)
    asked = "How many stamina points does a short rest restore?"
    assert not extract_answer(asked, books.search(asked, 3)).refused


def test_rewrite_resolves_a_pronoun_from_history() -> None:
    history = [("What does Old Soldier cost?", "6 gift points.")]
    assert rewrite_with_history("What does it halve?", history) == "What does Old Soldier halve?"
    assert rewrite_with_history("What does it halve?", []) == "What does it halve?"
