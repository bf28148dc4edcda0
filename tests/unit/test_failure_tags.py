"""Failure tags on hand-built question rows: one rule per tag, as the harness keeps rows."""

from __future__ import annotations

from typing import Any

import pytest

from caprag.schemas import CallUsage, RetrievedRef
from caprag.steps.analyze import SufficiencyDecision
from caprag.trace import HopTrace
from experiments.results.row import PassageInfo, QuestionRow, rows_of, table_of
from experiments.scoring.failures import (
    ANSWER_MISSED,
    BUDGET_STOP,
    CITED_NOT_FOLLOWED,
    ERROR,
    GOLD_CUT,
    GOLD_NOT_RETRIEVED,
    PARSE_FAILURE,
    QUERY_DRIFT,
    STOPPED_EARLY,
    TIMEOUT,
    Corpus,
    drift,
    failed,
    failure_tags,
    overlap,
)

K = 4
QUESTION = "How many swings does the multi attack maneuver make with a veteran trainer?"


def hop(number: int, queries: list[str], found: list[str], **fields: Any) -> HopTrace:
    """One hop of a trace: the queries it searched and the passages it found."""
    documents = [
        RetrievedRef(passage_id=p, book_id=p.split("/")[0], page=1, score=1.0, new=True)
        for p in found
    ]
    return HopTrace(hop=number, queries=queries, documents=documents, **fields)


def analyzed(sufficient: bool, queries: list[str] | None = None) -> SufficiencyDecision:
    return SufficiencyDecision(sufficient=sufficient, new_queries=queries or [])


def row(hops: list[HopTrace], **fields: Any) -> QuestionRow:
    """A question's row as the harness keeps it."""
    base: dict[str, Any] = {
        "case_id": "q-1", "question_id": "q-1", "set": "s", "query_type": "factual", "turn": 1,
        "question": QUESTION, "gold_answer": "3", "gold_ids": ["a/x", "b/y"], "hops": hops,
    }  # fmt: skip
    base.update(fields)
    if "context_ids" not in fields:  # handed to generation: what the hops found, up to k
        found = dict.fromkeys(d.passage_id for h in hops for d in h.documents)
        base["context_ids"] = list(found)[:K]
    return QuestionRow(**base)


def test_a_clean_multi_hop_row_has_no_tag() -> None:
    trace = [
        hop(1, [QUESTION], ["a/x"], decision=analyzed(False, ["veteran trainer swings"])),
        hop(2, ["veteran trainer swings"], ["b/y"], decision=analyzed(True)),
    ]
    assert failure_tags(row(trace)) == []


def test_analyzer_stopped_early_when_it_said_sufficient_with_gold_missing() -> None:
    trace = [hop(1, [QUESTION], ["a/x", "c/z"], decision=analyzed(True))]
    assert failure_tags(row(trace)) == [GOLD_NOT_RETRIEVED, STOPPED_EARLY]
    # the same decision with every gold passage retrieved is right to stop
    assert failure_tags(row(trace, gold_ids=["a/x"])) == []
    # a question without gold passages (unanswerable) cannot be stopped early
    assert failure_tags(row(trace, gold_ids=[])) == []
    # adaptive's own "sufficient" decision counts too
    adaptive = [hop(1, [QUESTION], ["a/x"], adaptive_decision="sufficient", depth=1)]
    assert STOPPED_EARLY in failure_tags(row(adaptive))


def test_query_drift_when_a_query_shares_little_with_the_question() -> None:
    wandering = "fireball spell damage against undead in darkness"
    trace = [
        hop(1, [QUESTION], ["a/x"], decision=analyzed(False, [wandering])),
        hop(2, [wandering], ["b/y"], decision=analyzed(True)),
    ]
    assert overlap(wandering, QUESTION) == 0.0
    assert failure_tags(row(trace)) == [QUERY_DRIFT]
    # a hop query drawn from the question's words does not drift
    close = "veteran trainer multi attack swings"
    assert overlap(close, QUESTION) == 1.0
    assert drift(row([hop(1, [QUESTION, close], ["a/x", "b/y"])])) == 1.0
    # the rewrite is held against the question: a follow-up keeps its words
    # a later hop that follows what an earlier hop retrieved does not drift: the wandering
    # query's words are in hop 1's passage text
    found = hop(1, [QUESTION], ["a/x"], decision=analyzed(False, [wandering]))
    text = f"Veterans know: {wandering.capitalize()} (Arcana, p. 9)."
    passages = {"a/x": PassageInfo(book_id="a", page=1, text=text)}
    assert failure_tags(row([found, hop(2, [wandering], ["b/y"])], passages=passages)) == []
    # ... but the same query in the first hop, before any passage was read, does
    drifted = row([hop(1, [QUESTION, wandering], ["a/x"])])
    assert failure_tags(drifted) == [GOLD_NOT_RETRIEVED, QUERY_DRIFT]
    follow = row(
        [hop(1, ["level 3 Arcane Aptitude cost"], ["a/x", "b/y"])],
        question="And at level 3?",
        main_question="What does Arcane Aptitude cost at 3?",
    )
    assert QUERY_DRIFT not in failure_tags(follow)
    follow.main_question = "Which weapons may a dwarf wield?"
    assert failure_tags(follow) == [QUERY_DRIFT]


@pytest.mark.parametrize(
    ("last", "expected"),
    [
        ({"decision": analyzed(False, ["more"])}, [BUDGET_STOP]),  # wanted a hop, none left
        ({"adaptive_decision": "budget_exhausted:chunks", "depth": 2}, [BUDGET_STOP]),
        ({"adaptive_decision": "budget_exhausted:timeout", "depth": 2}, [TIMEOUT]),
        ({"adaptive_decision": "increase_depth", "depth": 2}, []),
    ],
)
def test_budget_stop_from_the_stop_reason(last: dict[str, Any], expected: list[str]) -> None:
    trace = [hop(1, [QUESTION], ["a/x", "b/y"], **last)]
    assert failure_tags(row(trace)) == expected


def test_timeout_and_error_for_a_question_that_ran_out_of_time() -> None:
    failed = row([], status="failed", error="timed out after 120s")
    assert failure_tags(failed) == [GOLD_NOT_RETRIEVED, TIMEOUT, ERROR]
    call = CallUsage(step="generate", model="m", error="LLMTimeoutError: no reply within 30s")
    assert failure_tags(row([], calls=[call], gold_ids=[])) == [TIMEOUT]


def test_parse_failure_from_a_call_that_never_parsed() -> None:
    call = CallUsage(step="analyze", model="m", attempts=3, error="unparseable reply: bad JSON")
    assert failure_tags(row([hop(1, [QUESTION], ["a/x", "b/y"])], calls=[call])) == [PARSE_FAILURE]
    retried = CallUsage(step="analyze", model="m", attempts=2)  # parsed at last
    assert failure_tags(row([hop(1, [QUESTION], ["a/x", "b/y"])], calls=[retried])) == []
    failed = row([], status="failed", error="StepFailedError: SufficiencyDecision never parsed")
    assert failure_tags(failed) == [GOLD_NOT_RETRIEVED, PARSE_FAILURE, ERROR]


def test_rows_read_back_from_a_table_keep_their_tags() -> None:
    hops = [hop(1, [QUESTION], ["a/x"], decision=analyzed(True))]
    logged = rows_of(table_of([row(hops), row([], status="failed", error="timed out after 9s")]))
    assert [failure_tags(r) for r in logged] == [
        [GOLD_NOT_RETRIEVED, STOPPED_EARLY],
        [GOLD_NOT_RETRIEVED, TIMEOUT, ERROR],
    ]


def test_a_gold_passage_cited_by_a_retrieved_one_but_never_retrieved() -> None:
    """The referenced passage is named in one the hops read ("(Combat, p. 110)") but no hop
    searched for it: `cited but not followed`, beside `gold not retrieved`."""
    corpus = Corpus(
        passages={
            "b/y": PassageInfo(book_id="b", page=110, section="Morale Check", text="Roll 2d10."),
            "b/other": PassageInfo(book_id="b", page=111, section="Rally", text="..."),
        },
        books={"combat": "b", "b": "b"},
    )
    citing = {"a/x": PassageInfo(book_id="a", page=1, text="+2 to Morale (Combat, p. 110).")}
    stopped = row([hop(1, [QUESTION], ["a/x"])], passages=citing)
    assert failure_tags(stopped, corpus=corpus) == [GOLD_NOT_RETRIEVED, CITED_NOT_FOLLOWED]
    # without the corpus the page of the missing passage is not known: only the first tag
    assert failure_tags(stopped) == [GOLD_NOT_RETRIEVED]
    # a citation of another page is not the gold passage's
    elsewhere = {"a/x": PassageInfo(book_id="a", page=1, text="See Combat, p. 111.")}
    other = row([hop(1, [QUESTION], ["a/x"])], passages=elsewhere)
    assert failure_tags(other, corpus=corpus) == [GOLD_NOT_RETRIEVED]


def test_gold_cut_at_k_and_answer_missed() -> None:
    both = [hop(1, [QUESTION], ["a/x", "b/y"])]
    assert failure_tags(row(both, context_ids=["a/x"])) == [GOLD_CUT]
    wrong = row(both, values={"f1": 0.2})
    assert failure_tags(wrong) == [ANSWER_MISSED]
    assert failure_tags(row(both, values={"f1": 0.8})) == []
    refused = row(both, values={"f1": 0.0, "false_refusal": 1.0})
    assert failure_tags(refused) == [ANSWER_MISSED]
    unanswerable = {"gold_ids": [], "gold_answer": ""}
    answered = row(both, values={"correct_refusal": 0.0, "f1": 0.0}, **unanswerable)
    assert failure_tags(answered) == [ANSWER_MISSED]
    declined = row(both, values={"correct_refusal": 1.0, "f1": 0.0}, **unanswerable)
    assert not failed(declined) and failure_tags(declined) == []


@pytest.mark.parametrize("status", ["ok", "failed", "timeout"])
@pytest.mark.parametrize("found", [[], ["a/x"], ["a/x", "b/y"], ["c/z"]])
@pytest.mark.parametrize("handed", [0, 1, 2])
@pytest.mark.parametrize("f1", [None, 0.0, 0.4, 1.0])
def test_a_failed_question_always_has_a_tag(
    status: str, found: list[str], handed: int, f1: float | None
) -> None:
    """Every way a question can fail leaves a tag: none of them reads "none"."""
    values = {} if f1 is None else {"f1": f1}
    checked = row(
        [hop(1, [QUESTION], found)], status=status, context_ids=found[:handed], values=values
    )
    assert not failed(checked) or failure_tags(checked), checked
