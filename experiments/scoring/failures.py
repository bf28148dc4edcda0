"""Failure tags: why a question went wrong, read from its row (hops, calls, status).

Each tag is a rule over what the harness logs for every question (and, for a citation, where the
corpus puts the passage cited). A question failed (`failed`) when it did not run to the end, a gold
passage did not reach generation, or its answer missed (a token F1 below `ANSWER_F1`, a refusal of
an answerable question, an answer to an unanswerable one); every failed question carries at least
one tag, so none reads "none":

- `gold not retrieved`: some gold passage was returned by no hop.
- `cited but not followed`: a gold passage no hop returned is cited by a passage a hop did return
  ("(Combat, p. 110)": the citation's book and page are the gold passage's). It needs the corpus
  (`Corpus`): a row keeps only the passages its hops returned.
- `gold cut at k`: a hop returned a gold passage but it was not among the k handed to generation.
- `analyzer stopped early`: a hop's sufficiency decision (the multi-hop analyzer's `sufficient`,
  or adaptive's `sufficient` decision) ended retrieval while some gold passage was still not among
  the passages retrieved so far.
- `query drift`: a query issued for the question shares little with it. A query's overlap is the
  share of its content terms (`caprag.text.terms`: lower-cased, stop words out, lightly stemmed)
  that also occur in the question or its standalone form; the rewrite (`main_question`) is held
  against the question alone. A question drifts when some query's overlap is below
  `DRIFT_THRESHOLD` (0.25: fewer than one content term in four comes from the question).
- `budget stop`: retrieval ended on a budget (`budget_exhausted:<budget>`, as
  `caprag.serve.services.stop_reason` names it: hops, depth, iterations, chunks…) other than time.
- `timeout`: the question ran out of time: the harness's per-question limit, an LLM call's time
  limit, or adaptive's timeout budget.
- `parse failure`: an LLM reply could not be parsed (a call recorded `unparseable reply`, or the
  question failed on a structured-output error).
- `answer missed`: every gold passage reached generation (or the question needs none), yet the
  answer missed: token F1 below `ANSWER_F1`, a refusal of an answerable question, or an answer to
  an unanswerable one.
- `error`: the question failed (status other than ok).
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from caprag.errors import CapragError
from caprag.retrieval.books import Book, load_books
from caprag.serve.services import stop_reason
from caprag.text import iter_citations, terms
from caprag.trace import HopTrace
from experiments.results.row import PassageInfo, QuestionRow, rows_of

GOLD_NOT_RETRIEVED = "gold not retrieved"
CITED_NOT_FOLLOWED = "cited but not followed"
GOLD_CUT = "gold cut at k"
ANSWER_MISSED = "answer missed"
STOPPED_EARLY = "analyzer stopped early"
QUERY_DRIFT = "query drift"
BUDGET_STOP = "budget stop"
TIMEOUT = "timeout"
PARSE_FAILURE = "parse failure"
ERROR = "error"
TAGS = (
    *(GOLD_NOT_RETRIEVED, CITED_NOT_FOLLOWED, GOLD_CUT, STOPPED_EARLY, QUERY_DRIFT, BUDGET_STOP),
    *(TIMEOUT, PARSE_FAILURE, ANSWER_MISSED, ERROR),
)
DRIFT_THRESHOLD = 0.25
ANSWER_F1 = 0.5
"""Token F1 below which an answer missed (SQuAD's F1: half the words of the gold answer)."""
BUDGET = "budget_exhausted:"
UNPARSEABLE = "unparseable reply"
TIMED_OUT = re.compile(r"timed out|timeout", re.IGNORECASE)
PARSE_ERRORS = ("StepFailedError", "StructuredOutputError")


@dataclass(frozen=True)
class Corpus:
    """Where the corpus puts each passage (what a row does not keep of a passage no hop returned)
    and the names a citation may give a book (its short name, id or title, lower-cased)."""

    passages: Mapping[str, PassageInfo] = field(default_factory=dict)
    books: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, books: Iterable[Book]) -> Corpus:
        """The corpus of parsed books (`caprag.retrieval.books.load_books`)."""
        passages: dict[str, PassageInfo] = {}
        names: dict[str, str] = {}
        for book in books:
            meta = book.meta
            for name in (meta.short, meta.book_id, meta.title):
                names[name.lower()] = meta.book_id
            for p in book.passages:
                passages[p.passage_id] = PassageInfo(
                    book_id=meta.book_id, page=p.page, section=p.section, text=p.text
                )
        return cls(passages, names)

    @classmethod
    def of_folder(cls, folder: str | Path) -> Corpus:
        """The corpus of a books folder; empty when the folder is not one (a benchmark's passages
        are not books)."""
        try:
            return cls.of(load_books(folder))
        except (CapragError, OSError):
            return cls()

    def cited(self, text: str) -> set[tuple[str, int]]:
        """The (book id, page) of each citation in a text whose book the corpus knows."""
        found = set()
        for short, page, _ in iter_citations(text):
            book = self.books.get(short.lower())
            if book is not None:
                found.add((book, page))
        return found


def failed(row: QuestionRow) -> bool:
    """Whether the question went wrong: it did not run to the end, a gold passage did not reach
    generation, or the answer missed (see `answer_missed`)."""
    return (
        row.status != "ok"
        or not set(row.gold_ids) <= set(row.context_ids)
        or answer_missed(row.values)
    )


def answer_missed(values: Mapping[str, float]) -> bool:
    """Token F1 below ANSWER_F1 (an answerable question), a false refusal, or no refusal of an
    unanswerable question (`correct_refusal` 0)."""

    def known(name: str) -> float | None:
        value = values.get(name)
        return None if value is None or math.isnan(value) else value

    f1, refused, declined = known("f1"), known("false_refusal"), known("correct_refusal")
    return (
        (declined is not None and declined < 1.0)
        or (refused is not None and refused > 0.0)
        or (declined is None and f1 is not None and f1 < ANSWER_F1)
    )


def cited_not_followed(row: QuestionRow, corpus: Corpus) -> list[str]:
    """The gold passages no hop returned that a returned passage cites (by book and page)."""
    retrieved = row.retrieved_ids()
    cited: set[tuple[str, int]] = set()
    for pid in retrieved:
        cited |= corpus.cited(row.passage(pid).text or corpus.passages.get(pid, PassageInfo()).text)
    missing = [g for g in row.gold_ids if g not in retrieved]
    return [
        g
        for g in missing
        if g in corpus.passages and (corpus.passages[g].book_id, corpus.passages[g].page) in cited
    ]


def failure_tags(
    row: QuestionRow, drift_threshold: float = DRIFT_THRESHOLD, corpus: Corpus | None = None
) -> list[str]:
    """The tags of one question's row, in the order of `TAGS` (`corpus`: where the passages it
    did not retrieve are, for `cited but not followed`)."""
    calls = row.calls or []
    reason = stop_reason(row.hops)
    retrieved = {*row.retrieved_ids(), *row.context_ids}  # an old row may keep no hops
    gold = set(row.gold_ids)
    context = set(row.context_ids)
    found = {
        GOLD_NOT_RETRIEVED: not gold <= retrieved,
        CITED_NOT_FOLLOWED: corpus is not None and bool(cited_not_followed(row, corpus)),
        GOLD_CUT: bool((gold & retrieved) - context),
        STOPPED_EARLY: stopped_early(row.hops, row.gold_ids),
        QUERY_DRIFT: drift(row) < drift_threshold,
        BUDGET_STOP: reason is not None
        and reason.startswith(BUDGET)
        and reason != f"{BUDGET}timeout",
        TIMEOUT: reason == f"{BUDGET}timeout"
        or row.status == "timeout"
        or bool(TIMED_OUT.search(row.error))
        or any(TIMED_OUT.search(c.error or "") for c in calls),
        PARSE_FAILURE: any((c.error or "").startswith(UNPARSEABLE) for c in calls)
        or row.error.startswith(PARSE_ERRORS),
        ANSWER_MISSED: row.status == "ok" and gold <= context and answer_missed(row.values),
        ERROR: row.status != "ok",
    }
    return [tag for tag in TAGS if found[tag]]


def stopped_early(hops: Sequence[HopTrace], gold: Sequence[str]) -> bool:
    """A hop judged its passages sufficient while a gold passage was not yet retrieved."""
    seen: set[str] = set()
    for hop in hops:
        seen.update(d.passage_id for d in hop.documents)
        said_enough = (
            hop.decision is not None and hop.decision.sufficient
        ) or hop.adaptive_decision == "sufficient"
        if said_enough:
            return bool(gold) and not set(gold) <= seen
    return False


def overlap(query: str, reference: str) -> float:
    """Share of the query's content terms that occur in the reference (1.0 for a query with
    none: nothing in it can have drifted)."""
    mine = set(terms(query))
    if not mine:
        return 1.0
    return len(mine & set(terms(reference))) / len(mine)


def drift(row: QuestionRow) -> float:
    """The lowest overlap of any query issued for the question (1.0 when none was issued).

    A hop's query is held against the question, its rewrite and what earlier hops retrieved
    (each passage's id, section and kept text): a later hop that follows a reference found in a
    passage ("see Old Soldier") follows the evidence, it does not drift from it."""
    question, main = row.question, row.main_question
    scores = [overlap(main, question)] if main and main != question else []
    evidence = [question, main]
    for hop in row.hops:
        reference = " ".join(evidence)
        scores += [overlap(q, reference) for q in hop.queries]
        for doc in hop.documents:
            passage = row.passage(doc.passage_id)
            evidence += [doc.passage_id, passage.section, passage.text]
    return min(scores, default=1.0)


def found_at(row: QuestionRow, passage_id: str) -> tuple[int, int, int] | None:
    """(hop, query, rank within that query's results) where a passage first came, all from 1;
    None when no hop returned it."""
    for hop in row.hops:
        ranks: dict[int, int] = {}
        for ref in hop.documents:
            ranks[ref.query] = ranks.get(ref.query, 0) + 1
            if ref.passage_id == passage_id:
                return hop.hop, ref.query + 1, ranks[ref.query]
    return None


def gold_lines(row: QuestionRow, corpus: Corpus | None = None, never_note: str = "") -> list[str]:
    """One Markdown list line per gold passage: where it is (book, page, section), the hop,
    query and rank that first found it, and whether it was handed to generation (`never_note`
    follows "never retrieved": where the reader finds its text)."""
    lines = []
    for pid in row.gold_ids:
        where = located(passage_info(pid, row, corpus))
        first = found_at(row, pid)
        if first is None:
            fate = f"**never retrieved**{never_note}"
        else:
            hop, query, rank = first
            handed = (
                "handed to generation"
                if pid in row.context_ids
                else "**not handed to generation** (cut at k)"
            )
            fate = f"found by hop {hop}, query {query}, rank {rank}; {handed}"
        mark = "✓" if first is not None and pid in row.context_ids else "✗"
        lines.append(f"- {mark} `{pid}`{html.escape(where)} — {fate}")
    return lines


def passage_info(pid: str, row: QuestionRow, corpus: Corpus | None) -> PassageInfo | None:
    """What the row keeps of a passage, else what the corpus says (a passage no hop returned),
    else None."""
    if pid in row.passages:
        return row.passages[pid]
    if corpus is not None and pid in corpus.passages:
        return corpus.passages[pid]
    return None


def located(passage: PassageInfo | None) -> str:
    """' · book p. page · section' of a passage ('' when nothing is known of it)."""
    if passage is None:
        return ""
    return f" · {passage.book_id} p. {passage.page}" + (
        f" · {passage.section}" if passage.section else ""
    )


WORST = ["question_id", "set", "recall_at_k", "f1", "tags", "question"]
WORST_SHOWN = 5
"""Worst questions the Compare page lists per run."""


def worst_questions(
    table: pd.DataFrame, n: int = WORST_SHOWN, corpus: Corpus | None = None
) -> pd.DataFrame:
    """The run's `n` worst failed questions (`failures.failed`), one row each with its failure
    tags: lowest gold-passage recall@k first, then lowest token F1 (a question that did not
    finish counts as 0 on both), then question id."""
    return worst_of(rows_of(table), n, corpus)


def worst_of(
    rows: Iterable[QuestionRow], n: int = WORST_SHOWN, corpus: Corpus | None = None
) -> pd.DataFrame:
    """`worst_questions` of rows already read from a run's table."""
    worst = []
    for row in rows:
        if not failed(row):
            continue
        finished = row.status == "ok"
        recall = row.values.get("recall_at_k", float("nan")) if finished else 0.0
        f1 = row.values.get("f1", float("nan")) if finished else 0.0
        worst.append(
            {
                "question_id": row.question_id,
                "set": row.set,
                "recall_at_k": recall,
                "f1": f1,
                "tags": failure_tags(row, corpus=corpus),
                "question": row.question,
            }
        )
    frame = pd.DataFrame(worst, columns=WORST)
    order = frame.sort_values(
        ["recall_at_k", "f1", "question_id"], na_position="last", kind="stable"
    )
    return order.drop_duplicates("question_id").head(n).reset_index(drop=True)
