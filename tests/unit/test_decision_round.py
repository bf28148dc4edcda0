"""A decision-log round is a view of the hop it logs: the hop's own fields, no copy of them."""

from __future__ import annotations

import json

from caprag.schemas import CallUsage
from caprag.serve.decision_log import DecisionRecord, Round
from caprag.serve.services import stop_reason
from caprag.steps.analyze import SufficiencyDecision
from caprag.trace import HopTrace

CALL = CallUsage(step="analyze", model="m", prompt_tokens=300, completion_tokens=20, cost_usd=0.01)


def test_a_round_takes_the_hop_s_fields_its_outcome_and_its_costs() -> None:
    hop = HopTrace(
        hop=2,
        queries=["a", "b"],
        new_documents=3,
        latency_s=0.25,
        usage=[CALL, CALL],
        depth=2,
        chunks=15,
        confidence=0.6,
        threshold=0.9,
        adaptive_decision="increase_depth",
    )
    round_ = Round.model_validate(hop, from_attributes=True)
    assert round_.model_dump() == {
        "round": 2, "depth": 2, "chunks": 15, "confidence": 0.6, "threshold": 0.9,
        "decision": "increase_depth", "queries": 2, "new_documents": 3, "latency_s": 0.25,
        "prompt_tokens": 600, "completion_tokens": 40, "cost_usd": 0.02,
    }  # fmt: skip


def test_other_strategies_rounds_say_sufficient_next_or_done() -> None:
    def outcome(**fields: object) -> str:
        hop = HopTrace(hop=1, queries=["q"], **fields)  # type: ignore[arg-type]
        return Round.model_validate(hop, from_attributes=True).decision

    assert outcome(decision=SufficiencyDecision(sufficient=True)) == "sufficient"
    assert outcome(decision=SufficiencyDecision(sufficient=False)) == "next"
    assert outcome() == "done"
    wanted_more = HopTrace(hop=3, queries=["q"], decision=SufficiencyDecision(sufficient=False))
    assert stop_reason([wanted_more]) == "budget_exhausted:hops"


def test_a_logged_round_reads_back_as_it_was_written() -> None:
    hop = HopTrace(hop=1, queries=["q"], decision=SufficiencyDecision(sufficient=True))
    record = DecisionRecord(
        request_id="r",
        created_at="2026-01-01T00:00:00+00:00",
        thread_id="t",
        strategy="multi-hop",
        question="q",
        rounds=[Round.model_validate(hop, from_attributes=True)],
    )
    stored = json.loads(record.model_dump_json())
    assert stored["rounds"][0]["round"] == 1 and stored["rounds"][0]["decision"] == "sufficient"
    assert DecisionRecord.model_validate(stored) == record
    assert Round(round=4, decision="done").queries == 1
