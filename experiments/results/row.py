"""One question's outcome as a record: the row every journal, table, trace and page reads.

A `QuestionRow` is one pydantic object end to end: the journal, the row cache and the worker pipe
keep it as `model_dump_json()`, the MLflow table `questions.json` keeps it whole in its `row`
column beside flat scalar columns (identity, texts, `gold_hops` and every metric value, for pandas
filters and slices), and every reader takes it back with `rows_of`. Its hops are caprag's own
`HopTrace`s and its calls caprag's `CallUsage`s.

Tables logged before (`caprag.schema` 1: the lists and dicts as JSON text in the cells
`context_ids`, `gold_ids`, `missing`, `trace`, `timings`, `calls`) are read through one adapter,
`QuestionRow.from_legacy_record`, which `rows_of` and `normalised` apply to such a table.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from caprag.schemas import CallUsage
from caprag.trace import HopTrace

if TYPE_CHECKING:
    from caprag.serve.services import AskResult

SCHEMA = "2"
"""The `caprag.schema` tag of runs whose table holds whole rows (1: JSON text in cells)."""

MAX_HOPS_REPORTED = 3

PASSAGE_CHARS = 2000
"""Characters of a retrieved passage's text kept in the row (the rest cut, marked '…'): the
bundled books' passages are all shorter (longest 879), so this only bounds odd corpora."""

ROW = "row"
"""The table column holding each row whole (`QuestionRow.model_dump_json()`)."""
GOLD_HOPS = "gold_hops"
"""The table column holding each question's number of gold passages (the hops it needs)."""
SCALARS = (
    *("case_id", "question_id", "set", "query_type", "turn", "repeat"),
    *("question", "main_question", "gold_answer", "answer", "status", "error"),
)
"""The row's fields a table keeps as columns of their own (beside `gold_hops` and the metrics)."""


class PassageInfo(BaseModel):
    """A passage the question's hops returned, kept once per row: where it is and its text."""

    book_id: str = ""
    page: int = 0
    section: str = ""
    text: str = Field(
        default="",
        description="Its text, cut to PASSAGE_CHARS (the rest marked '…'); '' where not known.",
    )


def cut(text: str) -> str:
    """A passage's text as a row keeps it: at most PASSAGE_CHARS characters, then '…'."""
    return text if len(text) <= PASSAGE_CHARS else text[:PASSAGE_CHARS] + "…"


class QuestionRow(BaseModel):
    """One question's outcome: identity, what happened, metric values and missing reasons."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

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
    refused: bool = Field(
        default=False, description="The generator found no answer in the passages (its flag)."
    )
    context_ids: list[str] = Field(
        default_factory=list, description="The passages handed to generation, in rank order."
    )
    gold_ids: list[str] = Field(default_factory=list)
    values: dict[str, float] = Field(default_factory=dict, description="Metric values by name.")
    missing: dict[str, str] = Field(
        default_factory=dict, description="Why a metric has no value, by metric name."
    )
    hops: list[HopTrace] = Field(
        default_factory=list,
        description="What each hop of retrieval did. A hop's `usage` has no messages or reply: "
        "those are kept once, in `calls`.",
    )
    passages: dict[str, PassageInfo] = Field(
        default_factory=dict,
        description="Every passage a hop returned, by passage id: book, page, section, text.",
    )
    timings: dict[str, float] = Field(default_factory=dict, description="Seconds per node.")
    started_ns: int = Field(
        default=0,
        description="Wall-clock time (Unix nanoseconds) the question was asked; its trace "
        "starts there.",
    )
    calls: list[CallUsage] | None = Field(
        default_factory=list,
        description="Every LLM step of the turn in order: rule or model, tokens, and for a model "
        "call the messages as sent, the reply, attempts and any error. A question that failed on "
        "a call keeps that call. None: not recorded (a table logged before calls were).",
    )

    def add_answer(
        self,
        result: AskResult,
        sections: Mapping[str, str],
        texts: Callable[[str], str] = lambda _pid: "",
    ) -> None:
        """Keep what the pipeline did for this question: the answer, the passages handed to
        generation, the hops (their calls' messages and replies only in `calls`), each passage
        the hops returned (its section from `sections`, its text from `texts`, else the
        context's, cut to PASSAGE_CHARS) and every call."""
        self.main_question = result.main_question
        self.answer = result.answer
        self.refused = result.refused
        self.context_ids = [d.passage_id for d in result.context]
        self.timings = {**result.timings, "total": result.latency_s}
        self.hops = [_without_exchanges(hop) for hop in result.hops]
        context = {doc.passage_id: doc.text for doc in result.context}
        for hop in result.hops:
            for ref in hop.documents:
                if ref.passage_id not in self.passages:
                    self.passages[ref.passage_id] = PassageInfo(
                        book_id=ref.book_id,
                        page=ref.page,
                        section=sections.get(ref.passage_id, ""),
                        text=cut(texts(ref.passage_id) or context.get(ref.passage_id, "")),
                    )
        self.calls = list(result.usage)

    def is_gold(self, passage_id: str) -> bool:
        """Whether the passage is one of the question's gold passages."""
        return passage_id in self.gold_ids

    def retrieved_ids(self) -> list[str]:
        """Every passage a hop returned, in the order they first came."""
        return list(dict.fromkeys(ref.passage_id for hop in self.hops for ref in hop.documents))

    def passage(self, passage_id: str) -> PassageInfo:
        """What the row keeps of a passage (empty for one no hop returned, e.g. a gold passage
        never found)."""
        return self.passages.get(passage_id) or PassageInfo()

    def calls_by_node(self) -> tuple[list[CallUsage], list[list[CallUsage]], list[CallUsage]]:
        """The calls by the node that made them, in the order the turn made them: rewrite, each
        hop's (as many as its usage), generate."""
        calls = list(self.calls or [])
        rewrite = [calls.pop(0)] if calls and calls[0].step == "rewrite" else []
        generate = [calls.pop()] if calls and calls[-1].step == "generate" else []
        hops = []
        for hop in self.hops:
            hops.append(calls[: len(hop.usage)])
            calls = calls[len(hop.usage) :]
        return rewrite, hops, generate

    def record(self) -> dict[str, Any]:
        """The row as one record of a table: its scalars flat (identity, texts, `gold_hops`,
        each metric by name) and the whole row as JSON in `row`."""
        return {
            **{name: getattr(self, name) for name in SCALARS},
            GOLD_HOPS: len(self.gold_ids),
            ROW: self.model_dump_json(),
            **self.values,
        }

    @classmethod
    def from_legacy_record(cls, record: Mapping[Any, Any]) -> QuestionRow:
        """A row of a table logged before rows were kept whole (schema 1): scalar columns, the
        lists and dicts as JSON text, each metric a column. A column the table lacks (an older
        one still) leaves its field empty; `calls` stays None (not recorded) without its column.
        Each document's `section` and `text` (its first appearance) become the row's passages."""
        trace = _decoded(record.get("trace")) or []
        hops = [HopTrace.model_validate(hop) for hop in trace]
        passages: dict[str, PassageInfo] = {}
        for hop in trace:
            for doc in hop.get("documents") or []:
                info = passages.setdefault(
                    doc["passage_id"],
                    PassageInfo(
                        book_id=doc.get("book_id", ""),
                        page=doc.get("page", 0),
                        section=doc.get("section") or "",
                    ),
                )
                if doc.get("text") and not info.text:
                    info.text = doc["text"]
        calls = _decoded(record.get("calls"))
        return cls(
            case_id=_text(record.get("case_id")) or _text(record.get("question_id")),
            question_id=_text(record.get("question_id")),
            set=_text(record.get("set")),
            query_type=_text(record.get("query_type")),
            turn=_whole(record.get("turn"), 1),
            repeat=_whole(record.get("repeat"), 0),
            question=_text(record.get("question")),
            main_question=_text(record.get("main_question")),
            gold_answer=_text(record.get("gold_answer")),
            answer=_text(record.get("answer")),
            status=_text(record.get("status")) or "ok",
            error=_text(record.get("error")),
            context_ids=_decoded(record.get("context_ids")) or [],
            gold_ids=_decoded(record.get("gold_ids")) or [],
            values={
                name: float(value)
                for name, value in record.items()
                if name not in LEGACY_COLUMNS and _number(value)
            },
            missing=_decoded(record.get("missing")) or {},
            hops=hops,
            passages=passages,
            timings=_decoded(record.get("timings")) or {},
            calls=None if calls is None else [CallUsage.model_validate(c) for c in calls],
        )


LEGACY_COLUMNS = frozenset(
    {*SCALARS, *("context_ids", "gold_ids", "missing", "trace", "timings", "calls")}
)
"""The columns of a schema-1 table that are not metrics."""

ROWS = TypeAdapter(list[QuestionRow])
"""Several rows as one JSON list (`ROWS.dump_json(rows)`, `ROWS.validate_json(blob)`)."""


def rows_of(table: pd.DataFrame) -> list[QuestionRow]:
    """The rows of a per-question table, in its order: each whole from its `row` column, or
    from the columns of a table logged before rows were kept whole (schema 1)."""
    if ROW in table.columns:
        return [QuestionRow.model_validate_json(text) for text in table[ROW]]
    return [QuestionRow.from_legacy_record(r) for r in table.to_dict("records")]


def table_of(rows: Sequence[QuestionRow]) -> pd.DataFrame:
    """The rows as a per-question table (`QuestionRow.record` each)."""
    return pd.DataFrame.from_records([row.record() for row in rows])


def normalised(table: pd.DataFrame) -> pd.DataFrame:
    """A per-question table in the current form: a schema-1 table rebuilt from its rows (its
    index kept, and a column it lacked still absent: `gold_hops` without `gold_ids`), any other
    as it is."""
    if ROW in table.columns or table.empty:
        return table
    out = table_of(rows_of(table))
    out.index = table.index
    lacking = [c for c in SCALARS if c not in table.columns]
    if "gold_ids" not in table.columns:
        lacking.append(GOLD_HOPS)
    return out.drop(columns=lacking)


def _without_exchanges(hop: HopTrace) -> HopTrace:
    """The hop with its calls' messages and replies left out (the row's `calls` keep them)."""
    usage = [call.model_copy(update={"messages": None, "reply": None}) for call in hop.usage]
    return hop.model_copy(update={"usage": usage})


def _decoded(value: Any) -> Any:
    """A schema-1 cell's JSON text decoded; None for an absent or empty cell, or one that is not
    JSON (what it held is not recorded: shown as such, never guessed)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return None


def _text(value: Any) -> str:
    return str(value) if value is not None and not _nan(value) else ""


def _whole(value: Any, default: int) -> int:
    return int(value) if _number(value) else default


def _number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and not _nan(value)


def _nan(value: Any) -> bool:
    return isinstance(value, numbers.Real) and math.isnan(value)
