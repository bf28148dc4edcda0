"""The hop-by-hop trace every strategy records: queries, documents, decisions, calls."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

from pydantic import BaseModel, Field

from caprag.llm.usage import total_cost
from caprag.schemas import CallUsage, RetrievedRef
from caprag.steps.analyze import SufficiencyDecision


class HopTrace(BaseModel):
    """What one hop of retrieval did."""

    hop: int
    queries: list[str]
    documents: list[RetrievedRef] = Field(default_factory=list)
    new_documents: int = 0
    duplicate_documents: int = 0
    decision: SufficiencyDecision | None = None
    usage: list[CallUsage] = Field(default_factory=list)
    latency_s: float = 0.0
    reasoning: list[str] | None = Field(
        default=None,
        description="A baseline's intermediate reasoning in this hop (None for the others): "
        "IRCoT's sentence, Self-Ask's follow-up and intermediate answer, Iter-RetGen's answer.",
    )
    # Adaptive depth only (None for the other strategies): one hop is one iteration.
    depth: int | None = Field(default=None, description="Depth level searched (1, 2, 3).")
    chunks: int | None = Field(default=None, description="Passages in the context after the hop.")
    context_tokens: int | None = Field(default=None, description="Tokens of those passages.")
    confidence: float | None = Field(default=None, description="Confidence after the hop, 0-1.")
    confidence_signals: dict[str, float] | None = Field(
        default=None,
        description="Heuristic parts (relevance, recency, diversity, completeness), retrieval "
        "measures (coverage, open_references, margin, log_passages), `heuristic` (before "
        "calibration).",
    )
    missing_info: list[str] | None = Field(default=None, description="What the context lacks.")
    threshold: float | None = Field(default=None, description="Confidence the query type needs.")
    query_type: str | None = Field(default=None, description="factual/operational/decision/...")
    adaptive_decision: str | None = Field(
        default=None,
        description="increase_depth, sufficient, forced_depth, no_new_evidence or "
        "budget_exhausted:<budget>.",
    )
    warning: str | None = Field(default=None, description="Stopped below the threshold: why.")
    hint: str | None = Field(default=None, description="Forced depth below threshold: advice.")

    @property
    def outcome(self) -> str:
        """How the hop ended, as the decision log names it: adaptive's decision; else the
        analyzer's verdict, `sufficient` or `next` (another hop wanted); else `done`."""
        if self.adaptive_decision is not None:
            return self.adaptive_decision
        if self.decision is not None:
            return "sufficient" if self.decision.sufficient else "next"
        return "done"

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens spent in this hop."""
        return sum(u.prompt_tokens for u in self.usage)

    @property
    def completion_tokens(self) -> int:
        """Completion tokens spent in this hop."""
        return sum(u.completion_tokens for u in self.usage)

    @property
    def cost_usd(self) -> float | None:
        """Cost of this hop's LLM calls (None: a model's price is unknown)."""
        return total_cost(u.cost_usd for u in self.usage)


ROUND_LISTENER: ContextVar[Callable[[HopTrace], None] | None] = ContextVar(
    "caprag_rounds", default=None
)
"""Called with every round the current turn decides, the moment it is decided (None: nobody
listens). A context variable, so concurrent turns never see each other's rounds; the chat page
listens (`caprag.serve.progress`)."""


def report_round(hop: HopTrace) -> None:
    """Tell the turn's listener, if any, about a round just decided."""
    listener = ROUND_LISTENER.get()
    if listener is not None:
        listener(hop)
