"""The chat page shows a thread's whole conversation from its memory: `GET /?thread_id=`."""

from __future__ import annotations

import contextlib
import re
import uuid
from pathlib import Path

import pytest

from caprag.retrieval.store import PassageIndex
from caprag.serve.api import create_app
from caprag.serve.checkpoint import make_checkpointer
from caprag.serve.services import Pipeline
from caprag.steps import rule_steps
from caprag.strategies import SingleQueryStrategy
from tests.reliability.test_serving import api

FIRST = "What does Old Soldier cost?"
FOLLOW_UP = "What penalty does it halve?"


def offline(index: PassageIndex, spec: str) -> Pipeline:
    steps = rule_steps()
    return Pipeline(
        SingleQueryStrategy(index, steps, k=2), steps, checkpointer=make_checkpointer(spec)
    )


def turns_on(html: str) -> list[str]:
    """The text of each turn shown in the page's conversation, tags removed."""
    found = re.findall(r'<div class="turn past">(.*?)</div></div>', html)
    return [re.sub(r"<[^>]+>", " ", t) for t in found]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_the_page_of_a_thread_shows_every_turn_with_what_it_searched_as(
    kind: str, fixture_index: PassageIndex, tmp_path: Path
) -> None:
    spec = "memory" if kind == "memory" else f"sqlite:{tmp_path / 'chat.db'}"
    pipeline = offline(fixture_index, spec)
    thread = str(uuid.uuid4())
    async with api(create_app(pipeline)) as client, contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(pipeline.aclose)  # a SQLite store's thread would outlive pytest
        for question in (FIRST, FOLLOW_UP):
            answered = await client.post(
                "/api/ask", json={"question": question, "thread_id": thread}
            )
            assert answered.status_code == 200, answered.text
        page = await client.get("/", params={"thread_id": thread})
        other = await client.get("/", params={"thread_id": str(uuid.uuid4())})
        fresh = await client.get("/")
    assert page.status_code == 200
    first, second = turns_on(page.text)
    assert FIRST in first and f"searched as: {FIRST}" in first and "6 gift points" in first
    assert "Pebble Saga Gifts, p. 7 — Old Soldier" in first
    assert "searched as: What penalty does Old Soldier halve?" in second
    assert "second blow" in second
    assert f'const given = "{thread}";' in page.text
    assert turns_on(other.text) == []  # another thread: nothing of this one
    assert turns_on(fresh.text) == [] and 'const given = "";' in fresh.text


async def test_a_thread_id_that_is_not_a_uuid_is_a_422_naming_it(
    fixture_index: PassageIndex,
) -> None:
    async with api(create_app(offline(fixture_index, "memory"))) as client:
        page = await client.get("/", params={"thread_id": "../../etc/passwd"})
    assert page.status_code == 422
    assert page.json()["error"].startswith("query.thread_id: thread_id must be a UUID")


async def test_a_question_left_without_answer_shows_as_open(fixture_index: PassageIndex) -> None:
    from langchain_core.messages import HumanMessage

    pipeline = offline(fixture_index, "memory")
    thread = str(uuid.uuid4())
    await pipeline.ask(FIRST, thread)
    assert pipeline.graph is not None  # a failed generate leaves the question open like this:
    await pipeline.graph.aupdate_state(
        {"configurable": {"thread_id": thread}}, {"messages": [HumanMessage("And Night Eyes?")]}
    )
    async with api(create_app(pipeline)) as client:
        page = await client.get("/", params={"thread_id": thread})
    first, second = turns_on(page.text)
    assert "6 gift points" in first
    assert "And Night Eyes?" in second and "no answer was kept" in second
