"""Decision log: the live API/page/CLI requests with each round's decision and the user's
feedback, read from the SQLite file CAPRAG_DECISION_LOG names (the server's own setting)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pandas as pd
import streamlit as st

from caprag.config import load_settings
from caprag.errors import CapragError
from caprag.serve.decision_log import DecisionLog, DecisionRecord

LIMIT = 1000
FEEDBACK: dict[str, Literal["any", "enough", "not_enough", "none"]] = {
    "any": "any",
    "enough": "enough",
    "not enough": "not_enough",
    "no feedback": "none",
}


def row(record: DecisionRecord) -> dict[str, Any]:
    """One request as a table row."""
    final = record.final
    verdict = None if record.feedback is None else record.feedback.enough
    return {
        "time": pd.Timestamp(record.created_at),
        "strategy": record.strategy,
        "question": record.question,
        "power": record.power,
        "rounds": len(record.rounds),
        "depth": None
        if final is None or final.depth is None
        else f"{final.depth}/{record.max_depth}",
        "confidence": None if final is None else final.confidence,
        "threshold": None if final is None else final.threshold,
        "stop": record.stop_reason,
        "status": record.status,
        "latency_s": record.latency_s,
        "tokens": record.prompt_tokens + record.completion_tokens,
        "cost_usd": record.cost_usd,
        "feedback": {None: "", True: "enough", False: "not enough"}[verdict],
        "comment": "" if record.feedback is None else record.feedback.comment,
        "request_id": record.request_id,
    }


st.title("Decision log")
try:
    where = load_settings().decision_log
except CapragError as exc:
    st.error(f"Cannot read the settings: {exc}")
    st.stop()
if str(where) == "off":
    st.info("CAPRAG_DECISION_LOG=off: the server keeps its decision log in memory only.")
    st.stop()
path = Path(where)
st.caption(f"File: `{path.resolve()}` (CAPRAG_DECISION_LOG) · newest first, at most {LIMIT}")
if not path.is_file():
    st.info(
        f"No request has been logged yet: `{path}` does not exist. Ask on the chat page, the API "
        "or `python -m caprag ask` with the same CAPRAG_DECISION_LOG."
    )
    st.stop()

log = DecisionLog(path)
try:
    left, right = st.columns(2)
    strategy = left.selectbox("Strategy", ["all", *log.strategies()], key="d_strategy")
    verdict = right.selectbox("Feedback", list(FEEDBACK), key="d_feedback")
    records = log.records(
        strategy=None if strategy == "all" else strategy, feedback=FEEDBACK[verdict], limit=LIMIT
    )
finally:
    log.close()

if not records:
    st.info("No request matches these filters.")
    st.stop()
table = pd.DataFrame([row(r) for r in records])
rated = table[table["feedback"] != ""]
cols = st.columns(4)
cols[0].metric("requests", len(table))
cols[1].metric("with feedback", len(rated))
cols[2].metric("enough", "—" if rated.empty else f"{(rated['feedback'] == 'enough').mean():.0%}")
cols[3].metric(
    "cut by the time limit", int(table["stop"].fillna("").str.startswith("timeout").sum())
)
event = st.dataframe(
    table,
    hide_index=True,
    on_select="rerun",
    selection_mode="single-row",
    key="decisions_table",
    column_config={
        "time": st.column_config.DatetimeColumn("time (UTC)", format="YYYY-MM-DD HH:mm:ss"),
        "confidence": st.column_config.NumberColumn(format="%.2f"),
        "threshold": st.column_config.NumberColumn(format="%.2f"),
        "latency_s": st.column_config.NumberColumn("latency s", format="%.2f"),
        "cost_usd": st.column_config.NumberColumn("USD", format="%.6f"),
    },
)
picked = list(event.selection.rows) if event is not None else []
chosen = records[picked[0]] if picked else records[0]
st.subheader(f"Request {chosen.request_id}")
st.write(
    f"**{chosen.question}** · {chosen.strategy} · thread `{chosen.thread_id}` · "
    f"status {chosen.status} · stopped: {chosen.stop_reason}"
    + (f" · power {chosen.power} ({chosen.power_source})" if chosen.power else "")
    + (f" · ladder {' / '.join(map(str, chosen.ladder))} chunks" if chosen.ladder else "")
)
if chosen.rounds:
    st.dataframe(
        pd.DataFrame([r.model_dump() for r in chosen.rounds]),
        hide_index=True,
    )
if chosen.steps:
    st.caption("Steps (seconds from the start of the request; cut = stopped by the time limit)")
    st.dataframe(pd.DataFrame([s.model_dump() for s in chosen.steps]), hide_index=True)
if chosen.feedback is not None:
    said = "enough" if chosen.feedback.enough else "not enough"
    comment = f": “{chosen.feedback.comment}”" if chosen.feedback.comment else ""
    st.write(f"Feedback: **{said}**{comment} ({chosen.feedback.created_at})")
