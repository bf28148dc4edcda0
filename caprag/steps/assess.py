"""Step `assess` (adaptive): how fully the gathered passages answer the question, 0-1.

LLM: the ASSESS prompt (self-assessment); if its reply never parses, confidence is 0 (retrieval
deepens while budgets allow) and the call is recorded with its error. Rule: the heuristic below,
which is a signal computed without any model, so it is not costed as a call (no usage).

Heuristic confidence: how sure the gathered passages make us, without a model.

confidence = 0.4 relevance + 0.2 recency + 0.2 diversity + 0.2 completeness, each 0-1:
- relevance: share of the question's terms the best single passage holds (heading counts twice).
- recency: passages superseded by a newer edition of the same section (same book short name and
  section, higher edition or later publication) among those retrieved score lower, normalized over
  the editions retrieved; a passage with no other edition present scores 1.0. Comparing different
  books by date would only say which book is newer, not whether a rule is current.
- diversity: distinct books, 3 or more = 1.0, linear below.
- completeness: share of the question's terms found in any passage, minus 0.25 per unresolved
  cross-reference (caprag.steps.analyze.unresolved_references): a cited rule that is missing is what
  deeper retrieval can still bring in.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, Field

from caprag.llm.client import StepFailedError, StructuredClient
from caprag.llm.prompt import Prompt, format_passages
from caprag.schemas import MAX_QUERIES, Document
from caprag.steps import analyze as analyzer
from caprag.steps.base import StepResult
from caprag.text import terms

ASSESS = Prompt(
    name="assess",
    version="assess-v2",
    system=(
        "You judge whether retrieved rulebook passages are enough to answer a question fully.\n"
        "Give a confidence from 0.0 (nothing useful) to 1.0 (every fact the answer needs is in "
        "the passages). Lower it for parts of the question no passage covers, for cross-references "
        "such as 'see Combat, p. 41' whose target passage is missing, and for passages from an "
        "older edition when a newer one is present. List what is missing in missing_info (at most "
        "{max_missing} short items) and give one or two sentences of reasoning."
    ),
    user="Question: {question}\n\nPassages:\n{passages}",
)


class ConfidenceAssessment(BaseModel):
    """How fully the gathered passages answer the question (0-1), and what they lack."""

    confidence: float = Field(
        ge=0.0, le=1.0, description="0.0 (nothing useful) to 1.0 (everything needed is there)."
    )
    reasoning: str = Field(default="", max_length=2000, description="One or two sentences why.")
    missing_info: list[str] = Field(
        default_factory=list,
        max_length=MAX_QUERIES,
        description="Facts or cross-referenced rules the passages do not contain.",
    )


WEIGHTS = {"relevance": 0.4, "recency": 0.2, "diversity": 0.2, "completeness": 0.2}
DIVERSE_BOOKS = 3
UNRESOLVED_PENALTY = 0.25


@dataclass(frozen=True)
class ConfidenceSignals:
    """The four heuristic signals and what they found missing."""

    relevance: float
    recency: float
    diversity: float
    completeness: float
    uncovered: tuple[str, ...] = ()
    unresolved: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, float]:
        """Signal name → value, rounded for traces."""
        return {name: round(getattr(self, name), 4) for name in WEIGHTS}

    @property
    def confidence(self) -> float:
        """The weighted sum, 0-1."""
        return round(sum(weight * getattr(self, name) for name, weight in WEIGHTS.items()), 4)

    @property
    def missing_info(self) -> list[str]:
        """Unresolved references first, then the uncovered question terms."""
        missing = list(self.unresolved)
        if self.uncovered:
            missing.append("not found: " + ", ".join(self.uncovered))
        return missing[:MAX_QUERIES]

    def assessment(self) -> ConfidenceAssessment:
        """The signals as the structured assessment an LLM would return."""
        parts = ", ".join(f"{name} {value:.2f}" for name, value in self.as_dict().items())
        return ConfidenceAssessment(
            confidence=min(1.0, max(0.0, self.confidence)),
            reasoning=f"heuristic: {parts}",
            missing_info=self.missing_info,
        )


def recency(documents: Sequence[Document]) -> float:
    """Mean per-passage recency: 1.0 unless a newer edition of the same section was retrieved."""
    if not documents:
        return 0.0
    editions: dict[tuple[str, str], set[tuple[int, str]]] = defaultdict(set)
    for doc in documents:
        editions[_section_key(doc)].add((doc.edition, doc.published))
    scores = []
    for doc in documents:
        ranked = sorted(editions[_section_key(doc)])
        position = ranked.index((doc.edition, doc.published))
        scores.append(position / (len(ranked) - 1) if len(ranked) > 1 else 1.0)
    return sum(scores) / len(scores)


def _section_key(doc: Document) -> tuple[str, str]:
    return ((doc.book_short or doc.book_id).lower(), doc.section.strip().lower())


def heuristic_confidence(question: str, documents: Sequence[Document]) -> ConfidenceSignals:
    """Score the documents against the question; no documents (or no content terms) score 0."""
    wanted = set(terms(question))
    if not documents or not wanted:
        missing = tuple(dict.fromkeys(terms(question)))
        return ConfidenceSignals(0.0, 0.0, 0.0, 0.0, uncovered=missing)
    relevance = max(min(1.0, analyzer.relevance(wanted, doc)) for doc in documents)
    uncovered = analyzer.uncovered_terms(question, documents)
    unresolved = [r.query() for r in analyzer.unresolved_references(question, documents)]
    coverage = 1.0 - len(set(uncovered)) / len(wanted)
    return ConfidenceSignals(
        relevance=relevance,
        recency=recency(documents),
        diversity=min(1.0, len({doc.book_id for doc in documents}) / DIVERSE_BOOKS),
        completeness=max(0.0, coverage - UNRESOLVED_PENALTY * len(unresolved)),
        uncovered=tuple(uncovered),
        unresolved=tuple(unresolved),
    )


class RuleAssessor:
    """The heuristic confidence: no call, so no usage; its signals go to the trace."""

    kind = "rule"
    model = "offline"

    async def __call__(
        self, question: str, documents: Sequence[Document]
    ) -> StepResult[ConfidenceAssessment]:
        signals = heuristic_confidence(question, documents)
        return StepResult(value=signals.assessment(), usage=None, signals=signals.as_dict())


class LLMAssessor:
    """The model's self-assessment (a confidence outside 0-1 is a parse failure)."""

    kind = "llm"

    def __init__(self, client: StructuredClient) -> None:
        self.client = client
        self.model = client.model

    async def __call__(
        self, question: str, documents: Sequence[Document]
    ) -> StepResult[ConfidenceAssessment]:
        try:
            value, usage = await self.client.structured(
                "assess",
                ASSESS,
                ConfidenceAssessment,
                question=question,
                passages=format_passages(documents) or "(none)",
                max_missing=str(MAX_QUERIES),
            )
        except StepFailedError as failed:
            zero = ConfidenceAssessment(
                confidence=0.0, reasoning="the self-assessment could not be used"
            )
            return StepResult(value=zero, usage=failed.usage)
        return StepResult(value=value, usage=usage)
