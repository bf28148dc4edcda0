"""Paired significance between two runs: pairing with repeats, bootstrap CI, permutation p (the
CLI over an MLflow store: tests/integration/test_compare_cli.py)."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pandas as pd
import pytest

from experiments.results import metrics as registry
from experiments.scoring.significance import (
    MetricComparison,
    PairingError,
    compare_runs,
    pair_runs,
    paired_bootstrap_ci,
    paired_permutation_test,
    render_table,
    verdict,
)


def run_rows(
    values: dict[str, np.ndarray], repeats: int = 1, ids: list[str] | None = None
) -> pd.DataFrame:
    """A per-question table shaped like the harness's: one row per question and repeat."""
    n = next(iter(values.values())).shape[-1]
    ids = ids or [f"q{i:03d}" for i in range(n)]
    frames = [
        pd.DataFrame(
            {
                "case_id": ids,
                "question_id": ids,
                "set": "single_book",
                "query_type": "factual",
                "turn": 1,
                "question": [f"Question {q}?" for q in ids],
                "status": "ok",
                "error": "",
                "repeat": r,
                **{
                    name: column[r] if column.ndim == 2 else column
                    for name, column in values.items()
                },
            }
        )
        for r in range(repeats)
    ]
    return pd.concat(frames, ignore_index=True)


def synthetic_pair(
    n: int = 60, shift: float = 0.1, noise: float = 0.05, repeats: int = 1, seed: int = 0
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Runs A and B on the same questions: B scores `shift` higher and spends 200 more tokens."""
    rng = np.random.default_rng(seed)
    difficulty = rng.uniform(0.2, 0.7, n)  # shared by both runs: that is what pairing exploits
    tokens = rng.uniform(800, 1600, n)

    def run(offset: float, extra_tokens: float) -> pd.DataFrame:
        size = (repeats, n)
        return run_rows(
            {
                "f1": difficulty + offset + rng.normal(0, noise, size),
                "recall_at_k": difficulty + offset + rng.normal(0, noise, size),
                "tokens": tokens + extra_tokens + rng.normal(0, 20, size),
            },
            repeats,
        )

    return run(0.0, 0.0), run(shift, 200.0)


def by_metric(
    rows_a: pd.DataFrame, rows_b: pd.DataFrame, metrics: list[str] | None = None
) -> dict[str, MetricComparison]:
    """compare_runs keyed by metric name."""
    return {c.metric: c for c in compare_runs(rows_a, rows_b, metrics)}


NO_DIFFERENCE = "no significant difference on gold-passage recall@k, token F1, tokens"
"""The verdict on two identical runs (metrics named by their labels)."""


# --- the two tests -------------------------------------------------------------------------


def test_identical_runs_give_p_exactly_one() -> None:
    a, _ = synthetic_pair()
    results = compare_runs(a, a.copy())
    assert [c.metric for c in results] == ["recall_at_k", "f1", "tokens"]
    for c in results:
        assert c.p_value == 1.0 and c.diff == 0.0 and (c.ci_low, c.ci_high) == (0.0, 0.0)
        assert c.better() == "" and c.n_paired == 60
    assert paired_permutation_test([0.3] * 10, [0.3] * 10) == 1.0  # exact enumeration path too
    assert "no significant difference on gold-passage recall@k, token F1, tokens" in verdict(
        results
    )


def test_clearly_better_strategy_has_small_p_and_a_ci_around_the_true_gain() -> None:
    a, b = synthetic_pair(n=60, shift=0.1, noise=0.05, seed=3)
    results = by_metric(a, b)
    for name in ("f1", "recall_at_k"):
        c = results[name]
        assert c.p_value is not None and c.p_value < 0.01
        assert c.ci_low is not None and c.ci_high is not None
        assert 0.0 < c.ci_low < 0.1 < c.ci_high  # excludes 0, contains the true difference
        assert c.diff == pytest.approx(c.mean_b - c.mean_a)
        assert c.better() == "B"
    tokens = results["tokens"]
    assert tokens.ci_low is not None and tokens.ci_low < 200 < tokens.ci_high
    assert tokens.better() == "A"  # B spends more tokens: lower is better for cost
    line = verdict(list(results.values()))
    assert "B better on gold-passage recall@k, token F1" in line
    assert "A better on tokens" in line
    assert "(lower is better for tokens)" in line


def test_small_shift_buried_in_noise_is_not_called_significant() -> None:
    a, b = synthetic_pair(n=30, shift=0.005, noise=0.2, seed=1)
    c = by_metric(a, b)["f1"]
    assert c.p_value is not None and c.p_value > 0.05
    assert c.ci_low is not None and c.ci_low < 0 < c.ci_high and c.better() == ""


# --- the statistics ------------------------------------------------------------------------


def test_exact_permutation_test_counts_every_sign_pattern() -> None:
    # d = (1, 1, 1): only the all-plus and all-minus patterns reach |sum| = 3, so p = 2/8
    assert paired_permutation_test([0, 0, 0], [1, 1, 1]) == 0.25
    d = np.random.default_rng(7).normal(0.2, 1.0, 10)
    brute = np.mean(
        [abs(np.dot(s, d)) >= abs(d.sum()) - 1e-12 for s in itertools.product((1, -1), repeat=10)]
    )
    got = paired_permutation_test(np.zeros(10), d, seed=1)
    assert got == pytest.approx(brute) and got == paired_permutation_test(np.zeros(10), d, seed=2)


def test_monte_carlo_p_is_never_zero() -> None:
    d = np.linspace(1.0, 2.0, 40)  # all positive: no random sign pattern reaches the observed sum
    assert paired_permutation_test(np.zeros(40), d, n_permutations=999) == 1 / 1000


def test_permutation_p_is_calibrated_when_there_is_no_difference() -> None:
    rng = np.random.default_rng(11)
    ps = [
        paired_permutation_test(rng.normal(0, 1, 30), rng.normal(0, 1, 30), 500, seed=s)
        for s in range(300)
    ]
    assert 0.02 <= np.mean(np.array(ps) < 0.05) <= 0.09


def test_bootstrap_interval_covers_the_true_difference_about_95_percent_of_the_time() -> None:
    rng = np.random.default_rng(5)
    hits = []
    for s in range(300):
        a = rng.normal(0.5, 0.2, 40)
        b = a + 0.1 + rng.normal(0, 0.3, 40)
        ci = paired_bootstrap_ci(a, b, n_resamples=1000, seed=s)
        assert ci.diff == pytest.approx(np.mean(b - a)) and ci.low <= ci.diff <= ci.high
        hits.append(ci.low <= 0.1 <= ci.high)
    assert 0.90 <= np.mean(hits) <= 0.98


def test_bootstrap_of_a_constant_difference_is_that_constant() -> None:
    ci = paired_bootstrap_ci([1.0, 2.0, 3.0], [1.5, 2.5, 3.5], confidence=0.9)
    assert (ci.diff, ci.low, ci.high) == pytest.approx((0.5, 0.5, 0.5))


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="equally long"):
        paired_bootstrap_ci([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="NaN"):
        paired_permutation_test([1.0, float("nan")], [1.0, 2.0])
    with pytest.raises(ValueError, match="confidence"):
        paired_bootstrap_ci([1.0, 2.0], [2.0, 3.0], confidence=95)


def test_ten_thousand_resamples_of_300_questions_and_10_metrics_finish() -> None:
    """Speed is measured by `make bench`; here a generous deadline only catches a hang."""
    rng = np.random.default_rng(0)
    values = {m.name: rng.random(300) for m in registry.headline()}
    a = run_rows(values)
    b = run_rows({m: v + rng.normal(0.02, 0.1, 300) for m, v in values.items()})
    start = time.perf_counter()
    results = compare_runs(a, b, n_resamples=10_000)
    assert len(results) == 10 and all(c.p_value is not None for c in results)
    assert time.perf_counter() - start < 120


# --- pairing ---------------------------------------------------------------------------------


def test_repeats_are_averaged_per_question_before_pairing() -> None:
    a, b = synthetic_pair(n=40, repeats=3, seed=2)
    assert len(a) == 120
    pairing = pair_runs(a, b)
    assert len(pairing.paired) == 40 and not pairing.only_a and not pairing.only_b
    q = a[a["question_id"] == "q007"]["f1"]
    assert len(q) == 3 and pairing.means_a.loc["q007", "f1"] == pytest.approx(q.mean())
    averaged_a = a.groupby("question_id", as_index=False)[["f1", "recall_at_k", "tokens"]].mean()
    averaged_b = b.groupby("question_id", as_index=False)[["f1", "recall_at_k", "tokens"]].mean()
    with_repeats = by_metric(a, b)["f1"]
    assert with_repeats.n_paired == 40  # a question asked three times counts once
    assert with_repeats == by_metric(averaged_a, averaged_b)["f1"]
    assert "40 questions paired; 0 only in A, 0 only in B (A: 120 rows" in pairing.describe()


def test_failed_rows_and_missing_values_are_left_out_of_the_mean() -> None:
    a = run_rows({"f1": np.array([1.0, 0.5, 0.2])}, ids=["q1", "q2", "q3"])
    a = pd.concat([a, a.assign(f1=[0.0, np.nan, 0.4])], ignore_index=True)
    a.loc[3, "status"] = "failed"  # q1's second repeat failed: its 0.0 must not count
    b = run_rows({"f1": np.array([1.0, 1.0, 1.0])}, ids=["q1", "q2", "q3"])
    b.loc[2, "status"] = "failed"  # q3 failed in B: no value there, so not paired for f1
    pairing = pair_runs(a, b, ["f1"])
    assert pairing.means_a["f1"].to_dict() == pytest.approx({"q1": 1.0, "q2": 0.5, "q3": 0.3})
    c = by_metric(a, b, ["f1"])["f1"]
    assert (c.n_paired, c.only_a, c.only_b) == (2, 1, 0)
    assert (c.mean_a, c.mean_b) == pytest.approx((0.75, 1.0))


def test_unpaired_questions_are_reported() -> None:
    ids_a = [f"q{i}" for i in range(10)]
    ids_b = [f"q{i}" for i in range(6, 20)]
    a = run_rows({"f1": np.linspace(0, 1, 10)}, ids=ids_a)
    b = run_rows({"f1": np.linspace(0, 1, 14)}, ids=ids_b)
    pairing = pair_runs(a, b)
    assert pairing.paired == ["q6", "q7", "q8", "q9"]
    assert len(pairing.only_a) == 6 and len(pairing.only_b) == 10
    assert pairing.describe().startswith("4 questions paired; 6 only in A, 10 only in B")
    c = by_metric(a, b)["f1"]
    assert (c.n_paired, c.only_a, c.only_b) == (4, 6, 10)
    assert "6 only in A; 10 only in B" in render_table([c])


def test_metric_missing_in_one_run_is_reported_with_a_reason() -> None:
    a, b = synthetic_pair()
    a = a.drop(columns="f1")
    results = by_metric(a, b)
    assert list(results) == ["recall_at_k", "f1", "tokens"]  # in B only: still listed
    f1 = results["f1"]
    assert f1.p_value is None and f1.diff is None and f1.mean_a is None
    assert f1.reason == "run A did not log it"
    assert results["recall_at_k"].p_value is not None
    table = render_table(list(results.values()))
    f1_line = next(line for line in table.splitlines() if line.startswith("token F1 "))
    assert "—" in f1_line and "run A did not log it" in f1_line
    assert "not compared: token F1" in verdict(list(results.values()))
    asked = by_metric(a, b, ["recall_at_k", "judge_faithfulness"])["judge_faithfulness"]
    assert asked.reason == "run A did not log it; run B did not log it"


def test_too_few_paired_questions_is_a_reason_not_a_zero() -> None:
    a = run_rows({"f1": np.array([0.2, 0.4])}, ids=["q1", "q2"])
    b = run_rows({"f1": np.array([0.9, 0.8])}, ids=["q2", "q3"])
    c = by_metric(a, b)["f1"]
    assert c.n_paired == 1 and c.p_value is None and c.ci_low is None
    assert c.reason == "1 question(s) with a value in both runs; needs 2"
    every_row_failed = b.assign(status="failed")
    assert "run B has no value for it" in by_metric(a, every_row_failed)["f1"].reason


def test_a_table_without_question_ids_cannot_be_paired() -> None:
    a, b = synthetic_pair()
    with pytest.raises(PairingError, match=r"run B: .*no `question_id` column"):
        pair_runs(a, b.drop(columns="question_id"))


def test_tables_render_ci_as_an_interval_in_markdown_and_plain_text() -> None:
    a, b = synthetic_pair(seed=3)
    results = compare_runs(a, b, metrics=["f1"])
    c = results[0]
    markdown = render_table(results, markdown=True)
    assert markdown.splitlines()[0].split("|")[1:-1] == [
        " metric   ",
        " A     ",
        " B     ",
        " B − A  ",
        " 95% CI         ",
        " p      ",
        " n  ",
    ]
    assert f"[{c.ci_low:.3f}, {c.ci_high:.3f}]" in markdown and "<0.001" in markdown
    plain = render_table(results)
    assert plain.splitlines()[2].split() == [
        "token", "F1", f"{c.mean_a:.3f}", f"{c.mean_b:.3f}", f"+{c.diff:.3f}",
        f"[{c.ci_low:.3f},", f"{c.ci_high:.3f}]", "<0.001", "60",
    ]  # fmt: skip
