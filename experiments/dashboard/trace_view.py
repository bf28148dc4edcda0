"""The hop-by-hop trace of one question, shared by the Trace viewer and Ask pages."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping

import pandas as pd
import streamlit as st

from caprag.schemas import CallUsage
from caprag.serve.services import AskResult
from caprag.trace import HopTrace
from experiments.dashboard.data import call_line, hop_documents, is_rule, steps_ran
from experiments.results import metrics as registry
from experiments.results.row import QuestionRow
from experiments.results.traces import Target, case_key, find_trace
from experiments.scoring.failures import (
    Corpus,
    failed,
    failure_tags,
    gold_lines,
    located,
    passage_info,
)


def trace_id(store_uri: str, experiment_id: str, run_id: str, row: QuestionRow) -> str | None:
    """The MLflow id of the trace a run wrote for a logged question row (None: it has none)."""
    target = Target(store_uri, experiment_id, run_id)
    return find_trace(target, case_key(row.repeat, row.question_id))


def render_scores(row: QuestionRow, corpus: Corpus | None = None) -> None:
    """A logged question's scores and failure tags, above its trace: how it did, and what the
    trace says went wrong (`experiments.scoring.failures`; `corpus`: where the passages it did
    not retrieve are, for a citation not followed)."""
    scores = []
    for metric in registry.per_question():
        if not (metric.headline or metric.group == "answer"):
            continue  # the main metrics, and the answer's (refusals: an unanswerable's score)
        value = row.values.get(metric.name)
        if value is None or math.isnan(value):
            continue
        scores.append(f"{metric.heading} **{metric.display(float(value))}**")
    st.markdown("**Scores:** " + (" · ".join(scores) or "none recorded"))
    tags = failure_tags(row, corpus=corpus)
    if tags:
        st.warning("**Failure tags:** " + ", ".join(tags))
    else:  # every failed question has a tag (`failures.failed`): this one did not fail
        st.caption(
            "Failure tags: none" + (" (the question did not fail)" if not failed(row) else "")
        )
    if row.gold_ids:
        st.markdown(
            "**Where the gold passages went:**\n"
            + "\n".join(gold_lines(row, corpus, " (its text is below the answer)"))
        )


def row_of_answer(result: AskResult, sections: Mapping[str, str]) -> QuestionRow:
    """A live answer as a question row (no gold: it was not in a question set); the passages it
    keeps carry the text of those handed to generation."""
    row = QuestionRow(
        case_id="",
        question_id="",
        set="",
        query_type="",
        turn=1,
        question=result.question,
        gold_answer="",
    )
    row.add_answer(result, {**sections, **{d.passage_id: d.section for d in result.context}})
    return row


def render_trace(row: QuestionRow, corpus: Corpus | None = None) -> None:
    """Question, each hop, then the answer with its sources beside the gold answer; a gold
    passage no hop returned is shown from `corpus` (book, page, section, text)."""
    st.markdown(f"**Question:** {row.question}")
    if row.main_question and row.main_question.strip() != row.question.strip():
        st.markdown(f"**Rewritten as:** {row.main_question}")
    if row.status != "ok":
        st.error(f"This question failed: {row.error or row.status}")
    render_calls(row.calls)
    if not row.hops:
        st.info("No hop trace was recorded for this question.")
    for hop in row.hops:
        _render_hop(hop, row)
        _render_texts([d.passage_id for d in hop.documents], row)
    st.subheader("Answer")
    answer, gold = st.columns(2)
    with answer:
        st.markdown("**Answer**")
        st.write(row.answer or "—")
        if row.refused:
            st.caption("A refusal: the generator found no answer in the passages.")
        st.markdown("**Sources (passages handed to generation)**")
        sources = _passages(row.context_ids, row.gold_ids, row)
        st.table(sources if row.gold_ids else sources.drop(columns="gold"))
        _render_texts(row.context_ids, row)
    with gold:
        st.markdown("**Gold answer**")
        st.write(row.gold_answer or "— (no gold answer for this question)")
        st.markdown("**Gold passages**")
        if row.gold_ids:
            gold_table = _passages(row.gold_ids, row.context_ids, row, "in context", corpus)
            retrieved = set(row.retrieved_ids()) | set(row.context_ids)
            gold_table["retrieved"] = ["✓" if g in retrieved else "✗ never" for g in row.gold_ids]
            st.table(gold_table)
            missing = [g for g in row.gold_ids if g not in retrieved]
            if missing:
                st.markdown(f"**Gold passages never retrieved ({len(missing)})**")
                _render_texts(missing, row, corpus, opened=True)
        else:
            st.write("— (none)")


def render_calls(calls: list[CallUsage] | None) -> None:
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
            with st.expander(f"{number}. {call.step} · {call.model}: messages and reply"):
                _render_exchange(call)


def _render_exchange(call: CallUsage) -> None:
    """The messages of one model call as sent (role, then content verbatim) and its reply."""
    if call.messages is None:
        st.caption("The messages of this call were not recorded.")
    for message in call.messages or []:
        st.markdown(f"**{message.get('role', '?')}**")
        st.code(str(message.get("content", "")), language=None, wrap_lines=True)
    st.markdown("**reply**")
    if call.reply is None:
        st.caption("No reply was recorded for this call.")
    else:
        st.code(call.reply, language=None, wrap_lines=True)


def _render_texts(
    ids: list[str], row: QuestionRow, corpus: Corpus | None = None, opened: bool = False
) -> None:
    """Each passage's text, collapsed (`opened`: open): one HTML <details> per passage, titled
    id · book p. page · section (not an expander each: a hop can return dozens of passages)."""
    if not ids:
        return
    blocks = []
    for pid in ids:
        passage = passage_info(pid, row, corpus)
        where = located(passage)
        title = html.escape(pid + where)
        if passage is None:
            body = "<em>Not in this run's rows nor in the books the dashboard reads.</em>"
        elif passage.text:
            body = f"<div>{_verbatim(passage.text)}</div>"
        else:
            body = "<em>Its text was not kept (a run logged before passage texts).</em>"
        state = " open" if opened else ""
        blocks.append(f'<details class="passage"{state}><summary>{title}</summary>{body}</details>')
    st.markdown(
        "**Passage texts** (click one to open)\n\n" + "".join(blocks), unsafe_allow_html=True
    )


def _verbatim(text: str) -> str:
    """Text as HTML that keeps its line breaks and indentation, on one line (a blank line would
    end the HTML block and let Markdown read the rest: `$`, `*`...)."""
    return html.escape(text).replace("  ", "&nbsp; ").replace("\n", "<br>")


def _render_hop(hop: HopTrace, row: QuestionRow) -> None:
    st.subheader(f"Hop {hop.hop}")
    st.caption(
        f"{hop.new_documents} new, {hop.duplicate_documents} duplicate documents · "
        f"{hop.prompt_tokens} prompt + {hop.completion_tokens} completion tokens · "
        f"{'cost unknown' if hop.cost_usd is None else f'${hop.cost_usd:.6f}'} · "
        f"{hop.latency_s:.2f} s"
    )
    st.markdown("**Queries**")
    st.markdown("\n".join(f"- {q}" for q in hop.queries) or "—")
    docs = hop_documents(hop, row)
    if docs.empty:
        st.write("No documents returned.")
    else:
        st.table(docs if row.gold_ids else docs.drop(columns="gold"))
    if hop.depth is not None and hop.confidence is not None:
        st.markdown(
            f"**Adaptive:** depth {hop.depth}/3 · "
            f"{hop.chunks if hop.chunks is not None else '?'} chunks · "
            f"confidence {hop.confidence:.0%} (threshold {hop.threshold or 0.0:.0%}) · "
            f"type {hop.query_type or '?'} · decision `{hop.adaptive_decision}`"
        )
        if hop.warning:
            st.warning(hop.warning)
        if hop.hint:
            st.info(hop.hint)
    if hop.reasoning:
        st.markdown("**Reasoning:**\n" + "\n".join(f"- {line}" for line in hop.reasoning))
    if hop.decision is not None:
        verdict = "sufficient" if hop.decision.sufficient else "not sufficient"
        st.markdown(f"**Analyzer decision:** {verdict}")
        if hop.decision.reasoning:
            st.caption(hop.decision.reasoning)
        if hop.decision.new_queries:
            st.markdown(
                "**New queries:**\n" + "\n".join(f"- {q}" for q in hop.decision.new_queries)
            )


def _passages(
    ids: list[str],
    other: list[str],
    row: QuestionRow,
    mark: str = "gold",
    corpus: Corpus | None = None,
) -> pd.DataFrame:
    """Passage ids as a table; `mark` ticks those also in `other` (where a passage is: the row's,
    else the corpus's)."""
    rows = []
    for pid in ids:
        info = passage_info(pid, row, corpus)
        rows.append(
            {
                "passage": pid,
                "book": info.book_id if info is not None else pid.split("/", 1)[0],
                "page": info.page if info is not None else "",
                "section": info.section if info is not None else "",
                mark: "✓" if pid in other else "",
            }
        )
    return pd.DataFrame(rows, columns=["passage", "book", "page", "section", mark])
