"""Plotly figures of the Compare page, built from the frames in data.py."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from experiments.dashboard.data import COST, QUALITY, pareto_front
from experiments.oracle import ORACLE


def cost_quality(runs: pd.DataFrame, cost: str, quality: str, selected: list[str]) -> go.Figure:
    """Each run as a point (cost vs quality), the Pareto front as a line, selected runs ringed."""
    frame = runs.dropna(subset=[cost, quality]).copy()
    frame["selected"] = frame["run_id"].isin(selected).map({True: "selected", False: "other"})
    fig = px.scatter(
        frame,
        x=cost,
        y=quality,
        color="strategy",
        symbol="selected",
        symbol_map={"selected": "circle-open-dot", "other": "circle"},
        hover_name="label",
        hover_data={"dataset": True, "llm": True, "run_id": True},
        labels={cost: COST.get(cost, cost), quality: QUALITY.get(quality, quality)},
    )
    front = frame[pareto_front(frame, cost, quality)].sort_values(cost)
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
    fig.update_traces(marker={"size": 11})
    fig.update_layout(height=420, legend_title_text="")
    return fig


def recall_per_hop(curve: pd.DataFrame) -> go.Figure:
    """Cumulative gold-passage recall after hops 1, 2, 3, one line per run."""
    fig = px.line(
        curve,
        x="hop",
        y="recall",
        color="label",
        line_dash="strategy",
        markers=True,
        labels={"recall": "cumulative gold recall", "label": "run"},
    )
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(range=[0, 1.02])
    fig.update_layout(height=380, legend={"orientation": "h", "y": -0.25})
    return fig


def hop_histogram(hops: pd.DataFrame) -> go.Figure:
    """How many questions took 1, 2, 3 … hops, bars grouped by run."""
    fig = px.histogram(
        hops, x="hops", color="label", barmode="group", labels={"label": "run", "hops": "hops"}
    )
    fig.update_xaxes(dtick=1)
    fig.update_layout(height=380, yaxis_title="questions", legend={"orientation": "h", "y": -0.25})
    return fig


def calibration(table: pd.DataFrame) -> go.Figure:
    """Reliability diagram: bucket mean confidence vs observed success, one line per run."""
    fig = px.line(
        table,
        x="mean_confidence",
        y="success_rate",
        color="label",
        markers=True,
        hover_data=["bucket", "questions"],
        labels={"mean_confidence": "confidence", "success_rate": "all gold passages retrieved"},
    )
    fig.add_shape(type="line", x0=0, y0=0, x1=1, y1=1, line={"dash": "dash", "color": "grey"})
    fig.update_xaxes(range=[0, 1])
    fig.update_yaxes(range=[0, 1.05])
    return fig


def oracle(summary: pd.DataFrame, cost: str) -> go.Figure:
    """Total cost vs mean recall@k of each run, and of the perfect router as a star."""
    runs = summary[summary["run"] != ORACLE]
    router = summary[summary["run"] == ORACLE]
    fig = px.scatter(
        runs,
        x="total",
        y="recall",
        color="run",
        hover_data={"routed": True, "saves": ":.1%"},
        labels={"total": f"total {cost}", "recall": "mean gold-passage recall@k"},
    )
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
    return fig
