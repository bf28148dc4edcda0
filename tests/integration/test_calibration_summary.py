"""The reliability table behind the calibration plots, and the adaptive summary (it reads hop
traces through experiments.results.runs, which imports MLflow: hence integration/)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from caprag.trace import HopTrace
from experiments.results.row import QuestionRow, table_of
from experiments.scoring.calibration import (
    adaptive_summary,
    expected_calibration_error,
    reliability,
    verdict_line,
)


def test_buckets_compare_confidence_with_observed_success() -> None:
    table = reliability([0.1, 0.15, 0.9, 0.95, 0.85], [0, 1, 1, 1, 0], bins=5)
    assert list(table["questions"]) == [2, 3]
    assert list(table["success_rate"]) == pytest.approx([0.5, 2 / 3])
    assert table["mean_confidence"].iloc[1] == pytest.approx(0.9)
    assert expected_calibration_error(table) == pytest.approx(0.4 * 0.375 + 0.6 * (0.9 - 2 / 3))


def test_perfectly_calibrated_has_zero_error() -> None:
    assert expected_calibration_error(reliability([1.0, 1.0, 0.0], [1, 1, 0])) == 0.0


def test_empty_input() -> None:
    assert reliability([], []).empty


def rows(
    tokens: list[float], recall: list[float], context: list[float], **extra: Any
) -> pd.DataFrame:
    """A run's table of adaptive questions, each stopping on its decision (one round)."""
    decisions = extra.pop("decisions", [None] * len(tokens))

    def row(i: int) -> QuestionRow:
        values = {
            "prompt_tokens": tokens[i],
            "recall_at_k": recall[i],
            "context_recall": context[i],
        }
        values.update({name: float(column[i]) for name, column in extra.items()})
        hop = HopTrace(hop=1, queries=["?"], depth=1, adaptive_decision=decisions[i])
        identity = {"case_id": f"q{i}", "question_id": f"q{i}", "set": "s", "turn": 1}
        return QuestionRow(
            **identity,
            query_type="factual",
            question="?",
            gold_answer="",
            values=values,
            hops=[hop],
        )

    return table_of([row(i) for i in range(len(tokens))])


def test_adaptive_summary_judges_the_targets_question_by_question() -> None:
    deep = rows([1000.0] * 4, [1.0, 1.0, 0.5, 0.5], [1.0, 1.0, 1.0, 1.0])
    auto = rows(
        [500.0, 500.0, 700.0, 700.0],
        [1.0, 1.0, 0.5, 0.5],
        [1.0, 1.0, 0.5, 1.0],
        confidence=[0.9, 0.9, 0.3, 0.7],
        depth=[1, 1, 2, 2],
        needed_2plus_rounds=[0.0, 0.0, 1.0, 1.0],
        reached_threshold=[1.0, 1.0, 0.0, 0.0],
        decisions=["sufficient", "sufficient", "no_new_evidence", "no_new_evidence"],
    )
    summary = adaptive_summary(auto, deep)
    assert summary["savings"] == pytest.approx(0.4)
    assert summary["recall_at_k_auto"] == summary["recall_at_k_deep"] == 0.75
    assert summary["context_recall_auto"] == pytest.approx(0.875)
    assert summary["stop:sufficient"] == summary["stop:no_new_evidence"] == 0.5
    assert summary["depth_1"] == 0.5 and summary["depth_3"] == 0.0
    assert summary["success_rate"] == 0.75 and summary["mean_confidence"] == pytest.approx(0.7)
    line = verdict_line(summary)
    assert "40.0% fewer prompt tokens" in line and "(met: target >= 40%" in line
    assert "+0.0 points; met" in line and "0.875 vs 1.000 (-12.5 points)" in line
    cheaper_but_worse = verdict_line({**summary, "recall_at_k_auto": 0.7, "savings": 0.3})
    assert "missed: target >= 40%, -10.0 points" in cheaper_but_worse
    assert "-5.0 points; missed" in cheaper_but_worse
