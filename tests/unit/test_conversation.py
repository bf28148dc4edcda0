"""Conversation memory: rewrite from the windowed history, threads kept apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from caprag.errors import ConfigError
from caprag.graph import HISTORY_PAIRS
from caprag.serve.checkpoint import make_checkpointer
from caprag.serve.services import Pipeline
from caprag.steps import rule_steps
from caprag.strategies import SingleQueryStrategy
from tests.fakes import MemoryRetriever, ScriptedChatModel, scripted_steps


def offline(index: MemoryRetriever, **kwargs: object) -> Pipeline:
    llm = rule_steps()
    return Pipeline(SingleQueryStrategy(index, llm, k=2), llm, **kwargs)  # type: ignore[arg-type]


async def test_follow_up_pronoun_is_resolved_and_the_right_passage_found(
    books: MemoryRetriever,
) -> None:
    pipeline = offline(books)
    first = await pipeline.ask("What does Old Soldier cost?", "t1")
    assert "6 gift points" in first.answer
    second = await pipeline.ask("What penalty does it halve?", "t1")
    assert second.main_question == "What penalty does Old Soldier halve?"
    assert second.context[0].passage_id == "gifts/old-soldier"
    assert second.usage[0].step == "rewrite"


async def test_without_rewrite_the_follow_up_searches_as_asked(
    books: MemoryRetriever,
) -> None:
    pipeline = offline(books, rewrite_follow_ups=False)
    await pipeline.ask("What does Old Soldier cost?", "t1")
    second = await pipeline.ask("What penalty does it halve?", "t1")
    assert second.main_question == "What penalty does it halve?"
    assert all(u.step != "rewrite" for u in second.usage)


def scripted_pipeline(index: MemoryRetriever, chat: ScriptedChatModel) -> Pipeline:
    llm = scripted_steps(chat)
    return Pipeline(SingleQueryStrategy(index, llm, k=2), llm)


async def test_rewrite_prompt_holds_exactly_the_last_20_pairs(books: MemoryRetriever) -> None:
    generate = {"answer": "noted", "source_ids": []}
    chat = ScriptedChatModel(
        by_substring={"Answer the question": generate, "standalone question": "rewritten q"}
    )
    pipeline = scripted_pipeline(books, chat)
    for n in range(1, 26):
        await pipeline.ask(f"question number {n:02d}?", "long")
    rewrites = [c for c in chat.calls if "standalone question" in str(c[0].content)]
    assert len(rewrites) == 24  # every turn after the first
    await pipeline.ask("and the next one?", "long")
    last = str(chat.calls[-2][1].content)  # the rewrite of turn 26 (generate is the last call)
    assert "standalone question" in str(chat.calls[-2][0].content)
    shown = [n for n in range(1, 26) if f"question number {n:02d}?" in last]
    assert shown == list(range(6, 26))
    assert len(shown) == HISTORY_PAIRS
    assert "Follow-up question: and the next one?" in last


async def test_first_question_makes_no_rewrite_call(books: MemoryRetriever) -> None:
    chat = ScriptedChatModel(replies=[{"answer": "one hour", "source_ids": ["basics/torches"]}])
    result = await scripted_pipeline(books, chat).ask("How long does a torch burn?")
    assert len(chat.calls) == 1 and "Answer the question" in str(chat.calls[0][0].content)
    assert result.main_question == "How long does a torch burn?"
    assert all(u.step != "rewrite" for u in result.usage)


async def test_threads_never_see_each_other(books: MemoryRetriever) -> None:
    pipeline = offline(books)
    await pipeline.ask("What does Old Soldier cost?", "a")
    await pipeline.ask("How long does a Torch burn?", "b")
    a = await pipeline.ask("What does it halve?", "a")
    b = await pipeline.ask("Is it wet-proof?", "b")
    assert "Old Soldier" in a.main_question and "Torch" not in a.main_question
    assert "Torch" in b.main_question and "Old Soldier" not in b.main_question
    fresh = await pipeline.ask("What does it halve?", "c")
    assert fresh.main_question == "What does it halve?"


async def test_sqlite_checkpointer_keeps_conversations_across_pipelines(
    books: MemoryRetriever, tmp_path: Path
) -> None:
    spec = f"sqlite:{tmp_path / 'chat.db'}"
    first = offline(books, checkpointer=make_checkpointer(spec))
    await first.ask("What does Old Soldier cost?", "kept")
    await first.aclose()
    second = offline(books, checkpointer=make_checkpointer(spec))
    result = await second.ask("What penalty does it halve?", "kept")
    await second.aclose()
    assert result.main_question == "What penalty does Old Soldier halve?"


def test_unknown_checkpointer_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="allowed: memory, sqlite:PATH"):
        make_checkpointer("redis://x")
