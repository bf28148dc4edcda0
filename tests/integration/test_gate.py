"""The regression gate's comparison: a drop beyond its tolerance is a regression, a small one is
not. (Here, not in unit/: experiments.cli.gate imports the harness, and with it MLflow.)"""

from __future__ import annotations

import pytest

from experiments.cli.gate import Tolerance, compare


def test_gate_flags_drops_beyond_tolerance_only() -> None:
    baseline = {"multi-hop/cross_book": {"recall_at_k": 0.80, "tokens": 1000.0}}
    steady = {"multi-hop/cross_book": {"recall_at_k": 0.79, "tokens": 1100.0}}
    dropped = {"multi-hop/cross_book": {"recall_at_k": 0.70, "tokens": 1300.0}}
    assert compare(baseline, steady)[1] == 0
    rows, regressions = compare(baseline, dropped)
    assert regressions == 2
    flagged = {r[1] for r in rows if r[-1] == "REGRESSION"}
    assert flagged == {"gold-passage recall@k", "tokens"}
    assert Tolerance(absolute=0.02).allowed(0.8, higher_is_better=True) == pytest.approx(0.78)
    assert Tolerance(relative=0.15).allowed(1000.0, higher_is_better=False) == pytest.approx(1150)
