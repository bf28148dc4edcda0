"""Ask: answer questions live with a chosen strategy, LLM backend and rule or model per step; show
the whole conversation of the thread (each turn's question, what it was searched as, answer and
sources) and the latest turn's trace with the LLM calls it made.

The turns shown are the ones this browser session asked (kept in its session state, so a turn
keeps the strategy and settings it was asked with); the conversation's memory, which rewrites
follow-ups, is one in-memory store shared by every pipeline the page builds, so a thread goes on
when the strategy or backend changes between turns."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from typing import Any

import streamlit as st

from caprag.config import Settings, load_settings
from caprag.errors import CapragError
from caprag.registry import load_plugins
from caprag.retrieval.retrievers import RETRIEVERS
from caprag.schemas import Document
from caprag.serve.checkpoint import make_checkpointer
from caprag.serve.services import AskResult, Pipeline, build_pipeline, retention_from_settings
from caprag.steps import CHOICES, ROLES
from caprag.strategies import STRATEGIES
from caprag.trace import HopTrace
from experiments.dashboard.data import decision_log, decision_table
from experiments.dashboard.trace_view import render_trace, row_of_answer
from experiments.results.row import QuestionRow

DEFAULT_STRATEGY = "multi-hop"
ADAPTIVE = "adaptive"
POWERS = ["auto", "1", "2", "3"]
TIMEOUT_S = 300


def strategy_names() -> list[str]:
    """Every registered strategy, the default first."""
    return [DEFAULT_STRATEGY, *sorted(set(STRATEGIES) - {DEFAULT_STRATEGY})]


def retriever_label(name: str) -> str:
    """A retriever as the select box shows it: 'dense (embeddings)'."""
    return f"{name} ({RETRIEVERS[name].short})"


@st.cache_resource
def conversation_memory(_settings: Settings) -> Any:
    """One in-memory conversation store for every pipeline of the page (a thread continues when
    the strategy changes); a SQLite CAPRAG_CHECKPOINTER is shared through its file instead."""
    return make_checkpointer("memory", retention_from_settings(_settings))


@st.cache_resource(show_spinner="Building the pipeline (indexing new books on first use)…")
def pipeline(key: str, _settings: Settings) -> tuple[Pipeline, dict[str, str]]:
    """The pipeline for the settings (`key`: them as JSON), and each passage's section title."""
    shared = conversation_memory(_settings) if _settings.checkpointer == "memory" else None
    built = build_pipeline(_settings, checkpointer=shared)
    parents: dict[str, Document] = getattr(built.strategy.retriever, "parents", dict)()
    return built, {pid: doc.section for pid, doc in parents.items()}


@st.cache_resource
def event_loop() -> asyncio.AbstractEventLoop:
    """One loop for every question, so cached clients never outlive the loop they were bound to."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True, name="caprag-ask").start()
    return loop


def ask(built: Pipeline, question: str, thread: str, power: int | None = None) -> AskResult:
    """Run the async pipeline on the shared loop and wait for the answer."""
    future = asyncio.run_coroutine_threadsafe(built.ask(question, thread, power), event_loop())
    return future.result(timeout=TIMEOUT_S)


def forced_power(strategy: str, choice: str) -> int | None:
    """The depth to force for this question: None in auto mode and for other strategies."""
    return int(choice) if strategy == ADAPTIVE and choice != "auto" else None


def power_label(strategy: str, forced: int | None) -> str:
    """How the caption names the power an answer was asked with (nothing for other strategies)."""
    if strategy != ADAPTIVE:
        return ""
    return f" (power {forced}: forced depth)" if forced else " (power auto)"


def render_decision_log(hops: list[HopTrace], max_depth: int | None) -> None:
    """Adaptive answers: each round's depth, chunks, confidence, threshold and decision."""
    log = decision_log(hops)
    if log.empty:
        return
    st.subheader("Decision log")
    last = log.iloc[-1]
    reached = float(last["confidence"] or 0.0) >= float(last["threshold"] or 0.0)
    st.caption(
        f"{len(log)} round(s) · ended at depth {last['depth']}"
        f"{f' of {max_depth}' if max_depth else ''} with confidence "
        f"{float(last['confidence'] or 0.0):.0%} "
        f"({'at or above' if reached else 'below'} the {float(last['threshold'] or 0.0):.0%} "
        f"threshold) · decision `{last['decision']}`"
    )
    st.table(decision_table(log), hide_index=True)


def sources_text(result: AskResult) -> str:
    """A turn's sources as a markdown list: book, page, section."""
    lines = [f"- {s.book_title or s.book_id}, p. {s.page} — {s.section}" for s in result.sources]
    return "\n".join(lines) or "- none"


def render_turn(number: int, result: AskResult, caption: str) -> None:
    """One turn of the conversation: question, what it was searched as, answer, sources."""
    st.markdown(f"**Turn {number}:** {result.question}")
    st.caption(f"searched as: {result.main_question}")
    st.write(result.answer or "— (no answer)")
    if result.refused:
        st.caption("A refusal: the generator found no answer in the passages.")
    st.markdown("Sources:\n" + sources_text(result))
    st.caption(caption)


def step_choices(llm: str) -> dict[str, str]:
    """Rule, model or auto for each step role, chosen in a compact grid of select boxes."""
    columns = st.columns(3)
    chosen = {}
    for position, role in enumerate(ROLES):
        chosen[role] = columns[position % 3].selectbox(
            role,
            CHOICES,
            key=f"ask_step_{role}",
            format_func=lambda c: f"{c} (needs openai)" if c == "llm" and llm != "openai" else c,
            help=f"step `{ROLES[role]}`: auto = the model when the backend is openai, else the "
            "rule; rule = deterministic, no call; llm = the model",
        )
    return chosen


load_plugins()  # CAPRAG_PLUGINS: their retrievers and strategies are offered below
st.title("Ask")
backends = ["offline", "openai"] if os.environ.get("OPENAI_API_KEY") else ["offline"]
default_retriever = os.environ.get("CAPRAG_RETRIEVER", "dense")
left, middle, right = st.columns(3)
strategy = left.selectbox("Strategy", strategy_names(), key="ask_strategy")
retrievers = list(RETRIEVERS)
retriever = middle.selectbox(
    "Retriever",
    retrievers,
    index=retrievers.index(default_retriever) if default_retriever in RETRIEVERS else 0,
    key="ask_retriever",
    format_func=retriever_label,
    help="; ".join(f"{name}: {kind.description}" for name, kind in RETRIEVERS.items())
    + ". A retriever not used before indexes the books on first use.",
)
llm = right.selectbox(
    "LLM backend", backends, key="ask_llm", help="openai is offered when OPENAI_API_KEY is set"
)
with st.expander("Steps: rule or model for each"):
    steps = step_choices(llm)
settings: Settings | None = None
try:
    settings = load_settings(retrieval_strategy=strategy, retriever=retriever, llm=llm, **steps)
except CapragError as exc:
    st.error(f"{type(exc).__name__}: {exc}")
    if llm != "openai" and "llm" in steps.values():
        st.caption(
            "Here: choose the openai LLM backend (offered when OPENAI_API_KEY is set), or auto or "
            "rule for the step, under Steps."
        )
default_power = str(settings.power) if settings is not None else "2"
power_choice = st.radio(
    "Power (adaptive strategy only)",
    POWERS,
    index=POWERS.index(default_power),
    horizontal=True,
    key="ask_power",
    disabled=strategy != ADAPTIVE,
    help="auto: the strategy picks the depth per question and goes deeper while its confidence "
    "is below the question type's threshold; 1-3 force that depth for this question. "
    f"Preselected: {default_power}, the serving default (CAPRAG_POWER).",
)
question = st.text_area("Question", key="ask_question", placeholder="What does … cost at level 3?")
go, fresh = st.columns([1, 5])
if fresh.button(
    "New conversation", key="ask_new", help="Forget earlier turns (follow-ups are rewritten)"
):
    st.session_state.pop("ask_thread", None)
    st.session_state.pop("ask_result", None)
    st.session_state.pop("ask_turns", None)
    st.session_state.pop("ask_steps", None)
if go.button("Ask", type="primary", key="ask_go", disabled=settings is None):
    assert settings is not None
    thread = st.session_state.setdefault("ask_thread", uuid.uuid4().hex)
    try:
        built, sections = pipeline(settings.model_dump_json(exclude={"openai_api_key"}), settings)
        with st.spinner("Answering…"):
            forced = forced_power(strategy, power_choice)
            result = ask(built, question, thread, forced)
        view = row_of_answer(result, sections)
        st.session_state["ask_result"] = (view, result)
        st.session_state["ask_used_power"] = power_label(strategy, forced)
        budget = getattr(built.strategy, "budget", None)  # the adaptive strategy's budgets
        st.session_state["ask_max_depth"] = getattr(budget, "max_depth", None)
        st.session_state["ask_steps"] = built.steps.describe()
        st.session_state["ask_used_retriever"] = retriever
        caption = (
            f"{result.strategy}{st.session_state['ask_used_power']} · {result.hop_count} hop(s) · "
            f"{retriever} retriever · {result.prompt_tokens} prompt + {result.completion_tokens} "
            f"completion tokens · {result.cost_text} · {result.latency_s:.2f} s · "
            f"steps chosen: {st.session_state['ask_steps']}"
        )
        st.session_state.setdefault("ask_turns", []).append((result, caption))
    except CapragError as exc:
        st.error(f"{type(exc).__name__}: {exc}")
    except TimeoutError:
        st.error(f"No answer within {TIMEOUT_S} s.")
stored: tuple[QuestionRow, AskResult] | None = st.session_state.get("ask_result")
turns: list[tuple[AskResult, str]] = st.session_state.get("ask_turns", [])
if stored is None or not turns:
    st.info("Type a question and press Ask. The offline backend needs no key.")
else:
    view, result = stored
    st.subheader(f"Conversation · {len(turns)} turn(s)")
    st.caption(
        f"thread {st.session_state.get('ask_thread', '?')} · follow-ups are rewritten into a "
        "standalone question from the earlier turns (shown as “searched as”)"
    )
    for number, (earlier, caption) in enumerate(turns[:-1], start=1):
        with st.container(border=True):
            render_turn(number, earlier, caption)
    with st.container(border=True):
        render_turn(len(turns), result, turns[-1][1])
    st.subheader(f"Trace of turn {len(turns)}")
    render_decision_log(view.hops, st.session_state.get("ask_max_depth"))
    render_trace(view)
