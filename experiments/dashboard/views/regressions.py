"""Regressions: two runs side by side per question (better, worse, same on a chosen metric),
with failure tags, links to both traces, and the filtered questions as a question set."""

from __future__ import annotations

import streamlit as st

from experiments.dashboard import selection, store
from experiments.dashboard.data import default_comparison
from experiments.dashboard.label_view import trace_pairs
from experiments.dashboard.significance_view import render_significance
from experiments.results import metrics as registry
from experiments.scoring import regressions as reg
from experiments.scoring.failures import TAGS

TRACE_PAGE = "trace"  # the Trace viewer's url path (views/trace.py)

st.title("Regressions")
runs = selection.require_runs()
ids = list(runs["run_id"])
labels = dict(zip(runs["run_id"], runs["label"], strict=True))
preferred = selection.selected(runs) or default_comparison(runs) or ids
first = ids.index(preferred[0])
second = ids.index(preferred[1]) if len(preferred) > 1 else (first + 1) % len(ids)
a_col, b_col = st.columns(2)
selection.seed("diff_a", "a", ids)
selection.seed("diff_b", "b", ids)
run_a = a_col.selectbox("Run A (before)", ids, first, format_func=labels.__getitem__, key="diff_a")
run_b = b_col.selectbox("Run B (after)", ids, second, format_func=labels.__getitem__, key="diff_b")
selection.share("diff_a", "a", run_a)
selection.share("diff_b", "b", run_b)
by_id = runs.set_index("run_id", drop=False)
table_a = selection.load_questions(by_id.loc[run_a])
table_b = selection.load_questions(by_id.loc[run_b])
if table_a is None or table_b is None:
    st.stop()
if "question_id" not in table_a.columns or "question_id" not in table_b.columns:
    st.warning("These tables have no `question_id` column (an older schema); cannot match them.")
    st.stop()

metrics = reg.metrics_of(table_a, table_b)
if not metrics:
    st.warning("These runs share no per-question metric to compare.")
    st.stop()
selection.seed("reg_metric", "metric", metrics)
metric = st.selectbox(
    "Metric",
    metrics,
    format_func=lambda m: registry.get(m).heading,
    key="reg_metric",
    help="better/worse: B's value above/below A's (below/above where lower is better: costs, "
    "false refusal); a question that failed counts as 0 on a quality score, is not scored on a "
    "cost",
)
selection.share("reg_metric", "metric", metric)
frame = reg.compare(table_a, table_b, metric, store.corpus())

f1, f2, f3, f4 = st.columns([1, 1, 1.5, 1])  # room for "analyzer stopped early"
choices = {
    "reg_set": ("set", f1, "Question set", sorted(frame["set"].astype(str).unique())),
    "reg_type": ("type", f2, "Question type", sorted(frame["type"].astype(str).unique())),
    "reg_tag": ("tag", f3, "Failure tag (in A or B)", list(TAGS)),
    "reg_change": ("change", f4, "Change", list(reg.CHANGES)),
}
chosen: dict[str, list[str]] = {}
for key, (param, column, label, options) in choices.items():
    selection.seed(key, param, options, many=True)
    chosen[key] = column.multiselect(label, options, key=key)
    selection.share(key, param, chosen[key])
scope = reg.filtered(frame, chosen["reg_set"], chosen["reg_type"], chosen["reg_tag"])
shown = reg.filtered(scope, changes=chosen["reg_change"])

counted = reg.counts(scope)
for column, change in zip(st.columns(len(counted)), counted, strict=True):
    column.metric(change, counted[change])
st.caption(
    f"A = {labels[run_a]}, B = {labels[run_b]} · {len(scope)} of the {len(frame)} questions "
    f"both runs answered match the set, type and tag filters; {len(shown)} shown"
)
rows = reg.ordered(shown).reset_index(drop=True)
rule = registry.get(metric)
rows["value_a"], rows["value_b"] = rule.scaled(rows["value_a"]), rule.scaled(rows["value_b"])
human = {
    side: store.labels(store.uri(), str(by_id.loc[rid, "experiment_id"]), rid, trace_pairs(t))
    for side, rid, t in (("a", run_a, table_a), ("b", run_b, table_b))
}
rows["label_a"] = [human["a"][q].text() if q in human["a"] else "" for q in rows["question_id"]]
rows["label_b"] = [human["b"][q].text() if q in human["b"] else "" for q in rows["question_id"]]
rows["trace_a"] = [selection.link(TRACE_PAGE, run=run_a, question=q) for q in rows["question_id"]]
rows["trace_b"] = [selection.link(TRACE_PAGE, run=run_b, question=q) for q in rows["question_id"]]
COLUMNS = [
    "question_id", "set", "type", "change", "value_a", "value_b", "tags_a", "tags_b",
    "label_a", "label_b", "trace_a", "trace_b", "question",
]  # fmt: skip
st.dataframe(
    rows[COLUMNS],
    hide_index=True,
    key="reg_table",
    column_config={
        "value_a": st.column_config.NumberColumn("A", format=rule.format.printf, help=rule.heading),
        "value_b": st.column_config.NumberColumn("B", format=rule.format.printf, help=rule.heading),
        "tags_a": st.column_config.ListColumn("A tags", width="medium"),
        "tags_b": st.column_config.ListColumn("B tags", width="medium"),
        "label_a": st.column_config.TextColumn("A human label", help="From the Trace viewer"),
        "label_b": st.column_config.TextColumn("B human label", help="From the Trace viewer"),
        "trace_a": st.column_config.LinkColumn("A trace", display_text="open A"),
        "trace_b": st.column_config.LinkColumn("B trace", display_text="open B"),
        "question": st.column_config.TextColumn("question", width="large"),
    },
)

if not rows.empty:
    questions = list(rows["question_id"].astype(str))
    selection.seed("reg_question", "question", questions)
    texts = dict(zip(questions, rows["question"].astype(str), strict=True))
    picked = st.selectbox(
        "Traces of", questions, format_func=lambda q: f"{q} — {texts[q][:90]}", key="reg_question"
    )
    selection.share("reg_question", "question", picked)
    left, right = st.columns(2)
    # A new tab, leaving this view as it is (same-tab links were tried: under load, Back landed
    # on an intermediate Trace viewer URL of Streamlit 1.67's page switch)
    left.link_button("Trace in A", selection.link(TRACE_PAGE, run=run_a, question=picked))
    right.link_button("Trace in B", selection.link(TRACE_PAGE, run=run_b, question=picked))

# each question goes out with its human label: B's, else A's
labelled = {q: label.text() for side in ("a", "b") for q, label in human[side].items()}
items = reg.as_dataset(shown, labelled)
st.download_button(
    "Export these questions as a dataset",
    reg.to_jsonl(items),
    file_name="regressions.jsonl",
    mime="application/jsonl",
    disabled=not items,
    help="The questions shown, one JSON object a line in the question-set schema "
    "(datasets/README.md), each with its human label if it has one: load it with "
    "`experiments.results.questions.load_questions`",
)
left_out = len(shown) - len(reg.single_questions(shown))
turns = f"; {left_out} conversation turns left out (a turn needs its conversation)"
st.caption(
    f"{len(items)} questions in the export"
    + (turns if left_out else "")
    + " · reference text and answer aliases are not in a run's table and are left empty"
)

# The test follows the set, type and tag filters (not the change filter: picking only the
# questions that got worse would make any difference look significant).
narrowed = len(scope) < len(frame)
if narrowed and scope.empty:
    st.subheader("Significance")
    st.info("No question matches the set, type and tag filters: nothing to test.")
    st.stop()
render_significance(
    by_id.loc[run_a],
    by_id.loc[run_b],
    labels,
    only=tuple(sorted(set(scope["question_id"].astype(str)))) if narrowed else (),
    scope=f"on the {len(scope)} questions the set, type and tag filters keep" if narrowed else "",
)
