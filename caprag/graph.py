"""The LangGraph pipeline: START → rewrite → retrieve → generate → END, with a checkpointer."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, RemoveMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph

from caprag.llm.client import StepFailedError
from caprag.schemas import AnswerWithSources, Source
from caprag.serve.checkpoint import make_checkpointer
from caprag.serve.conversation import turn_record
from caprag.state import GraphState
from caprag.steps import Steps
from caprag.strategies.base import RetrievalStrategy

HISTORY_PAIRS = 20


def history_pairs(
    messages: Sequence[AnyMessage], window: int = HISTORY_PAIRS
) -> list[tuple[str, str]]:
    """The last `window` completed question/answer pairs (the pending question excluded)."""
    pairs: list[tuple[str, str]] = []
    pending: str | None = None
    for message in messages:
        if isinstance(message, HumanMessage):
            pending = str(message.content)
        elif isinstance(message, AIMessage) and pending is not None:
            pairs.append((pending, str(message.content)))
            pending = None
    return pairs[-window:] if window else []


def trim_history(
    messages: Sequence[AnyMessage], window: int = HISTORY_PAIRS
) -> list[RemoveMessage]:
    """Removals that keep only what `history_pairs` can still show: the last `window` completed
    pairs and a trailing open question (so a thread's checkpointed memory stays bounded)."""
    keep: set[str | None] = set()
    index = len(messages) - 1
    if index >= 0 and isinstance(messages[index], HumanMessage):
        keep.add(messages[index].id)
        index -= 1
    pairs = 0
    while index >= 1 and pairs < window:
        answer, question = messages[index], messages[index - 1]
        if isinstance(answer, AIMessage) and isinstance(question, HumanMessage):
            keep |= {answer.id, question.id}
            pairs += 1
            index -= 2
        else:
            index -= 1
    return [RemoveMessage(id=m.id) for m in messages if m.id is not None and m.id not in keep]


def build_graph(
    strategy: RetrievalStrategy,
    steps: Steps,
    *,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
    history_window: int = HISTORY_PAIRS,
    rewrite_follow_ups: bool = True,
) -> Any:
    """Compile the graph; the strategy and steps are passed in, never read from global config."""

    async def rewrite(state: GraphState) -> dict[str, Any]:
        """Make the question standalone from the history; no LLM call without history."""
        start = time.perf_counter()
        history = history_pairs(state.messages[:-1], history_window)
        if not history or not rewrite_follow_ups:
            return {
                "main_question": state.question,
                "rewrite_usage": None,
                "timings": {"rewrite": time.perf_counter() - start},
            }
        result = await steps.rewrite(state.question, history)
        return {
            "main_question": result.value,
            "rewrite_usage": result.usage,
            "timings": {"rewrite": time.perf_counter() - start},
        }

    async def retrieve(state: GraphState) -> dict[str, Any]:
        """Run the selected retrieval strategy."""
        start = time.perf_counter()
        done = await strategy.execute(state)
        return {
            "questions": done.questions,
            "context": done.context,
            "hops": done.hops,
            "timings": {"retrieve": time.perf_counter() - start},
        }

    async def generate(state: GraphState) -> dict[str, Any]:
        """Answer from the context passages, citing them."""
        start = time.perf_counter()
        history = history_pairs(state.messages[:-1], history_window)
        try:
            last = state.hops[-1] if state.hops else None
            if last is not None and last.confidence is not None and last.threshold is not None:
                # adaptive rated its passages: the generator is told, and says when it is low
                result = await steps.generate(
                    state.main_question,
                    state.context,
                    history,
                    confidence=(last.confidence, last.threshold),
                )
            else:
                result = await steps.generate(state.main_question, state.context, history)
        except StepFailedError as failed:
            # No answer: the turn keeps what retrieval did and the failed call (the caller
            # reports it); nothing is added to the conversation, so the question stays open.
            return {
                "answer": AnswerWithSources(answer=""),
                "generate_usage": failed.usage,
                "messages": trim_history(state.messages, history_window),
                "timings": {"generate": time.perf_counter() - start},
            }
        by_id = {doc.passage_id: doc for doc in state.context}
        sources = [Source.of(by_id[i]) for i in result.value.source_ids if i in by_id]
        answer = AnswerWithSources(
            answer=result.value.answer, sources=sources, refused=result.value.refused
        )
        kept = turn_record(state.main_question, sources)  # shown again when a page reloads
        reply = AIMessage(answer.answer, id=str(uuid.uuid4()), additional_kwargs=kept)
        return {
            "answer": answer,
            "generate_usage": result.usage,
            "messages": [reply, *trim_history([*state.messages, reply], history_window)],
            "timings": {"generate": time.perf_counter() - start},
        }

    builder = StateGraph(GraphState)
    builder.add_node("rewrite", rewrite)
    builder.add_node("retrieve", retrieve)
    builder.add_node("generate", generate)
    builder.add_edge(START, "rewrite")
    builder.add_edge("rewrite", "retrieve")
    builder.add_edge("retrieve", "generate")
    builder.add_edge("generate", END)
    return builder.compile(
        checkpointer=checkpointer if checkpointer is not None else make_checkpointer("memory")
    )
