"""Per-question scores of one answered turn: retrieval, answer, cost and adaptive depth."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from caprag.serve.services import AskResult
from experiments.results.questions import GoldQuestion
from experiments.results.row import MAX_HOPS_REPORTED
from experiments.scoring import measures

Scores = tuple[dict[str, float], dict[str, str]]
"""Values computed, and a reason for each metric that could not be."""


class Scorer(Protocol):
    """Extra per-question metrics (RAGAS, a judge)."""

    async def score(
        self,
        question: str,
        answer: str,
        reference: str,
        contexts: Sequence[str],
        reference_contexts: Sequence[str],
    ) -> Scores:
        """Values computed, and reasons for those that could not be."""
        ...


def score_retrieval(turn: GoldQuestion, result: AskResult, k: int) -> Scores:
    """Gold-passage recall@k, precision@k, MRR and cumulative recall after each hop."""
    if not turn.gold_passages:
        reason = "no gold passages (unanswerable question)"
        names = ["recall_at_k", "precision_at_k", "mrr", "distinct_passages", "cumulative_recall"]
        names += [f"recall_hop{h}" for h in range(1, MAX_HOPS_REPORTED + 1)]
        return {}, dict.fromkeys(names, reason)
    context = [doc.passage_id for doc in result.context]
    gold = turn.gold_passages
    hops = [[ref.passage_id for ref in hop.documents] for hop in result.hops]
    curve = measures.cumulative_recall(hops, gold, MAX_HOPS_REPORTED)
    values = {
        "recall_at_k": measures.recall_at_k(context, gold, k),
        "precision_at_k": measures.precision_at_k(context, gold, k),
        "mrr": measures.reciprocal_rank(context, gold),
        "all_gold_at_k": float(measures.recall_at_k(context, gold, k) == 1.0),
        "context_recall": measures.recall_at_k(context, gold, len(context) or 1),
    }
    values.update({f"recall_hop{h}": v for h, v in enumerate(curve, start=1)})
    retrieved = {pid for hop in hops for pid in hop}
    values["cumulative_recall"] = sum(1 for g in gold if g in retrieved) / len(gold)
    values.update(follow_up_yield(result, set(gold)))
    return values, {}


def follow_up_yield(result: AskResult, gold: set[str]) -> dict[str, float]:
    """What the follow-up queries (every query after the first hop's) brought: how many were
    searched, the gold passages they found that no earlier query had, and how many of them found
    any; per hop too (`..._hop2`, `..._hop3`). The run's yield is a ratio of these sums."""
    values: dict[str, float] = {}
    totals = {"followup_queries": 0.0, "followup_gold": 0.0, "followup_hits": 0.0}
    for hop in result.hops[1:]:
        found = {ref.query for ref in hop.documents if ref.new and ref.passage_id in gold}
        gained = sum(1 for ref in hop.documents if ref.new and ref.passage_id in gold)
        counts = {
            "followup_queries": float(len(hop.queries)),
            "followup_gold": float(gained),
            "followup_hits": float(len(found)),
        }
        if hop.hop <= MAX_HOPS_REPORTED:
            values.update({f"{name}_hop{hop.hop}": v for name, v in counts.items()})
        for name, value in counts.items():
            totals[name] += value
    return {**totals, **values}


def score_answer(turn: GoldQuestion, result: AskResult) -> Scores:
    """Exact match and token F1 (best over the gold answer and its aliases) for answerable
    questions; refusal for unanswerable ones."""
    if result.answer_error:
        names = ("exact_match", "f1", "false_refusal", "correct_refusal")
        return {}, {name: result.answer_error for name in names}
    refused = result.refused  # the generator's flag: any wording of the refusal counts
    if not turn.gold_passages:
        reason = "unanswerable question has no gold answer"
        return {"correct_refusal": float(refused)}, {
            "exact_match": reason,
            "f1": reason,
            "false_refusal": "question is unanswerable",
        }
    golds = [turn.answer, *turn.answer_aliases]  # SQuAD scores against the best gold answer
    return (
        {
            "exact_match": max(measures.exact_match(result.answer, g) for g in golds),
            "f1": max(measures.token_f1(result.answer, g) for g in golds),
            "false_refusal": float(refused),
        },
        {"correct_refusal": "question is answerable"},
    )


def score_adaptive(result: AskResult) -> dict[str, float]:
    """Final depth, confidence and stop of depth-adaptive strategies (nothing for the others)."""
    last = result.hops[-1] if result.hops else None
    if last is None or last.depth is None or last.confidence is None:
        return {}
    return {
        "depth": float(last.depth),
        "confidence": float(last.confidence),
        "reached_threshold": float(last.confidence >= (last.threshold or 0.0)),
        "needed_2plus_rounds": float(len(result.hops) >= 2),
        "budget_stop": float((last.adaptive_decision or "").startswith("budget_exhausted")),
    }


def spent_usd(cost_usd: float | None, cached: list[float | None]) -> float | None:
    """What a question really paid: its cost less the cached calls' (None: a price unknown)."""
    if cost_usd is None or any(c is None for c in cached):
        return None
    return cost_usd - sum(c for c in cached if c is not None)


def cost_missing(result: AskResult) -> dict[str, str]:
    """Why the cost metrics are missing: a model the price table does not have (never 0)."""
    if result.cost_usd is not None:
        return {}
    models = sorted({u.model for u in result.usage if u.cost_usd is None})
    reason = f"price unknown: {', '.join(models)} not in the price table (caprag/llm/usage.py)"
    return {"cost_usd": reason, "cost_usd_spent": reason}


def score_cost(result: AskResult) -> dict[str, float]:
    """Hops, LLM calls, tokens, cost, latency and distinct passages retrieved.

    Calls answered from the response cache still count with their original tokens and cost (what
    the strategy needs); `llm_calls_cached` and `cost_usd_spent` say what this run really paid.
    """
    distinct = {ref.passage_id for hop in result.hops for ref in hop.documents}
    cached = [u for u in result.usage if u.cached]
    values: dict[str, float | None] = {
        "hops": float(result.hop_count),
        "llm_calls": float(len(result.usage)),
        "llm_calls_cached": float(len(cached)),
        "cost_usd_spent": spent_usd(result.cost_usd, [u.cost_usd for u in cached]),
        "retrieval_calls": float(sum(len(hop.queries) for hop in result.hops)),
        "prompt_tokens": float(result.prompt_tokens),
        "completion_tokens": float(result.completion_tokens),
        "tokens": float(result.prompt_tokens + result.completion_tokens),
        "cost_usd": result.cost_usd,  # None (a price unknown): dropped, `cost_missing` says why
        "latency_s": result.latency_s,
        "distinct_passages": float(len(distinct)),
        "passages_handed": float(len(result.context)),
    }
    return {name: v for name, v in values.items() if v is not None}
