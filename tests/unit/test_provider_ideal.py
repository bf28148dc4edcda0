"""The provider bench's latency-bound ideal: cases through slots, repeats together or in turn."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from experiments.perf.provider import ideal_s
from experiments.support.openai_stub import request_key


@dataclass
class Call:
    messages: list[dict[str, Any]]


@dataclass
class Row:
    repeat: int
    case_id: str
    calls: list[Call] = field(default_factory=list)


def _row(repeat: int, case: str, *prompts: str) -> Row:
    return Row(repeat, case, [Call([{"role": "user", "content": p}]) for p in prompts])


def _served(*answers: tuple[str, float, int]) -> list[Any]:
    """The stub's log: (prompt, seconds drawn, status), in the order served."""
    return [
        {
            "key": request_key([{"role": "user", "content": prompt}]),
            "seconds": seconds if status == 200 else 0.0,
            "status": status,
            "retry_after": "1" if status == 429 else None,
        }
        for prompt, seconds, status in answers
    ]


def test_cases_go_to_the_first_free_slot_and_calls_add_up() -> None:
    rows = [_row(0, "a", "a1", "a2"), _row(0, "b", "b1"), _row(0, "c", "c1")]
    served = _served(("a1", 1.0, 200), ("b1", 0.0, 429), ("a2", 2.0, 200), ("b1", 1.0, 200))
    served += _served(("c1", 1.5, 200))
    # Two slots: a (3 s) and b (a 429's 1 s Retry-After, then 1 s), then c after b: 2 + 1.5.
    assert ideal_s(rows, served, 2) == 3.5


def test_repeats_in_turn_add_up_each_repeats_own_ideal() -> None:
    # The same prompt in two repeats: each use meets its own draw, in order.
    rows = [_row(0, "a", "slow"), _row(0, "b", "b"), _row(1, "a", "slow"), _row(1, "b", "b")]
    served = _served(("slow", 3.0, 200), ("b", 0.5, 200), ("slow", 1.0, 200), ("b", 0.5, 200))
    # Together: two slots hold 3, 0.5, 1, 0.5 -> ends at 3 s; in turn: 3 + 1.
    assert ideal_s(rows, served, 2) == 3.0
    assert ideal_s(rows, served, 2, repeats_in_turn=True) == 4.0
