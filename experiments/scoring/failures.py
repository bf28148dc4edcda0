"""Failure tags: why a question went wrong, read from its row (hops, calls, status).

Each tag is a rule over what the harness logs for every question, never over a corpus's content:

- `analyzer stopped early`: a hop's sufficiency decision (the multi-hop analyzer's `sufficient`,
  or adaptive's `sufficient` decision) ended retrieval while some gold passage was still not among
  the passages retrieved so far.
- `query drift`: a query issued for the question shares little with it. A query's overlap is the
  share of its content terms (`caprag.text.terms`: lower-cased, stop words out, lightly stemmed)
  that also occur in the question or its standalone form; the rewrite (`main_question`) is held
  against the question alone. A question drifts when some query's overlap is below
  `DRIFT_THRESHOLD` (0.25: fewer than one content term in four comes from the question).
- `budget stop`: retrieval ended on a budget (`budget_exhausted:<budget>`, as
  `caprag.services.stop_reason` names it: hops, depth, iterations, chunks…) other than time.
- `timeout`: the question ran out of time: the harness's per-question limit, an LLM call's time
  limit, or adaptive's timeout budget.
- `parse failure`: an LLM reply could not be parsed (a call recorded `unparseable reply`, or the
  question failed on a structured-output error).
- `error`: the question failed (status other than ok).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from caprag.services import stop_reason
from caprag.text import terms
from caprag.trace import HopTrace
from experiments.results.row import QuestionRow

STOPPED_EARLY = "analyzer stopped early"
QUERY_DRIFT = "query drift"
BUDGET_STOP = "budget stop"
TIMEOUT = "timeout"
PARSE_FAILURE = "parse failure"
ERROR = "error"
TAGS = (STOPPED_EARLY, QUERY_DRIFT, BUDGET_STOP, TIMEOUT, PARSE_FAILURE, ERROR)
DRIFT_THRESHOLD = 0.25
BUDGET = "budget_exhausted:"
UNPARSEABLE = "unparseable reply"
TIMED_OUT = re.compile(r"timed out|timeout", re.IGNORECASE)
PARSE_ERRORS = ("StepFailedError", "StructuredOutputError")


def failure_tags(row: QuestionRow, drift_threshold: float = DRIFT_THRESHOLD) -> list[str]:
    """The tags of one question's row, in the order of `TAGS`."""
    calls = row.calls or []
    reason = stop_reason(row.hops)
    found = {
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
