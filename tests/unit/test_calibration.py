"""The reliability table behind the calibration plots."""

from __future__ import annotations

import pytest

from experiments.calibration import expected_calibration_error, reliability


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
