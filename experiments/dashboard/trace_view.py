"""The hop-by-hop trace of one question, shared by the Trace viewer and Ask pages."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

import pandas as pd
import streamlit as st

from caprag.services import AskResult
from experiments.dashboard.data import TraceView, call_line, hop_documents, is_rule, steps_ran
from experiments.harness.evaluate import trace_of
from experiments.results import metrics as registry
from experiments.results.traces import case_key, passage_texts, trace_id_of
from experiments.scoring.failures import failure_tags


def trace_id(run_id: str, row: Mapping[str, Any]) -> str:
    """The MLflow id of the trace a run wrote for a logged question row."""
    repeat = row.get("repeat")
    repeat = int(repeat) if repeat is not None and not pd.isna(repeat) else 0
    return trace_id_of(run_id, case_key(repeat, str(row.get("question_id", ""))))


def render_scores(row: Mapping[str, Any]) -> None:
    """A logged question's scores and failure tags, above its trace: how it did, and what the
    trace says went wrong (`experiments.scoring.failures`)."""
    scores = []
    for metric in registry.per_question():
        if not (metric.headline or metric.group == "answer"):
            continue  # the main metrics, and the answer's (refusals: an unanswerable's score)
        value = row.get(metric.name)
        if value is None or isinstance(value, str) or pd.isna(value):
            continue
        scores.append(f"{metric.heading} **{metric.display(float(value))}**")
    st.markdown("**Scores:** " + (" · ".join(scores) or "none recorded"))
    tags = failure_tags(row)
    if tags:
        st.warning("**Failure tags:** " + ", ".join(tags))
    else:
        st.caption("Failure tags: none")


def trace_from_result(result: AskResult, sections: dict[str, str]) -> TraceView:
    """A live answer in the same shape as a logged row (no gold: it was not in a question set);
    its documents carry the text of the passages handed to generation."""
    sections = {**sections, **{d.passage_id: d.section for d in result.context}}
    return TraceView(
        question=result.question,
        main_question=result.main_question,
        hops=trace_of(result, sections, []),
        answer=result.answer,
        context_ids=[d.passage_id for d in result.context],
        sections=sections,
        calls=[usage.model_dump(mode="json") for usage in result.usage],
    )


def render_trace(view: TraceView) -> None:
    """Question, each hop, then the answer with its sources beside the gold answer."""
    st.markdown(f"**Question:** {view.question}")
    if view.main_question and view.main_question.strip() != view.question.strip():
        st.markdown(f"**Rewritten as:** {view.main_question}")
    if view.status != "ok":
        st.error(f"This question failed: {view.error or view.status}")
    render_calls(view.calls)
    if not view.hops:
        st.info("No hop trace was recorded for this question.")
    pages: dict[str, Any] = {}
    texts = passage_texts(view.hops)
    for hop in view.hops:
        _render_hop(hop, view.sections, graded=bool(view.gold_ids))
        _render_texts([d.get("passage_id", "") for d in hop.get("documents", [])], texts, view)
        pages.update({d.get("passage_id", ""): d.get("page", "") for d in hop.get("documents", [])})
    st.subheader("Answer")
    answer, gold = st.columns(2)
    with answer:
        st.markdown("**Answer**")
        st.write(view.answer or "—")
        st.markdown("**Sources (passages handed to generation)**")
        sources = _passages(view.context_ids, view.gold_ids, view, pages)
        st.table(sources if view.gold_ids else sources.drop(columns="gold"))
        _render_texts(view.context_ids, texts, view)
    with gold:
        st.markdown("**Gold answer**")
        st.write(view.gold_answer or "— (no gold answer for this question)")
        st.markdown("**Gold passages**")
        if view.gold_ids:
            st.table(_passages(view.gold_ids, view.context_ids, view, pages, "in context"))
        else:
            st.write("— (none)")


def render_calls(calls: list[dict[str, Any]] | None) -> None:
    """Which steps ran by rule and which by model, then every call on demand: one line each and,
    for a model call, the messages exactly as sent and the raw reply."""
    if calls is None:
        st.caption(
            "LLM calls: not recorded (this run's per-question table has no `calls` column: it was "
            "logged by an older caprag)."
        )
        return
    ran = steps_ran(calls)
    st.markdown(
        "**Steps:** "
        + (" · ".join(f"{step} by {by}" for step, by in ran.items()) or "no LLM step ran")
    )
    with st.expander(f"LLM calls ({len(calls)})"):
        if not calls:
            st.write("No LLM step ran for this question.")
        for number, call in enumerate(calls, start=1):
            st.markdown(call_line(number, call))
            if is_rule(call):
                continue
            label = (
                f"{number}. {call.get('step', '?')} · {call.get('model', '?')}: messages and reply"
            )
            with st.expander(label):
                _render_exchange(call)


def _render_exchange(call: dict[str, Any]) -> None:
    """The messages of one model call as sent (role, then content verbatim) and its reply."""
    messages = call.get("messages")
    if messages is None:
        st.caption("The messages of this call were not recorded.")
    for message in messages or []:
        st.markdown(f"**{message.get('role', '?')}**")
        st.code(str(message.get("content", "")), language=None, wrap_lines=True)
    st.markdown("**reply**")
    reply = call.get("reply")
    if reply is None:
        st.caption("No reply was recorded for this call.")
    else:
        st.code(str(reply), language=None, wrap_lines=True)


def _render_texts(ids: list[str], texts: Mapping[str, str], view: TraceView) -> None:
    """Each passage's text, collapsed: one HTML <details> per passage, titled id · section (not
    an expander each: a hop can return dozens of passages)."""
    if not ids:
        return
    blocks = []
    for pid in ids:
        section = view.sections.get(pid, "")
        title = html.escape(pid + (f" · {section}" if section else ""))
        text = texts.get(pid)
        body = (
            f"<div>{_verbatim(text)}</div>"
            if text
            else "<em>Its text was not kept (a run logged before passage texts).</em>"
        )
        blocks.append(f'<details class="passage"><summary>{title}</summary>{body}</details>')
    st.markdown(
        "**Passage texts** (click one to open)\n\n" + "".join(blocks), unsafe_allow_html=True
    )


def _verbatim(text: str) -> str:
    """Text as HTML that keeps its line breaks and indentation, on one line (a blank line would
    end the HTML block and let Markdown read the rest: `$`, `*`...)."""
    return html.escape(text).replace("  ", "&nbsp; ").replace("\n", "<br>")


def _render_hop(hop: dict[str, Any], sections: dict[str, str], graded: bool) -> None:
    number = hop.get("hop", "?")
    new, dup = hop.get("new_documents", 0), hop.get("duplicate_documents", 0)
    st.subheader(f"Hop {number}")
    st.caption(
        f"{new} new, {dup} duplicate documents · {hop.get('prompt_tokens', 0)} prompt + "
        f"{hop.get('completion_tokens', 0)} completion tokens · "
        f"${float(hop.get('cost_usd', 0.0)):.6f} · {float(hop.get('latency_s', 0.0)):.2f} s"
    )
    st.markdown("**Queries**")
    st.markdown("\n".join(f"- {q}" for q in hop.get("queries", [])) or "—")
    docs = hop_documents(hop, sections)
    if docs.empty:
        st.write("No documents returned.")
    else:
        st.table(docs if graded else docs.drop(columns="gold"))
    if hop.get("depth") is not None and hop.get("confidence") is not None:
        confidence = float(hop["confidence"])
        threshold = float(hop.get("threshold") or 0.0)
        st.markdown(
            f"**Adaptive:** depth {hop['depth']}/3 · {hop.get('chunks', '?')} chunks · "
            f"confidence {confidence:.0%} (threshold {threshold:.0%}) · "
            f"type {hop.get('query_type') or '?'} · decision `{hop.get('adaptive_decision')}`"
        )
        if hop.get("warning"):
            st.warning(hop["warning"])
        if hop.get("hint"):
            st.info(hop["hint"])
    decision = hop.get("decision")
    if decision:
        verdict = "sufficient" if decision.get("sufficient") else "not sufficient"
        st.markdown(f"**Analyzer decision:** {verdict}")
        if decision.get("reasoning"):
            st.caption(decision["reasoning"])
        queries = decision.get("new_queries") or []
        if queries:
            st.markdown("**New queries:**\n" + "\n".join(f"- {q}" for q in queries))


def _passages(
    ids: list[str], other: list[str], view: TraceView, pages: dict[str, Any], mark: str = "gold"
) -> pd.DataFrame:
    """Passage ids as a table; `mark` ticks those also in `other`."""
    rows = [
        {
            "passage": pid,
            "book": pid.split("/", 1)[0],
            "page": pages.get(pid, ""),
            "section": view.sections.get(pid, ""),
            mark: "✓" if pid in other else "",
        }
        for pid in ids
    ]
    return pd.DataFrame(rows, columns=["passage", "book", "page", "section", mark])
