"""Compare: metrics, cost vs quality, recall per hop, hop counts; two runs: significance, diff."""

from __future__ import annotations

import html

import pandas as pd
import streamlit as st

from experiments.dashboard import charts, selection, store
from experiments.dashboard.data import (
    COST,
    QUALITY,
    adaptive_runs,
    always_deep_run,
    decision_log,
    decision_table,
    deeper_questions,
    default_comparison,
    metric_table,
    oracle_cell,
    oracle_display,
    oracle_summary,
    recall_curve,
    saving_text,
    savings_vs_deep,
    schema_warning,
    table_metrics,
)
from experiments.dashboard.trace_view import render_trace
from experiments.results import metrics as registry
from experiments.results.row import rows_of
from experiments.results.slices import (
    DIMENSION_LABELS,
    Dimension,
    keys_of,
    rows_in,
    sliced_runs,
)
from experiments.scoring.calibration import reliability
from experiments.scoring.failures import WORST_SHOWN, worst_questions
from experiments.scoring.oracle import OracleError, oracle_routing
from experiments.scoring.significance import PairingError
from experiments.scoring.verdict import Contender, set_line

# The metrics recomputed on a slice: every one the metrics table shows.
SLICED = registry.names(table_metrics())
COST_METRIC, RECALL = registry.get("cost_usd"), registry.get("recall_at_k")
F1 = registry.get("f1")
TRACE_PAGE = "trace"  # the Trace viewer's url path (views/trace.py)


def render_savings(
    adaptive: pd.DataFrame, deep: pd.DataFrame, deep_id: str, deep_label: str, chosen: list[str]
) -> None:
    """Prompt tokens and cost of adaptive (auto) vs always depth 3, with both totals."""
    try:
        saved = savings_vs_deep(adaptive, deep)
    except PairingError as exc:
        st.warning(f"Cannot pair the adaptive run with {deep_label}: {exc}")
        return
    where = "selected" if deep_id in chosen else "not selected, found in the store"
    st.caption(
        f"against always deep = {deep_label} (adaptive, power 3; {where}) · over the "
        f"{saved.questions} questions both answered"
        + (f" ({saved.left_out} answered by only one left out)" if saved.left_out else "")
    )
    tokens, cost, recall = st.columns(3)
    tokens.metric(
        "Prompt tokens saved vs always deep",
        "—" if saved.token_saving is None else f"{saved.token_saving:.1%}",
        help="1 − adaptive total / always-deep total, over the questions both answered "
        "(negative: adaptive spent more)",
    )
    tokens.caption(
        f"{saving_text(saved.token_saving, 'prompt tokens')} · totals: adaptive "
        f"{saved.prompt_tokens[0]:,.0f}, always deep {saved.prompt_tokens[1]:,.0f}"
    )
    cost.metric(
        "Cost saved vs always deep",
        "—" if saved.cost_saving is None else f"{saved.cost_saving:.1%}",
        help="1 − adaptive total / always-deep total, in USD (offline: priced as if sent)",
    )
    cost.caption(
        f"{saving_text(saved.cost_saving, COST_METRIC.label)} · totals: adaptive "
        f"{oracle_cell(saved.cost_usd[0], 'cost_usd', total=True)}, always deep "
        f"{oracle_cell(saved.cost_usd[1], 'cost_usd', total=True)}"
    )
    mine, theirs = saved.recall_at_k
    change = None if mine is None or theirs is None else mine - theirs
    recall.metric(
        f"{RECALL.label}, adaptive",
        RECALL.display(mine),
        delta=None if change is None else f"{change:+.3f} vs always deep",
        delta_color="off" if not change else "normal",
        delta_arrow="off" if not change else "auto",
    )
    recall.caption("always deep " + RECALL.display(theirs))


def render_deeper(run: pd.Series, table: pd.DataFrame, chosen: list[str]) -> None:
    """The questions where adaptive went past its first depth, their rounds, and one's trace."""
    st.subheader("Queries that needed deeper search")
    deeper = deeper_questions(table)
    st.caption(
        f"{len(deeper)} of {len(table)} questions went past their first depth "
        f"(run {run['label']}); pick one below to see its rounds and trace"
    )
    if deeper.empty:
        st.info("Every question of this run stopped at the depth it started at.")
        return
    event = st.dataframe(
        deeper,
        hide_index=True,
        key="deeper_table",
        on_select="rerun",
        selection_mode="single-row",
        column_config={
            "question": st.column_config.TextColumn("question", width="large"),
            "recall_at_k": st.column_config.NumberColumn(
                RECALL.heading, format=RECALL.format.printf
            ),
        },
    )
    rows = list(event.selection.rows)
    if rows and st.session_state.get("deeper_clicked") != rows:  # a row just clicked: show it
        st.session_state["deeper_clicked"] = rows
        st.session_state["deeper_question"] = deeper.index[rows[0]]
    index = st.selectbox(
        "Trace of (or click a row above)",
        list(deeper.index),
        format_func=lambda i: (
            f"{deeper.at[i, 'question_id']!s} — {str(deeper.at[i, 'question'])[:90]}"
        ),
        key="deeper_question",
    )
    if index is None:
        return
    row = rows_of(table.loc[[index]])[0]
    if st.button("Open in the Trace viewer", key="deeper_open"):
        run_id = str(run["run_id"])  # first: the Trace viewer opens the first selected run
        selection.remember([run_id, *(r for r in chosen if r != run_id)])
        st.session_state["trace_question"] = index
        st.switch_page("views/trace.py")
    with st.container(border=True):
        log = decision_log(row.hops)
        st.markdown(f"**Rounds of {deeper.at[index, 'question_id']!s}**")
        st.table(decision_table(log), hide_index=True)
        render_trace(row)


def render_oracle(
    tables: dict[str, pd.DataFrame], labels: dict[str, str], strategy_of: dict[str, str]
) -> None:
    """The perfect router over the selected runs: per question the cheapest run at the best
    recall@k any of them reached; its total cost and recall beside each run's."""
    st.caption(
        "Per question, the cheapest of the selected runs among those that reached the best "
        "recall@k any of them reached: what a router that always picked the right strategy "
        "would spend, and the recall it would get."
    )
    if len(tables) < 2:
        st.info("The oracle needs two or more selected runs with a per-question table.")
        return
    cost = st.radio(
        "Cost counted", list(COST), format_func=lambda m: registry.get(m).label, horizontal=True,
        key="oracle_cost",
    )  # fmt: skip
    counted = registry.get(cost)
    try:
        result = oracle_routing(
            {labels[rid]: table for rid, table in tables.items()}, cost=cost, quality="recall_at_k"
        )
    except (OracleError, PairingError) as exc:
        st.warning(f"No oracle for these runs: {exc}")
        return
    if result.questions == 0:
        st.info("These runs answered no question in common: nothing to route.")
        return
    summary = oracle_summary(result)
    best = result.best_single()
    oracle, single = summary.iloc[-1], summary.set_index("run").loc[best]
    st.markdown(
        f"**Perfect router:** {oracle_cell(oracle['total'], cost, total=True)} at "
        f"{RECALL.label} {oracle_cell(oracle['recall'], RECALL.name)} · best single run {best}: "
        f"{oracle_cell(single['total'], cost, total=True)} at {RECALL.label} "
        f"{oracle_cell(single['recall'], RECALL.name)} · the router spends "
        f"{saving_text(result.saving(best), counted.label)} than that run"
    )
    st.caption(
        f"{result.questions} questions routed"
        + (
            f" ({result.unscored} with no gold passage, routed by cost alone)"
            if result.unscored
            else ""
        )
        + (f"; {result.left_out} left out (not answered by every run)" if result.left_out else "")
    )
    total_format = counted.total or counted.format
    st.dataframe(
        oracle_display(summary, counted.label).assign(
            per_question=counted.scaled(summary["per_question"])
        ),
        hide_index=True,
        key="oracle_table",
        column_config={
            "run": st.column_config.TextColumn("run", width="large"),
            "total": st.column_config.NumberColumn(
                counted.total_heading,
                format="localized" if total_format.grouping else total_format.printf,
            ),
            "per_question": st.column_config.NumberColumn(
                f"mean {counted.heading}", format=counted.format.printf
            ),
            "recall": st.column_config.NumberColumn(RECALL.heading, format=RECALL.format.printf),
            "routed": st.column_config.NumberColumn("routed to it"),
            "saves": st.column_config.TextColumn(
                "oracle saves", help="1 − oracle total / this run's total"
            ),
        },
    )
    st.plotly_chart(charts.oracle(summary, cost, strategy_of), key="oracle_chart")
    with st.expander(f"Per question: the run the oracle picks ({result.questions})"):
        st.dataframe(
            result.choices.reset_index(),
            hide_index=True,
            key="oracle_choices",
            column_config={"quality": RECALL.label, "best_quality": f"best {RECALL.label}"},
        )


def render_worst(
    tables: dict[str, pd.DataFrame], chosen: list[str], labels: dict[str, str], where: str
) -> None:
    """Each selected run's worst failed questions in the slice, with their failure tags; a
    question's id opens its trace in this tab (Back returns here: the slice and runs are in the
    address)."""
    st.markdown(f"**Worst questions{' · ' + where if where else ''}**")
    st.caption(
        f"per run, up to {WORST_SHOWN} failed questions, lowest {RECALL.label} then token F1 "
        "first; click a question to open its trace (Back comes back here)"
    )
    corpus = store.corpus()
    for rid in chosen:
        if rid not in tables:
            continue
        frame = worst_questions(tables[rid], corpus=corpus)
        st.markdown(f"*{html.escape(labels[rid])}*")
        if frame.empty:
            st.caption("No failed question here.")
            continue
        lines = [
            f'<tr><td><a href="{html.escape(selection.link(TRACE_PAGE, run=rid, question=q))}" '
            f'target="_self" class="worst">{html.escape(q)}</a></td>'
            f"<td>{RECALL.display(None if pd.isna(r) else float(r))}</td>"
            f"<td>{F1.display(None if pd.isna(f) else float(f))}</td>"
            f"<td>{html.escape(', '.join(tags))}</td></tr>"
            for q, r, f, tags in zip(
                frame["question_id"], frame["recall_at_k"], frame["f1"], frame["tags"], strict=True
            )
        ]
        head = (
            f"<tr><th>question</th><th>{html.escape(RECALL.heading)}</th>"
            f"<th>{html.escape(F1.heading)}</th><th>failure tags</th></tr>"
        )
        st.markdown(f'<table class="worst">{head}{"".join(lines)}</table>', unsafe_allow_html=True)


def render_verdict(
    tables: dict[str, pd.DataFrame], chosen: list[str], labels: dict[str, str], where: str
) -> None:
    """The slice's verdict on the first screen, as `make run` prints it: the best run against
    the runner-up on the main metric (paired over these questions, 95 % CI, p), token F1 beside
    it, and what the winner costs per answer relative to the runner-up."""
    contenders = [
        Contender(labels[rid], tables[rid].assign(set=where))
        for rid in chosen
        if rid in tables and not tables[rid].empty
    ]
    if len(contenders) < 2:
        return
    line = set_line(contenders, where).strip().replace("$", "\\$")  # not LaTeX
    st.success(f"**Verdict** · {line}")


st.title("Compare runs")
runs = selection.require_runs()
labels = dict(zip(runs["run_id"], runs["label"], strict=True))
selection.seed("compare_runs", "runs", list(runs["run_id"]), many=True)
chosen = st.multiselect(
    "Runs",
    list(runs["run_id"]),
    default=selection.selected(runs) or default_comparison(runs),
    format_func=labels.__getitem__,
    key="compare_runs",
)
selection.remember(chosen)
selection.share("compare_runs", "runs", chosen)
if len(chosen) < 2:
    st.info("Choose two or more runs to compare (here or by ticking rows on the Runs page).")
    st.stop()
picked = runs.set_index("run_id").loc[chosen].reset_index()
for _, run in picked.iterrows():
    warning = schema_warning(run)
    if warning:
        st.warning(warning)

tables: dict[str, pd.DataFrame] = {}
for _, run in picked.iterrows():
    table = selection.load_questions(run)
    if table is not None:
        tables[str(run["run_id"])] = table
strategy_of = dict(zip(picked["label"], picked["strategy"].astype(str), strict=True))

st.header("Metrics")
ALL = "All questions"
SLICE_BY = {ALL: None, **{f"By {name}": by for by, name in DIMENSION_LABELS.items()}}
s1, s2 = st.columns([2, 1])
selection.seed("slice_by", "by", list(SLICE_BY), text=lambda label: SLICE_BY[label] or "all")
dim: Dimension | None = SLICE_BY[s1.radio("Slice", list(SLICE_BY), horizontal=True, key="slice_by")]
selection.share("slice_by", "by", dim or "all")
keys: list[str] = keys_of(tables, dim) if dim is not None else []
key: str | None = None
if dim is not None and not keys:
    s2.info(f"These runs' per-question tables have no {DIMENSION_LABELS[dim]}.")
elif dim is not None:
    selection.seed(f"slice_{dim}", "slice", keys)
    key = s2.selectbox(
        DIMENSION_LABELS[dim].capitalize(),
        keys,
        index=keys.index("cross_book") if "cross_book" in keys else 0,
        key=f"slice_{dim}",
    )
selection.share(f"slice_{dim}", "slice", key)
sliced_tables, shown_runs = tables, picked
if dim is not None and key is not None:
    sliced_tables = {rid: rows_in(t, dim, key) for rid, t in tables.items()}
    shown_runs = sliced_runs(picked, tables, dim, key, SLICED)
    no_table = [labels[r] for r in chosen if r not in tables]
    st.caption(
        f"{DIMENSION_LABELS[dim]} **{key}**: every number and chart below down to the oracle is "
        "computed on these questions only, from each run's per-question table"
        + (f" (no table, shown as —: {', '.join(no_table)})" if no_table else "")
    )
render_verdict(
    sliced_tables, chosen, labels, key if dim is not None and key is not None else "all questions"
)
numbers, worst = st.columns([3, 2])
numbers.caption(
    "value (questions with a value / all questions) where a metric is not defined for all"
)
numbers.table(metric_table(shown_runs))
with worst:
    render_worst(
        sliced_tables, chosen, labels, f"{DIMENSION_LABELS[dim]} {key}" if dim and key else ""
    )
if dim is not None and keys:
    with st.expander(f"Every {DIMENSION_LABELS[dim]} side by side (main metrics)"):
        main = [m.name for m in registry.sliced() if m.name in SLICED]
        grouped = pd.concat(
            {k: metric_table(sliced_runs(picked, tables, dim, k, SLICED), main) for k in keys},
            names=[DIMENSION_LABELS[dim], "metric"],
        )
        st.dataframe(grouped.reset_index(), hide_index=True, key="slice_grouped")

st.header("Cost vs quality")
c1, c2, c3 = st.columns(3)
cost = c1.radio(
    "Cost", list(COST), format_func=lambda m: registry.get(m).heading, horizontal=True, key="cost"
)
quality = c2.radio(
    "Quality", list(QUALITY), format_func=lambda m: registry.get(m).label, horizontal=True,
    key="quality",
)  # fmt: skip
scope = c3.radio(
    "Runs shown", ["selected", "all"], horizontal=True, key="scope", disabled=dim is not None,
    help="A slice is computed from per-question tables: only the selected runs are sliced",
)  # fmt: skip
points = picked if scope == "selected" else runs
if dim is not None:
    points = shown_runs
if {cost, quality} <= set(points.columns) and points[[cost, quality]].notna().all(axis=1).any():
    st.plotly_chart(charts.cost_quality(points, cost, quality, chosen), key="scatter")
else:
    st.info(f"No run here has both `{cost}` and `{quality}` logged.")

st.header("Cumulative gold-passage recall per hop")
curve = recall_curve(shown_runs)
if curve.empty:
    st.info("These runs logged no per-hop recall (recall_hop1…3).")
else:
    st.plotly_chart(charts.recall_per_hop(curve), key="recall_curve")

st.header("Hops per question")
hops = [
    pd.DataFrame({"label": labels[rid], "strategy": strategy_of[labels[rid]], "hops": t["hops"]})
    for rid, t in sliced_tables.items()
    if "hops" in t.columns
]
if hops:
    st.plotly_chart(charts.hop_histogram(pd.concat(hops).dropna()), key="hop_hist")
else:
    st.info("No per-question hop counts for these runs.")

calibrated = {
    rid: t for rid, t in sliced_tables.items() if {"confidence", "context_recall"} <= set(t.columns)
}
if calibrated:
    st.header("Calibration (adaptive confidence)")
    st.caption("confidence bucket vs share of questions whose context held every gold passage")
    frames = []
    for rid, t in calibrated.items():
        ok = t[(t["status"] == "ok") & t["confidence"].notna() & t["context_recall"].notna()]
        table = reliability(ok["confidence"], (ok["context_recall"] == 1.0).astype(float))
        frames.append(table.assign(label=labels[rid], strategy=strategy_of[labels[rid]]))
    st.plotly_chart(charts.calibration(pd.concat(frames)), key="calibration")

auto = adaptive_runs(picked)
if (picked["strategy"] == "adaptive").any():
    st.header("Adaptive depth: savings vs always deep")
if auto.empty:
    if (picked["strategy"] == "adaptive").any():
        st.info(
            "None of the selected adaptive runs is in auto mode (`strategy=adaptive "
            "strategy.power=auto`): select one to see what it saves against always searching "
            "deep."
        )
else:
    auto_ids = list(auto["run_id"])
    adaptive_id = (
        st.selectbox("Adaptive run", auto_ids, format_func=labels.__getitem__, key="adaptive_run")
        if len(auto_ids) > 1
        else auto_ids[0]
    )
    adaptive = picked.set_index("run_id", drop=False).loc[adaptive_id]
    adaptive_table = tables.get(adaptive_id)
    deep = always_deep_run(runs, adaptive, prefer=chosen)
    if deep is None:
        st.info(
            f"No fixed depth-3 run of dataset `{adaptive['dataset']}` ({adaptive['llm']} backend, "
            "same retriever) among the runs of this store, so no savings to show: log one with "
            "`python -m experiments.run strategy=adaptive strategy.power=3 "
            f"dataset={adaptive['dataset']}`."
        )
    elif adaptive_table is not None:
        deep_id = str(deep["run_id"])
        deep_table = tables.get(deep_id)
        if deep_table is None:
            deep_table = selection.load_questions(deep)
        if deep_table is not None:
            render_savings(adaptive_table, deep_table, deep_id, str(deep["label"]), chosen)
    if adaptive_table is not None:
        render_deeper(adaptive, adaptive_table, chosen)

st.header("Oracle routing ceiling")
render_oracle(sliced_tables, labels, strategy_of)

st.header("Per-question diff")
st.page_link(
    "views/regressions.py",
    label="Per question, which got better or worse (with failure tags, significance and traces): "
    "the Regressions page",
    icon=":material/difference:",
    query_params={"a": chosen[0], "b": chosen[1]},
)
