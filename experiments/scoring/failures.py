"""Failure tags: why a question went wrong, read from its logged row (trace, calls, status).

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

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from caprag.services import stop_reason
from caprag.text import terms
from caprag.trace import HopTrace

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


def failure_tags(row: Mapping[Any, Any], drift_threshold: float = DRIFT_THRESHOLD) -> list[str]:
    """The tags of one question's row (a `QuestionRow.record()` or a row of a run's table), in
    the order of `TAGS`."""
    hops = logged_list(row.get("trace"))
    calls = logged_list(row.get("calls"))
    error = str(row.get("error") or "")
    status = str(row.get("status") or "ok")
    reason = _stop_reason(hops)
    found = {
        STOPPED_EARLY: stopped_early(hops, logged_list(row.get("gold_ids"))),
        QUERY_DRIFT: drift(row, hops) < drift_threshold,
        BUDGET_STOP: reason is not None
        and reason.startswith(BUDGET)
        and reason != f"{BUDGET}timeout",
        TIMEOUT: reason == f"{BUDGET}timeout"
        or status == "timeout"
        or bool(TIMED_OUT.search(error))
        or any(TIMED_OUT.search(str(c.get("error") or "")) for c in calls),
        PARSE_FAILURE: any(str(c.get("error") or "").startswith(UNPARSEABLE) for c in calls)
        or error.startswith(PARSE_ERRORS),
        ERROR: status != "ok",
    }
    return [tag for tag in TAGS if found[tag]]


def stopped_early(hops: Sequence[dict[str, Any]], gold: Sequence[str]) -> bool:
    """A hop judged its passages sufficient while a gold passage was not yet retrieved."""
    seen: set[str] = set()
    for hop in hops:
        seen.update(str(d.get("passage_id")) for d in hop.get("documents") or [])
        decision = hop.get("decision") or {}
        said_enough = decision.get("sufficient") is True or hop.get("adaptive_decision") == (
            "sufficient"
        )
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


def drift(row: Mapping[Any, Any], hops: Sequence[dict[str, Any]] | None = None) -> float:
    """The lowest overlap of any query issued for the question (1.0 when none was issued).

    A hop's query is held against the question, its rewrite and what earlier hops retrieved
    (each passage's id, section and kept text): a later hop that follows a reference found in a
    passage ("see Old Soldier") follows the evidence, it does not drift from it."""
    question = str(row.get("question") or "")
    main = str(row.get("main_question") or "")
    scores = [overlap(main, question)] if main and main != question else []
    evidence = [question, main]
    for hop in logged_list(row.get("trace")) if hops is None else hops:
        reference = " ".join(evidence)
        scores += [overlap(str(q), reference) for q in hop.get("queries") or []]
        for doc in hop.get("documents") or []:
            evidence += [str(doc.get(key) or "") for key in ("passage_id", "section", "text")]
    return min(scores, default=1.0)


def _stop_reason(hops: Sequence[dict[str, Any]]) -> str | None:
    """How retrieval ended, as the library names it (None when the trace cannot be read)."""
    try:
        return stop_reason([HopTrace.model_validate(h) for h in hops])
    except (ValidationError, TypeError):
        return None


def logged_list(value: Any) -> list[Any]:
    """A list logged as a list or as its JSON text (MLflow tables hold JSON strings)."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError:
            return []
    return list(value) if isinstance(value, list | tuple) else []
