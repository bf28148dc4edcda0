"""Oracle routing over hand-made per-question rows of several runs."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments.scoring.oracle import ORACLE, OracleError, markdown, oracle_routing


def row(qid: str, recall: float | None, tokens: float, **extra: object) -> dict[str, object]:
    return {
        "question_id": qid,
        "set": extra.pop("set", "s"),
        "status": extra.pop("status", "ok"),
        "recall_at_k": recall,
        "tokens": tokens,
        "cost_usd": tokens / 1e6,
        **extra,
    }


SINGLE = [row("q1", 1.0, 100), row("q2", 0.5, 100), row("q3", 0.0, 100)]
DEEP = [row("q1", 1.0, 400), row("q2", 1.0, 400), row("q3", 0.5, 500)]


def test_each_question_goes_to_the_cheapest_run_at_its_best_recall() -> None:
    result = oracle_routing({"single": SINGLE, "deep": DEEP})
    assert result.choices["run"].to_dict() == {"q1": "single", "q2": "deep", "q3": "deep"}
    totals = {t.name: t for t in result.totals()}
    assert totals[ORACLE].total_cost == 100 + 400 + 500
    assert totals[ORACLE].mean_quality == pytest.approx((1.0 + 1.0 + 0.5) / 3)
    assert totals["deep"].total_cost == 1300
    assert result.saving("deep") == pytest.approx(1 - 1000 / 1300)
    assert result.saving("single") == pytest.approx(1 - 1000 / 300)
    assert result.best_single() == "deep"
    assert totals["single"].chosen == 1 and totals["deep"].chosen == 2


def test_a_cost_tie_goes_to_the_run_named_first() -> None:
    a = [row("q1", 1.0, 100)]
    b = [row("q1", 1.0, 100)]
    assert oracle_routing({"a": a, "b": b}).choices.loc["q1", "run"] == "a"
    assert oracle_routing({"b": b, "a": a}).choices.loc["q1", "run"] == "b"


def test_cost_can_be_usd_instead_of_tokens() -> None:
    a = [{**row("q1", 1.0, 100), "cost_usd": 5.0}]
    b = [{**row("q1", 1.0, 300), "cost_usd": 1.0}]
    assert oracle_routing({"a": a, "b": b}).choices.loc["q1", "run"] == "a"
    assert oracle_routing({"a": a, "b": b}, cost="cost_usd").choices.loc["q1", "run"] == "b"


def test_questions_without_recall_go_to_the_cheapest_run_and_count_as_unscored() -> None:
    a = [row("q1", 1.0, 100), row("u1", None, 300)]
    b = [row("q1", 1.0, 200), row("u1", None, 250)]
    result = oracle_routing({"a": a, "b": b})
    assert result.choices.loc["u1", "run"] == "b"
    assert result.unscored == 1
    oracle = result.totals()[-1]
    assert oracle.total_cost == 100 + 250
    assert oracle.mean_quality == 1.0, "mean quality is over the scored questions only"


def test_failed_or_missing_questions_are_left_out_of_every_total() -> None:
    a = [row("q1", 1.0, 100), row("q2", 1.0, 100, status="failed"), row("q3", 1.0, 100)]
    b = [row("q1", 0.0, 10), row("q2", 1.0, 10)]
    result = oracle_routing({"a": a, "b": b})
    assert list(result.choices.index) == ["q1"]
    assert result.left_out == 2
    assert [t.total_cost for t in result.totals()] == [100, 10, 100]


def test_repeats_are_averaged_per_question_before_routing() -> None:
    a = [row("q1", 1.0, 100, repeat=0), row("q1", 0.0, 300, repeat=1)]
    b = [row("q1", 0.6, 150)]
    result = oracle_routing({"a": a, "b": b})
    assert result.choices.loc["q1", "run"] == "b", "a averages 0.5 recall at 200 tokens"
    assert result.choices.loc["q1", "cost"] == 150


def test_dataframes_and_row_sequences_give_the_same_result() -> None:
    from_rows = oracle_routing({"single": SINGLE, "deep": DEEP})
    from_frames = oracle_routing({"single": pd.DataFrame(SINGLE), "deep": pd.DataFrame(DEEP)})
    pd.testing.assert_frame_equal(from_rows.summary(), from_frames.summary())


def test_by_set_splits_savings_per_question_set() -> None:
    a = [row("q1", 1.0, 100, set="easy"), row("q2", 0.0, 100, set="hard")]
    b = [row("q1", 1.0, 400, set="easy"), row("q2", 1.0, 400, set="hard")]
    sets = oracle_routing({"a": a, "b": b}).by_set().set_index("set")
    assert sets.loc["easy", "saves vs b"] == pytest.approx(0.75)
    assert sets.loc["hard", "saves vs b"] == pytest.approx(0.0)
    assert sets.loc["hard", "saves vs a"] == pytest.approx(1 - 400 / 100)
    assert sets.loc["hard", "oracle recall_at_k"] == 1.0


def test_bad_input_is_refused_with_a_reason() -> None:
    with pytest.raises(OracleError, match="at least two runs"):
        oracle_routing({"only": SINGLE})
    with pytest.raises(OracleError, match=r"'b'.*tokens"):
        oracle_routing({"a": SINGLE, "b": [{"question_id": "q1", "recall_at_k": 1.0}]})


def test_markdown_names_the_best_single_run_and_the_saving() -> None:
    text = markdown(oracle_routing({"single": SINGLE, "deep": DEEP}))
    assert "| oracle " in text
    assert "23.1% less than always running deep" in text
    assert "3 questions routed" in text
