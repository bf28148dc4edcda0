"""A model missing from the price table is priced as unknown (None), never as $0."""

from __future__ import annotations

from caprag.llm.usage import price, total_cost
from caprag.schemas import CallUsage
from caprag.trace import HopTrace
from experiments.scoring.question import spent_usd


def test_a_model_missing_from_the_table_has_no_price() -> None:
    assert price("my-finetune-7b", 1000, 100) is None
    assert price("gpt-4o-mini", 1_000_000, 0) == 0.15
    assert price("local", 1000, 100) == 0.0  # a free local server is priced 0 on purpose


def test_one_unknown_call_makes_the_total_unknown() -> None:
    assert total_cost([0.1, 0.2]) == 0.30000000000000004
    assert total_cost([0.1, None, 0.2]) is None
    assert total_cost([]) == 0.0
    hop = HopTrace(
        hop=1,
        queries=["q"],
        usage=[
            CallUsage(step="analyze", model="a", cost_usd=0.1),
            CallUsage(step="x", model="b", cost_usd=None),
        ],
    )
    assert hop.cost_usd is None


def test_what_a_run_paid_is_unknown_when_a_price_is() -> None:
    assert spent_usd(0.3, [0.1]) == 0.3 - 0.1
    assert spent_usd(None, []) is None
    assert spent_usd(0.3, [None]) is None
