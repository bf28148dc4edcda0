"""The verdict ending a run, sweep and summary: winner per set, CI and p, cost ratio, ≤ 10 lines."""

from __future__ import annotations

import pandas as pd

from experiments.scoring.verdict import MAX_LINES, Contender, verdict_lines


def _rows(recall: list[float], cost: float, set_name: str = "cross_book") -> pd.DataFrame:
    return pd.DataFrame(
        {
            "question_id": [f"{set_name}-{i}" for i in range(len(recall))],
            "set": set_name,
            "status": "ok",
            "recall_at_k": recall,
            "f1": [0.4] * len(recall),
            "exact_match": [0.0] * len(recall),
            "cost_usd": [cost] * len(recall),
        }
    )


def test_a_clear_winner_is_named_with_its_difference_interval_p_and_cost_ratio() -> None:
    hop = Contender("multi-hop", _rows([1.0] * 12, 0.0002), generator="rule")
    question = Contender("multi-question", _rows([0.5] * 12, 0.0001), generator="rule")
    lines = verdict_lines([question, hop], resamples=200)
    line = next(x for x in lines if x.strip().startswith("cross_book"))
    assert "multi-hop vs multi-question: gold-passage recall@k +0.500 [0.500, 0.500] p<0.001" in (
        line
    )
    assert "→ multi-hop wins on gold-passage recall@k;" in line
    assert "cost ×2.00 ($0.200 vs $0.100 per 1,000 q)" in line


def test_no_significant_difference_reads_as_a_tie() -> None:
    a = Contender("a", _rows([1.0, 0.0, 1.0, 0.0], 0.0001))
    b = Contender("b", _rows([0.0, 1.0, 1.0, 0.0], 0.0001))
    line = verdict_lines([a, b], resamples=200)[1]
    assert "→ no significant difference;" in line and "wins" not in line


def test_exact_match_zero_of_the_extractive_reader_is_explained() -> None:
    runs = [Contender(n, _rows([1.0, 0.5], 0.0001), generator="rule") for n in ("a", "b")]
    assert any("reads 0 by construction" in line for line in verdict_lines(runs, resamples=50))
    models = [Contender(n, _rows([1.0, 0.5], 0.0001), generator="llm") for n in ("a", "b")]
    assert not any("by construction" in line for line in verdict_lines(models, resamples=50))


def test_many_sets_stay_within_ten_lines_and_point_to_the_rest() -> None:
    frames = pd.concat([_rows([1.0, 0.5], 0.0001, f"set{i:02d}") for i in range(15)])
    runs = [Contender(n, frames, generator="rule") for n in ("a", "b")]
    lines = verdict_lines(runs, resamples=50)
    assert len(lines) <= MAX_LINES
    assert any("more sets" in line for line in lines)


def test_an_unanswerable_set_is_ranked_by_correct_refusal() -> None:
    rows = pd.DataFrame(
        {"question_id": ["u1", "u2"], "set": "unanswerable", "status": "ok",
         "correct_refusal": [1.0, 1.0], "cost_usd": [0.0001, 0.0001]}
    )  # fmt: skip
    line = verdict_lines([Contender("a", rows), Contender("b", rows)], resamples=50)[1]
    assert "correct refusal" in line
