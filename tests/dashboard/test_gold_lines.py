"""Where each gold passage went, as the Trace viewer says it under the failure tags."""

from __future__ import annotations

from caprag.schemas import RetrievedRef
from caprag.trace import HopTrace
from experiments.results.row import PassageInfo, QuestionRow
from experiments.scoring.failures import Corpus, found_at, gold_lines


def ref(pid: str, query: int = 0) -> RetrievedRef:
    return RetrievedRef(
        passage_id=pid, book_id=pid.split("/")[0], page=3, score=0.5, new=True, query=query
    )


def test_each_gold_passage_says_where_it_is_and_what_became_of_it() -> None:
    first = [ref("a/x"), ref("b/y", 1), ref("b/cut", 1)]
    hops = [
        HopTrace(hop=1, queries=["q1", "q2"], documents=first),
        HopTrace(hop=2, queries=["q3"], documents=[ref("c/late")]),
    ]
    row = QuestionRow(
        case_id="c",
        question_id="c",
        set="cross_book",
        query_type="factual",
        turn=1,
        question="?",
        gold_answer="!",
        hops=hops,
        context_ids=["a/x", "c/late"],
        gold_ids=["b/cut", "c/late", "d/never"],
        passages={"b/cut": PassageInfo(book_id="b", page=3, section="Cut")},
    )
    corpus = Corpus(passages={"d/never": PassageInfo(book_id="d", page=70, section="Rest")})
    assert found_at(row, "b/cut") == (1, 2, 2)  # hop 1, its second query, that query's rank 2
    assert found_at(row, "c/late") == (2, 1, 1)
    assert found_at(row, "d/never") is None
    assert gold_lines(row, corpus, never_note=" (its text is below the answer)") == [
        "- ✗ `b/cut` · b p. 3 · Cut — found by hop 1, query 2, rank 2; "
        "**not handed to generation** (cut at k)",
        "- ✓ `c/late` — found by hop 2, query 1, rank 1; handed to generation",
        "- ✗ `d/never` · d p. 70 · Rest — **never retrieved** (its text is below the answer)",
    ]
