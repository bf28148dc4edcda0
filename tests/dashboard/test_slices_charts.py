"""The charts' shared styling: one colour per strategy, Pareto points filled, dollar axes."""

from __future__ import annotations

import pandas as pd

from experiments.dashboard import charts


def runs(strategies: list[str]) -> pd.DataFrame:
    n = len(strategies)
    return pd.DataFrame(
        {
            "run_id": [f"r{i}" for i in range(n)],
            "label": [f"run {i}" for i in range(n)],
            "strategy": strategies,
            "dataset": "all",
            "llm": "offline",
            "cost_usd": [0.0001 * (i + 1) for i in range(n)],
            "tokens": [100.0 * (i + 1) for i in range(n)],
            "recall_at_k": [0.5, 0.9, 0.7, 0.95][:n],
        }
    )


def test_a_strategy_keeps_its_colour_whatever_is_selected() -> None:
    four = runs(["single", "multi-hop", "multi-question", "adaptive"])
    two = runs(["adaptive", "multi-hop"])
    colours = {
        frame_name: {
            t.name: t.marker.color
            for t in charts.cost_quality(frame, "tokens", "recall_at_k", []).data
            if t.name in set(frame["strategy"])
        }
        for frame_name, frame in (("four", four), ("two", two))
    }
    assert colours["two"]["adaptive"] == colours["four"]["adaptive"]
    assert colours["two"]["multi-hop"] == colours["four"]["multi-hop"]
    assert len(set(colours["four"].values())) == 4
    assert charts.strategy_colour("my-own") == charts.strategy_colour("my-own")


def test_pareto_points_are_filled_and_dominated_ones_are_rings() -> None:
    # run 2 (multi-question: 300 tokens, 0.7) is dominated by run 1 (200 tokens, 0.9)
    fig = charts.cost_quality(
        runs(["single", "multi-hop", "multi-question", "adaptive"]), "tokens", "recall_at_k", []
    )
    points = [t for t in fig.data if t.mode == "markers" and t.x is not None and t.x[0] is not None]
    symbols = {(t.legendgroup, t.marker.symbol) for t in points}
    assert symbols == {
        ("single", "circle"),
        ("multi-hop", "circle"),
        ("multi-question", "circle-open"),
        ("adaptive", "circle"),
    }
    ring = next(t for t in points if t.marker.symbol == "circle-open")
    assert ring.marker.line.width >= 2 and ring.marker.line.color == ring.marker.color


def test_usd_axes_read_as_dollars() -> None:
    fig = charts.cost_quality(runs(["single", "multi-hop"]), "cost_usd", "recall_at_k", [])
    assert fig.layout.xaxis.tickprefix == "$" and fig.layout.xaxis.tickformat.endswith("f")
    tokens = charts.cost_quality(runs(["single", "multi-hop"]), "tokens", "recall_at_k", [])
    assert tokens.layout.xaxis.tickprefix is None


def test_runs_of_one_strategy_share_its_colour_and_differ_by_dash() -> None:
    curve = pd.DataFrame(
        {
            "label": ["a", "a", "b", "b"],
            "strategy": ["adaptive", "adaptive", "adaptive", "adaptive"],
            "hop": [1, 2, 1, 2],
            "recall": [0.5, 0.7, 0.6, 0.8],
        }
    )
    lines = charts.recall_per_hop(curve).data
    assert {t.line.color for t in lines} == {charts.strategy_colour("adaptive")}
    assert len({t.line.dash for t in lines}) == 2
