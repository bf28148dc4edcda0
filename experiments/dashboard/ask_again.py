"""Ask a logged question again from its trace with another strategy, retriever, k or step
implementations, and show the new trace beside the original."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from typing import Any

import streamlit as st

from caprag.config import Settings, load_settings
from caprag.errors import CapragError
from caprag.retrieval.retrievers import RETRIEVERS
from caprag.schemas import Document
from caprag.serve.services import AskResult, Pipeline, build_pipeline
from caprag.steps import CHOICES, ROLES
from caprag.strategies import STRATEGIES
from experiments.dashboard.trace_view import render_trace, row_of_answer
from experiments.results.row import QuestionRow
from experiments.scoring.failures import Corpus

TIMEOUT_S = 300
AGAIN = "ask_again_result"
"""Session key: (run id, question id, settings caption, the new row)."""


@st.cache_resource(show_spinner="Building the pipeline (indexing new books on first use)…")
def pipeline(key: str, _settings: Settings) -> tuple[Pipeline, dict[str, str]]:
    """The pipeline for the settings (`key`: them as JSON), and each passage's section title."""
    built = build_pipeline(_settings)
    parents: dict[str, Document] = getattr(built.strategy.retriever, "parents", dict)()
    return built, {pid: doc.section for pid, doc in parents.items()}


@st.cache_resource
def event_loop() -> asyncio.AbstractEventLoop:
    """One loop for every question asked again (cached clients stay bound to it)."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True, name="caprag-ask-again").start()
    return loop


def ask(built: Pipeline, question: str) -> AskResult:
    """The question on a fresh thread (no conversation before it), waited for."""
    coroutine = built.ask(question, uuid.uuid4().hex, None)
    return asyncio.run_coroutine_threadsafe(coroutine, event_loop()).result(timeout=TIMEOUT_S)


def default_k() -> int:
    """The serving k (CAPRAG_K), or 8 when the settings do not load (their error shows on Ask)."""
    try:
        return load_settings().k
    except CapragError:
        return 8


def again_row(result: AskResult, sections: dict[str, str], original: QuestionRow) -> QuestionRow:
    """The new answer as a row carrying the original's gold, so both traces mark the same gold."""
    row = row_of_answer(result, sections)
    row.gold_ids, row.gold_answer = list(original.gold_ids), original.gold_answer
    row.question_id = original.question_id
    return row


def gold_line(row: QuestionRow) -> str:
    """'gold passages in context: 1/2 · retrieved: 2/2' (nothing for a question without gold)."""
    if not row.gold_ids:
        return "no gold passage (unanswerable)"
    found = set(row.retrieved_ids())
    handed = sum(g in row.context_ids for g in row.gold_ids)
    retrieved = sum(g in found for g in row.gold_ids)
    total = len(row.gold_ids)
    return f"gold passages in context: {handed}/{total} · retrieved by any hop: {retrieved}/{total}"


def render_ask_again(run: Any, row: QuestionRow) -> QuestionRow | None:
    """The form; returns the row asked again for this run's question (this session), if any."""
    run_id = str(run["run_id"])
    with st.expander("Ask again with other settings"):
        a, b, c = st.columns(3)
        strategies = sorted(STRATEGIES)
        logged = str(run.get("strategy", ""))
        strategy = a.selectbox(
            "Strategy",
            strategies,
            index=strategies.index(logged) if logged in strategies else 0,
            key="again_strategy",
        )
        retrievers = list(RETRIEVERS)
        default = os.environ.get("CAPRAG_RETRIEVER", "dense")
        retriever = b.selectbox(
            "Retriever",
            retrievers,
            index=retrievers.index(default) if default in retrievers else 0,
            key="again_retriever",
        )
        k = int(
            c.number_input(
                "k (passages handed to generation)", 1, 100, default_k(), key="again_k",
                help="Preselected: the serving default (CAPRAG_K)",
            )
        )  # fmt: skip
        backends = ["offline", "openai"] if os.environ.get("OPENAI_API_KEY") else ["offline"]
        llm = st.radio(
            "LLM backend", backends, horizontal=True, key="again_llm",
            help="openai is offered when OPENAI_API_KEY is set",
        )  # fmt: skip
        columns = st.columns(3)
        steps = {
            role: columns[i % 3].selectbox(role, CHOICES, key=f"again_step_{role}")
            for i, role in enumerate(ROLES)
        }
        if st.button("Ask again", key="again_go", type="primary"):
            try:
                settings = load_settings(
                    retrieval_strategy=strategy, retriever=retriever, k=k, llm=llm, **steps
                )
                key = settings.model_dump_json(exclude={"openai_api_key"})
                built, sections = pipeline(key, settings)
                with st.spinner("Answering…"):
                    result = ask(built, row.main_question or row.question)
            except CapragError as exc:
                st.error(f"{type(exc).__name__}: {exc}")
            except TimeoutError:
                st.error(f"No answer within {TIMEOUT_S} s.")
            else:
                chosen = ", ".join(f"{r}={v}" for r, v in steps.items() if v != "auto")
                caption = f"{strategy} · {retriever} · k={k}" + (f" · {chosen}" if chosen else "")
                new = again_row(result, sections, row)
                st.session_state[AGAIN] = (run_id, row.question_id, caption, new)
    stored = st.session_state.get(AGAIN)
    if stored and stored[0] == run_id and stored[1] == row.question_id:
        return stored[3]
    return None


def render_beside(
    run: Any, row: QuestionRow, new: QuestionRow, corpus: Corpus | None = None
) -> None:
    """The original trace and the one asked again, side by side."""
    caption = st.session_state[AGAIN][2]
    left, right = st.columns(2)
    with left:
        st.markdown(f"#### Original · {run['strategy']} (run {str(run['run_id'])[:8]})")
        st.caption(gold_line(row))
        render_trace(row, corpus)
    with right:
        st.markdown(f"#### Asked again · {caption}")
        st.caption(gold_line(new))
        render_trace(new, corpus)
