"""Asking questions: build the pipeline from settings, run one turn, report what it cost."""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from pydantic import BaseModel, Field

from caprag.checkpoint import close_checkpointer, make_checkpointer
from caprag.config import ROLE_NAMES, Settings, load_settings
from caprag.errors import EmptyQuestionError
from caprag.graph import HISTORY_PAIRS, build_graph
from caprag.llm import StructuredClient, build_openai_client
from caprag.schemas import CallUsage, Document, Source
from caprag.state import GraphState
from caprag.steps import Steps, build_steps
from caprag.strategies import STRATEGIES, RetrievalStrategy, Retriever
from caprag.trace import HopTrace

MAX_QUESTION_CHARS = 4000

STRATEGY_OPTIONS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "multi-hop": lambda s: {"max_hops": s.max_hops, "expand_first_hop": s.expand_first_hop},
}


class AskResult(BaseModel):
    """One answered turn, with everything a caller shows or logs."""

    question: str
    main_question: str
    answer: str
    sources: list[Source]
    thread_id: str
    strategy: str
    hops: list[HopTrace]
    context: list[Document] = Field(description="The passages handed to generation.")
    usage: list[CallUsage] = Field(description="Every LLM call of the turn, in order.")
    timings: dict[str, float] = Field(default_factory=dict, description="Seconds per node.")
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    latency_s: float

    @property
    def answer_error(self) -> str | None:
        """Why there is no answer, when the generator's reply could not be used."""
        failed = [u for u in self.usage if u.step == "generate" and u.error]
        return f"generate: {failed[-1].error}" if failed else None

    @property
    def hop_count(self) -> int:
        """How many retrieval hops the turn took."""
        return len(self.hops)


def validate_question(question: str) -> str:
    """Reject empty and over-long questions before any work is done."""
    text = (question or "").strip()
    if not text:
        raise EmptyQuestionError("the question is empty")
    if len(text) > MAX_QUESTION_CHARS:
        raise EmptyQuestionError(
            f"the question has {len(text)} characters; the limit is {MAX_QUESTION_CHARS}"
        )
    return text


def _client(settings: Settings, model: str) -> StructuredClient:
    return build_openai_client(
        model,
        api_key=settings.openai_api_key,
        base_url=settings.openai_base_url,
        structured_method=settings.structured_output,
    )


def steps_from_settings(settings: Settings) -> Steps:
    """The steps the settings choose: CAPRAG_LLM=openai gives them a client, and each
    CAPRAG_<ROLE> (expander, analyzer, ...) picks rule or llm for its step (auto: llm when there
    is a client)."""
    client = _client(settings, settings.model) if settings.llm == "openai" else None
    rewrite = settings.rewrite_model
    rewrite_client = (
        _client(settings, rewrite)
        if client is not None and rewrite and rewrite != settings.model
        else None
    )
    return build_steps(
        client,
        rewrite_client=rewrite_client,
        price_model=settings.price_model,
        choices={role: getattr(settings, role) for role in ROLE_NAMES},
    )


def build_strategy(
    name: str, retriever: Retriever, steps: Steps, settings: Settings
) -> RetrievalStrategy:
    """The strategy the name selects, with its dependencies passed in."""
    options = STRATEGY_OPTIONS.get(name, lambda _s: {})(settings)
    return STRATEGIES[name](retriever, steps, k=settings.k, **options)


class Pipeline:
    """A compiled graph and the pieces it was built from."""

    def __init__(
        self,
        strategy: RetrievalStrategy,
        steps: Steps,
        graph: Any | None = None,
        *,
        checkpointer: BaseCheckpointSaver[Any] | None = None,
        rewrite_follow_ups: bool = True,
        history_window: int = HISTORY_PAIRS,
    ) -> None:
        self.strategy = strategy
        self.steps = steps
        self.checkpointer = checkpointer or make_checkpointer("memory")
        self.graph = (
            graph
            if graph is not None
            else build_graph(
                strategy,
                steps,
                checkpointer=self.checkpointer,
                rewrite_follow_ups=rewrite_follow_ups,
                history_window=history_window,
            )
        )

    async def aclose(self) -> None:
        """Release the checkpointer's connection, if it has one."""
        await close_checkpointer(self.checkpointer)

    async def ask(
        self, question: str, thread_id: str | None = None, power: int | None = None
    ) -> AskResult:
        """Answer one turn on a thread (a new thread when none is given); `power` forces the
        retrieval depth of strategies that have one (adaptive) for this turn only."""
        text = validate_question(question)
        thread = thread_id or str(uuid.uuid4())
        start = time.perf_counter()
        out = await self.graph.ainvoke(
            {"question": text, "messages": [HumanMessage(text)], "power": power},
            {"configurable": {"thread_id": thread}},
        )
        state = GraphState(**out)
        usage = [u for u in (state.rewrite_usage,) if u]
        usage += [u for hop in state.hops for u in hop.usage]
        usage += [u for u in (state.generate_usage,) if u]
        assert state.answer is not None
        return AskResult(
            question=text,
            main_question=state.main_question,
            answer=state.answer.answer,
            sources=state.answer.sources,
            thread_id=thread,
            strategy=self.strategy.name,
            hops=state.hops,
            context=state.context,
            usage=usage,
            timings=state.timings,
            prompt_tokens=sum(u.prompt_tokens for u in usage),
            completion_tokens=sum(u.completion_tokens for u in usage),
            cost_usd=sum(u.cost_usd for u in usage),
            latency_s=time.perf_counter() - start,
        )


def build_pipeline(settings: Settings | None = None, *, ingest: bool = True) -> Pipeline:
    """Open (and bring up to date) the index, then build LLM, strategy and graph from settings."""
    from caprag.ingest import ingest_path, open_index

    settings = settings or load_settings()
    steps = steps_from_settings(settings)
    if ingest:
        ingest_path(settings.corpus, settings)
    index = open_index(settings)
    strategy = build_strategy(settings.retrieval_strategy, index, steps, settings)
    return Pipeline(strategy, steps, checkpointer=make_checkpointer(settings.checkpointer))


@functools.cache
def default_pipeline() -> Pipeline:
    """The process-wide pipeline built from the environment."""
    return build_pipeline()


async def ask_question(
    question: str, thread_id: str | None = None, power: int | None = None
) -> AskResult:
    """Answer a question with the pipeline the environment configures."""
    validate_question(question)
    return await default_pipeline().ask(question, thread_id, power)
