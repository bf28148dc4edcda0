"""Calibration of a strategy's confidence: does 80 % confidence mean 80 % retrieval success?"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd


def reliability(
    confidence: Iterable[float], success: Iterable[float], bins: int = 5
) -> pd.DataFrame:
    """Per confidence bucket: mean confidence, observed success rate, number of questions."""
    frame = pd.DataFrame({"confidence": list(confidence), "success": list(success)}).dropna()
    if frame.empty:
        return pd.DataFrame(columns=["bucket", "mean_confidence", "success_rate", "questions"])
    edges = [i / bins for i in range(bins + 1)]
    labels = [f"{edges[i]:.1f}–{edges[i + 1]:.1f}" for i in range(bins)]
    frame["bucket"] = pd.cut(
        frame["confidence"].clip(0, 1), edges, labels=labels, include_lowest=True
    )
    grouped = frame.groupby("bucket", observed=True).agg(
        mean_confidence=("confidence", "mean"),
        success_rate=("success", "mean"),
        questions=("success", "size"),
    )
    return grouped.reset_index()


def expected_calibration_error(table: pd.DataFrame) -> float:
    """Question-weighted mean gap between confidence and success over the buckets."""
    if table.empty:
        return float("nan")
    weights = table["questions"] / table["questions"].sum()
    return float((weights * (table["mean_confidence"] - table["success_rate"]).abs()).sum())
