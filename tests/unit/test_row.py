"""One typed row, end to end: the journal, the row cache, the worker pipe and the table give back
the row they were given, and a table logged before rows were kept whole opens as rows."""

from __future__ import annotations

import json
import math
import multiprocessing
from pathlib import Path

import pandas as pd
import pytest

from caprag.schemas import CallUsage, RetrievedRef
from caprag.steps.analyze import SufficiencyDecision
from caprag.trace import HopTrace
from experiments.harness.data import EvalCase
from experiments.harness.journal import Journal
from experiments.harness.reuse import RowCache
from experiments.results.questions import GoldQuestion
from experiments.results.row import (
    GOLD_HOPS,
    LEGACY_COLUMNS,
    ROW,
    ROWS,
    PassageInfo,
    QuestionRow,
    normalised,
    rows_of,
    table_of,
)

LEGACY_TABLE = Path(__file__).resolve().parents[1] / "fixtures" / "legacy" / "questions.json"
MESSAGES = [{"role": "system", "content": "Decide."}, {"role": "user", "content": "Q: ü €?"}]


def ref(pid: str, new: bool = True) -> RetrievedRef:
    return RetrievedRef(passage_id=pid, book_id=pid.split("/")[0], page=7, score=0.25, new=new)


def full_row(question_id: str = "cb-1") -> QuestionRow:
    """A row with every part filled: two hops (an analyzer's and an adaptive round), passages,
    a model call and a rule call, values, missing reasons and timings."""
    analyze = CallUsage(
        step="analyze", model="gpt-4o-mini", prompt_tokens=400, completion_tokens=30,
        cost_usd=7.8e-05, latency_s=0.5, started_at=1_700_000_000.25, counted="reported",
        prompt_version="analyze-v2", messages=MESSAGES, reply='{"sufficient": false}',
        attempts=2, notes=["cut 1 query"],
    )  # fmt: skip
    generate = CallUsage(step="generate", model="offline", prompt_tokens=90, completion_tokens=9)
    return QuestionRow(
        case_id="case",
        question_id=question_id,
        set="cross_book",
        query_type="decision",
        turn=2,
        repeat=1,
        question="Which gift halves the Flurry penalty?",
        main_question="Which gift halves the penalty of a Flurry's second attack?",
        gold_answer="Old Soldier",
        answer="Old Soldier.",
        context_ids=["fighting/flurry", "gifts/old-soldier"],
        gold_ids=["gifts/old-soldier"],
        values={"recall_at_k": 1.0, "tokens": 529.0, "latency_s": 0.75},
        missing={"correct_refusal": "question is answerable"},
        hops=[
            HopTrace(
                hop=1,
                queries=["flurry penalty"],
                documents=[ref("fighting/flurry")],
                new_documents=1,
                decision=SufficiencyDecision(sufficient=False, new_queries=["old soldier"]),
                usage=[analyze.model_copy(update={"messages": None, "reply": None})],
                latency_s=0.6,
            ),
            HopTrace(
                hop=2,
                queries=["old soldier"],
                documents=[ref("fighting/flurry", new=False), ref("gifts/old-soldier")],
                new_documents=1,
                duplicate_documents=1,
                depth=2,
                chunks=15,
                confidence=0.93,
                confidence_signals={"coverage": 1.0},
                threshold=0.85,
                query_type="decision",
                adaptive_decision="sufficient",
            ),
        ],
        passages={
            "fighting/flurry": PassageInfo(book_id="fighting", page=7, section="Flurry", text="A"),
            "gifts/old-soldier": PassageInfo(book_id="gifts", page=7, text="Halves it.\n  B"),
        },
        timings={"rewrite": 0.1, "retrieve": 0.6, "generate": 0.05, "total": 0.75},
        started_ns=1_700_000_000_000_000_000,
        calls=[analyze, generate],
    )


def test_a_row_survives_its_json_whole_nan_included() -> None:
    row = full_row()
    assert QuestionRow.model_validate_json(row.model_dump_json()) == row
    assert ROWS.validate_json(ROWS.dump_json([row, row])) == [row, row]
    odd = row.model_copy(update={"values": {"recall_at_k": math.nan, "f1": math.inf}})
    back = QuestionRow.model_validate_json(odd.model_dump_json())
    assert math.isnan(back.values["recall_at_k"]) and back.values["f1"] == math.inf


def test_a_row_of_another_shape_is_refused_not_half_read() -> None:
    written = json.loads(full_row().model_dump_json())
    written["trace"] = written.pop("hops")  # a row journaled by an older caprag
    with pytest.raises(ValueError, match="trace"):
        QuestionRow.model_validate(written)


def test_the_derived_views_readers_use() -> None:
    row = full_row()
    assert row.retrieved_ids() == ["fighting/flurry", "gifts/old-soldier"]
    assert [row.is_gold(pid) for pid in row.retrieved_ids()] == [False, True]
    assert row.passage("gifts/old-soldier").text == "Halves it.\n  B"
    assert row.passage("never/found") == PassageInfo()
    rewrite, hops, generate = row.calls_by_node()
    assert rewrite == [] and [len(calls) for calls in hops] == [1, 0]
    assert hops[0][0].messages == MESSAGES  # the row's call, with what was sent
    assert [call.step for call in generate] == ["generate"]


def test_the_journal_gives_back_the_rows_it_was_given(tmp_path: Path) -> None:
    rows = [full_row("t-1"), full_row("t-2")]
    journal = Journal(tmp_path, "run").open()
    journal.append("1:case", rows)
    journal.close()
    assert Journal(tmp_path, "run").done() == {"1:case": rows}


def test_a_journal_line_of_an_older_caprag_is_asked_again(tmp_path: Path) -> None:
    journal = Journal(tmp_path, "run").open()
    journal.append("0:new", [full_row()])
    journal.close()
    old = {"case_id": "c", "question_id": "q", "set": "s", "query_type": "factual", "turn": 1,
           "question": "?", "gold_answer": "", "trace": [{"hop": 1, "queries": ["q"]}]}  # fmt: skip
    with journal.path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"case": "0:old", "rows": [old]}) + "\n")
    assert list(Journal(tmp_path, "run").done()) == ["0:new"]


def test_the_row_cache_gives_back_the_rows_marked_as_reused(tmp_path: Path) -> None:
    turn = GoldQuestion(
        id="cb-1", question="Which gift?", answer="Old Soldier", gold_passages=["gifts/x"],
        hops=1, books=["gifts"], query_type="decision",
    )  # fmt: skip
    case = EvalCase(id="case", set="cross_book", turns=(turn,))
    row = full_row()
    cache = RowCache(tmp_path / "cache.sqlite", "fingerprint")
    assert cache.put(1, case, [row])
    (got,) = cache.get(1, case) or []
    cache.close()
    assert [call.cached for call in got.calls or []] == [True, True]
    assert got.model_copy(update={"calls": row.calls}) == row
    assert row.calls is not None and not any(call.cached for call in row.calls)  # a copy


def _echo(connection: multiprocessing.connection.Connection) -> None:
    """A worker's half: read rows as JSON, send them back as JSON."""
    rows = ROWS.validate_json(connection.recv())
    connection.send(ROWS.dump_json(rows))


def test_the_worker_pipe_carries_rows_whole() -> None:
    rows = [full_row("t-1"), full_row("t-2")]
    parent, child = multiprocessing.get_context("spawn").Pipe()
    worker = multiprocessing.get_context("spawn").Process(target=_echo, args=(child,))
    worker.start()
    try:
        parent.send(ROWS.dump_json(rows))
        assert parent.poll(600), "the worker answered nothing"
        assert ROWS.validate_json(parent.recv()) == rows
    finally:
        worker.join(600)
    assert worker.exitcode == 0


def test_a_table_keeps_scalars_flat_and_each_row_whole() -> None:
    rows = [full_row("t-1"), full_row("t-2").model_copy(update={"gold_ids": []})]
    table = table_of(rows)
    assert list(table["question_id"]) == ["t-1", "t-2"]
    assert list(table[GOLD_HOPS]) == [1, 0]
    assert list(table["recall_at_k"]) == [1.0, 1.0]  # every metric its own column
    assert table[table["set"] == "cross_book"]["tokens"].sum() == 1058.0
    assert rows_of(table) == rows
    assert normalised(table) is table  # already in the current form
    assert rows_of(table.iloc[[1]]) == rows[1:]  # one row, without reading the others
    assert set(table.columns) >= {ROW, "status", "error", "answer", "turn", "repeat"}


def legacy_table() -> pd.DataFrame:
    return pd.read_json(LEGACY_TABLE, orient="split")


def test_a_table_logged_before_whole_rows_opens_as_rows() -> None:
    legacy = legacy_table()
    rows = rows_of(legacy)
    assert [r.question_id for r in rows] == [
        "cb-a-001", "fu-001-1", "fu-001-2", "cb-a-001", "sb-core-001",
    ]  # fmt: skip
    multi_hop, first, follow_up, adaptive, failed = rows
    # Hops typed, with what the table kept per document: section, gold flag, text once.
    assert [h.hop for h in multi_hop.hops] == [1, 2, 3]
    assert multi_hop.hops[0].decision is not None and multi_hop.hops[-1].decision is None
    for row, record in zip(rows, legacy.to_dict("records"), strict=True):
        documents = [d for hop in json.loads(record["trace"]) for d in hop["documents"]]
        for doc in documents:
            assert row.is_gold(doc["passage_id"]) == doc["gold"]
            assert row.passage(doc["passage_id"]).section == doc["section"]
        texts = {d["passage_id"]: d["text"] for d in documents if "text" in d}
        assert {pid: p.text for pid, p in row.passages.items()} == texts
        metrics = {k: v for k, v in record.items() if k not in LEGACY_COLUMNS}
        assert row.values == {k: v for k, v in metrics.items() if not math.isnan(v)}
    assert multi_hop.passage("talents/trained-by-a-veteran").text.startswith("Cost 10 MP.")
    # Calls typed: the model's messages and reply kept; each hop's usage lines up with them.
    assert [(c.step, c.model) for c in follow_up.calls or []] == [
        ("rewrite", "stub-model"), ("analyze", "offline"), ("generate", "stub-model"),
    ]  # fmt: skip
    assert follow_up.calls is not None and follow_up.calls[0].messages
    rewrite, hop_calls, generate = follow_up.calls_by_node()
    assert len(rewrite) == len(generate) == 1 and [len(c) for c in hop_calls] == [1]
    assert [(h.depth, h.adaptive_decision) for h in adaptive.hops] == [
        (1, "increase_depth"), (2, "top_k_unchanged"),
    ]  # fmt: skip
    assert (failed.status, failed.error, failed.hops, failed.calls) == (
        "failed", "timed out after 0.001s", [], [],
    )  # fmt: skip
    assert first.turn == 1 and follow_up.turn == 2 and follow_up.case_id == "fu-001"


def test_a_legacy_table_in_the_current_form_keeps_its_scalars() -> None:
    legacy = legacy_table()
    table = normalised(legacy)
    for column in ("question_id", "set", "status", "error", "turn", "recall_at_k", "depth"):
        pd.testing.assert_series_equal(table[column], legacy[column], check_dtype=False)
    assert list(table[GOLD_HOPS]) == [2, 1, 1, 2, 1]
    assert rows_of(table) == rows_of(legacy)
    assert not {"trace", "calls", "gold_ids"} & set(table.columns)
