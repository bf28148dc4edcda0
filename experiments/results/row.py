"""One question's outcome as a record: the row every journal, table, trace and page reads."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

MAX_HOPS_REPORTED = 3

PASSAGE_CHARS = 2000
"""Characters of a retrieved passage's text kept in the row's trace (the rest cut, marked '…'):
the bundled books' passages are all shorter (longest 879), so this only bounds odd corpora."""


@dataclass
class QuestionRow:
    """One question's outcome: identity, what happened, metric values and missing reasons."""

    case_id: str
    question_id: str
    set: str
    query_type: str
    turn: int
    question: str
    gold_answer: str
    repeat: int = 0
    status: str = "ok"
    error: str = ""
    main_question: str = ""
    answer: str = ""
    context_ids: list[str] = field(default_factory=list)
    gold_ids: list[str] = field(default_factory=list)
    values: dict[str, float] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    trace: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    started_ns: int = 0
    """Wall-clock time (Unix nanoseconds) the question was asked; its trace starts there."""
    calls: list[dict[str, Any]] = field(default_factory=list)
    """Every LLM step of the turn in order (CallUsage as data): rule or model, tokens, and for a
    model call the messages as sent, the reply, attempts and any error. A question that failed on
    a call keeps that call."""

    def record(self) -> dict[str, Any]:
        """A flat row for tables (MLflow, pandas): lists and dicts as JSON strings."""
        row: dict[str, Any] = {
            "case_id": self.case_id,
            "question_id": self.question_id,
            "set": self.set,
            "query_type": self.query_type,
            "turn": self.turn,
            "repeat": self.repeat,
            "question": self.question,
            "main_question": self.main_question,
            "gold_answer": self.gold_answer,
            "answer": self.answer,
            "status": self.status,
            "error": self.error,
            "context_ids": json.dumps(self.context_ids),
            "gold_ids": json.dumps(self.gold_ids),
            "missing": json.dumps(self.missing),
            "trace": json.dumps(self.trace),
            "timings": json.dumps(self.timings),
            "calls": json.dumps(self.calls),
        }
        row.update(self.values)
        return row

    def to_json(self) -> dict[str, Any]:
        """Every field as JSON-ready data (the journal of a run stores rows this way). Its lists
        and dicts are the row's own, not deep copies (`asdict` cost ~1 ms per row, on the event
        loop, for a line that is only serialized)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QuestionRow:
        """The row `to_json` wrote."""
        return cls(**data)
