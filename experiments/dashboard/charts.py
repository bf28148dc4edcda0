"""Plotly figures of the Compare page, built from the frames in data.py.

Every chart colours a run by its strategy (`strategy_colour`: one mapping for every page, so a
strategy keeps its colour whatever is selected); runs of the same strategy differ by line dash or
bar pattern. USD axes read as dollars ("$0.0003").
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from experiments.dashboard.data import pareto_front
from experiments.results import metrics as registry
from experiments.scoring.oracle import ORACLE

STRATEGY_COLOURS = {
    "single": "#1f77b4",
    "multi-question": "#ff7f0e",
    "multi-hop": "#2ca02c",
    "adaptive": "#9467bd",
}
"""The shipped strategies' colours (Plotly's D3 palette)."""
OTHER_COLOURS = ("#d62728", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
"""Colours of other strategies, picked by a hash of the name (stable across sessions)."""
UNKNOWN_COLOUR = "#555555"
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
PATTERNS = ("", "/", "x", ".", "\\", "+")
USD_TICKS = ",.6~f"
"""Dollar amounts as plain decimals, trailing zeros cut: $0.0003, $0.00125, $1.5."""


def strategy_colour(strategy: str) -> str:
    """The colour of a strategy on every chart of every page."""
    if strategy in STRATEGY_COLOURS:
        return STRATEGY_COLOURS[strategy]
    if not strategy or strategy == "?":
        return UNKNOWN_COLOUR
    digest = int(hashlib.sha256(strategy.encode()).hexdigest(), 16)
    return OTHER_COLOURS[digest % len(OTHER_COLOURS)]


def repeat_index(strategy_of: Mapping[str, str]) -> dict[str, int]:
    """Run label → 0 for the first run of its strategy, 1 for the second… (in label order)."""
    seen: dict[str, int] = {}
    index = {}
    for label in sorted(strategy_of):
        strategy = strategy_of[label]
        index[label] = seen.get(strategy, 0)
        seen[strategy] = index[label] + 1
    return index


def _key(name: str, symbol: str, colour: str) -> go.Scatter:
    """A legend entry with no point: a strategy's colour, or what a marker shape means."""
    return go.Scatter(
        x=[None],
        y=[None],
        mode="markers",
        name=name,
        legendgroup=name,
        marker={"symbol": symbol, "color": colour, "size": 11, "line": {"width": 2}},
    )


def _money_axis(fig: go.Figure, axis: str = "x") -> None:
    update = fig.update_xaxes if axis == "x" else fig.update_yaxes
    update(tickprefix="$", tickformat=USD_TICKS, exponentformat="none")


def _is_money(unit: str) -> bool:
    """Whether values in this unit are dollars ('USD', 'USD per 1,000 questions')."""
    return unit.split(" ")[0] == "USD"


def cost_quality(runs: pd.DataFrame, cost: str, quality: str, selected: list[str]) -> go.Figure:
    """Each run as a point (cost vs quality) in its strategy's colour: runs on the Pareto front
    filled with a dark outline, the others open rings; the front as a line; selected runs
    larger. Axes in the metrics' displayed units (cost per 1,000 questions)."""
    x_metric, y_metric = registry.get(cost), registry.get(quality)
    frame = runs.dropna(subset=[cost, quality]).copy()
    frame["on_front"] = pareto_front(frame, cost, quality)
    frame["is_selected"] = frame["run_id"].isin(selected)
    frame[cost] = x_metric.scaled(frame[cost])
    frame[quality] = y_metric.scaled(frame[quality])
    money = _is_money(x_metric.unit)
    x_hover = f"{x_metric.format.prefix}%{{x:,.{x_metric.format.decimals}f}}"
    y_hover = f"{y_metric.format.prefix}%{{y:,.{y_metric.format.decimals}f}}"
    fig = go.Figure()
    for strategy in sorted(frame["strategy"].astype(str).unique()):
        colour = strategy_colour(strategy)
        fig.add_trace(_key(strategy, "square", colour))
        for on_front in (True, False):
            part = frame[
                (frame["strategy"].astype(str) == strategy) & (frame["on_front"] == on_front)
            ]
            if part.empty:
                continue
            fig.add_trace(
                go.Scatter(
                    x=part[cost],
                    y=part[quality],
                    mode="markers",
                    name=strategy,
                    legendgroup=strategy,
                    showlegend=False,
                    customdata=part[["label", "dataset", "llm", "run_id"]].astype(str).to_numpy(),
                    hovertemplate="<b>%{customdata[0]}</b><br>"
                    + f"{x_metric.heading}: {x_hover}<br>"
                    + f"{y_metric.heading}: {y_hover}<br>"
                    + ("on the Pareto front" if on_front else "dominated")
                    + "<br>dataset %{customdata[1]} · llm %{customdata[2]}"
                    + "<br>run %{customdata[3]}<extra></extra>",
                    marker={
                        "color": colour,
                        "symbol": "circle" if on_front else "circle-open",
                        "size": [16 if s else 12 for s in part["is_selected"]],
                        "line": {"color": "#222222", "width": 1.5}
                        if on_front
                        else {"color": colour, "width": 3},
                    },
                )
            )
    front = frame[frame["on_front"]].sort_values(cost)
    fig.add_trace(
        go.Scatter(
            x=front[cost],
            y=front[quality],
            mode="lines",
            name="Pareto front",
            line={"dash": "dash", "color": "grey"},
            hoverinfo="skip",
        )
    )
    fig.add_trace(_key("on the front (filled)", "circle", "#444444"))
    fig.add_trace(_key("dominated (ring)", "circle-open", "#444444"))
    fig.update_layout(
        height=420,
        legend_title_text="",
        xaxis_title=x_metric.heading,
        yaxis_title=y_metric.heading,
    )
    if money:
        _money_axis(fig)
    return fig


def _by_run(fig: go.Figure, strategy_of: Mapping[str, str], kind: str) -> None:
    """Colour each trace (named by its run label) by strategy; repeats of a strategy get a
    dash (`kind` line) or a bar pattern (`kind` bar)."""
    repeats = repeat_index(strategy_of)
    for trace in fig.data:
        label = str(trace.name)
        colour = strategy_colour(strategy_of.get(label, "?"))
        again = repeats.get(label, 0)
        if kind == "line":
            trace.update(line={"color": colour, "dash": DASHES[again % len(DASHES)]})
            trace.update(marker={"color": colour})
        else:
            trace.update(
                marker={"color": colour, "pattern": {"shape": PATTERNS[again % len(PATTERNS)]}}
            )


def recall_per_hop(curve: pd.DataFrame) -> go.Figure:
    """Cumulative gold-passage recall after hops 1, 2, 3, one line per run."""
    fig = px.line(
        curve,
        x="hop",
        y="recall",
        color="label",
        markers=True,
        labels={"recall": "cumulative gold recall", "label": "run"},
    )
    _by_run(fig, dict(zip(curve["label"], curve["strategy"], strict=True)), "line")
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(range=[0, 1.02])
    fig.update_layout(height=380, legend={"orientation": "h", "y": -0.25})
    return fig


def hop_histogram(hops: pd.DataFrame) -> go.Figure:
    """How many questions took 1, 2, 3 … hops, bars grouped by run (columns label, strategy,
    hops)."""
    fig = px.histogram(
        hops, x="hops", color="label", barmode="group", labels={"label": "run", "hops": "hops"}
    )
    _by_run(fig, dict(zip(hops["label"], hops["strategy"], strict=True)), "bar")
    fig.update_xaxes(dtick=1)
    fig.update_layout(height=380, yaxis_title="questions", legend={"orientation": "h", "y": -0.25})
    return fig


def calibration(table: pd.DataFrame) -> go.Figure:
    """Reliability diagram: bucket mean confidence vs observed success, one line per run
    (columns label, strategy and those of `experiments.scoring.calibration.reliability`)."""
    fig = px.line(
        table,
        x="mean_confidence",
        y="success_rate",
        color="label",
        markers=True,
        hover_data=["bucket", "questions"],
        labels={"mean_confidence": "confidence", "success_rate": "all gold passages retrieved"},
    )
    _by_run(fig, dict(zip(table["label"], table["strategy"], strict=True)), "line")
    fig.add_shape(type="line", x0=0, y0=0, x1=1, y1=1, line={"dash": "dash", "color": "grey"})
    fig.update_xaxes(range=[0, 1])
    fig.update_yaxes(range=[0, 1.05])
    return fig


def oracle(summary: pd.DataFrame, cost: str, strategy_of: Mapping[str, str]) -> go.Figure:
    """Total cost (of the metric `cost`: tokens or cost_usd) vs mean recall@k of each run
    (label → strategy in `strategy_of`), and of the perfect router as a star."""
    counted, recall = registry.get(cost), registry.get("recall_at_k")
    runs = summary[summary["run"] != ORACLE]
    router = summary[summary["run"] == ORACLE]
    fig = px.scatter(
        runs,
        x="total",
        y="recall",
        color="run",
        hover_data={"routed": True, "saves": ":.1%"},
        labels={"total": counted.total_heading, "recall": recall.heading},
    )
    for trace in fig.data:
        trace.update(marker={"color": strategy_colour(strategy_of.get(str(trace.name), "?"))})
    fig.add_trace(
        go.Scatter(
            x=router["total"],
            y=router["recall"],
            mode="markers",
            name="oracle (perfect router)",
            marker={"symbol": "star", "size": 18, "color": "black"},
        )
    )
    fig.update_traces(selector={"mode": "markers"}, marker_size=14)
    fig.update_yaxes(range=[0, 1.05])
    fig.update_layout(height=400, legend_title_text="", legend={"orientation": "h", "y": -0.25})
    if _is_money(counted.total_unit or counted.unit):
        _money_axis(fig)
    return fig
