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

Beside the four weighted signals the rule measures the retrieval itself (recorded in the trace,
and the inputs of a fitted `Calibration`): coverage (share of the question's terms in any passage),
open_references (unresolved cross-references, 3 or more = 1.0), margin (how far the last passage's
retrieval score fell below the best one's: near 0 means the ranking has not dropped off yet) and
log_passages (the natural log of the number of passages read).

A `Calibration` maps those signals to the probability that every passage the question needs is
among the ones read (a logistic model fitted on one dataset by `python -m experiments.calibration
fit` and judged on another): with it, "confidence 0.9" means "9 in 10 such retrievals held
everything", which is what a threshold asks.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, Field

from caprag.llm.budget import model_limits, prompt_values
from caprag.llm.client import StepFailedError, StructuredClient
from caprag.llm.prompt import Prompt, format_passages
from caprag.retrieval.catalog import Catalog
from caprag.schemas import MAX_QUERIES, MAX_QUERY_CHARS, Document
from caprag.steps import analyze as analyzer
from caprag.steps.analyze import Links
from caprag.steps.base import NEUTRAL, StepResult, Wording
from caprag.text import DEFAULT_LIBRARY, terms

ASSESS = Prompt(
    name="assess",
    version="assess-v5",
    system=(
        "You judge whether passages retrieved from {library} are enough to answer a question "
        "fully.\n"
        "Give a confidence in tenths, from 0.0 (nothing useful) to 1.0 (every fact the answer "
        "needs is in the passages). Lower it for parts of the question no passage covers, for "
        "cross-references such as 'see Combat, p. 41' whose target passage is missing, and for "
        "passages from an older edition when a newer one is present. List what is missing in "
        "missing_info (at most {max_missing} items of at most {missing_info_chars} characters) "
        "and give one sentence of reasoning (at most {reasoning_chars} characters)."
    ),
    user="Question: {question}\n\nPassages:\n{passages}",
)


CONFIDENCE_LEVELS = tuple(round(tenth / 10, 1) for tenth in range(11))
"""The confidences a model is offered: 0.0, 0.1, ..., 1.0."""


class ConfidenceAssessment(BaseModel):
    """How fully the gathered passages answer the question (0-1), and what they lack."""

    confidence: float = Field(
        ge=0.0,
        le=1.0,
        description="0.0 (nothing useful) to 1.0 (everything needed is there), in tenths.",
        # The levels as an enum too: a server that constrains decoding to the schema (llama.cpp,
        # vLLM, Ollama) enforces an enum but not a number's minimum and maximum, and a small
        # model otherwise writes -1 or 85. A reply off the levels but within 0-1 still parses.
        json_schema_extra={"enum": list(CONFIDENCE_LEVELS)},
    )
    reasoning: str = Field(default="", max_length=2000, description="One sentence why.")
    missing_info: list[str] = Field(
        default_factory=list,
        max_length=MAX_QUERIES,
        description="Facts or cross-referenced rules the passages do not contain.",
        json_schema_extra={"items": {"type": "string", "maxLength": MAX_QUERY_CHARS}},
    )


WEIGHTS = {"relevance": 0.4, "recency": 0.2, "diversity": 0.2, "completeness": 0.2}
MEASURES = ("coverage", "open_references", "margin", "log_passages")
"""Signals measured from the retrieval beside the weighted four (features of a Calibration)."""
DIVERSE_BOOKS = 3
UNRESOLVED_PENALTY = 0.25
MAX_OPEN_REFERENCES = 3
NOT_FOUND = "not found: "
"""The missing-info item listing the question's terms no passage holds (not a query)."""


@dataclass(frozen=True)
class ConfidenceSignals:
    """The four heuristic signals and what they found missing."""

    relevance: float
    recency: float
    diversity: float
    completeness: float
    uncovered: tuple[str, ...] = ()
    unresolved: tuple[str, ...] = ()
    coverage: float = 0.0
    """Share of the question's terms found in any passage."""
    open_references: float = 0.0
    """Unresolved cross-references, MAX_OPEN_REFERENCES or more = 1.0."""
    margin: float = 0.0
    """1 - last passage's retrieval score / best passage's (0 when scores are not positive)."""
    log_passages: float = 0.0
    """Natural log of the number of passages read (0 for one passage or none)."""

    def as_dict(self) -> dict[str, float]:
        """Signal name → value (the weighted four, then the retrieval measures), rounded."""
        return {name: round(getattr(self, name), 4) for name in (*WEIGHTS, *MEASURES)}

    @property
    def confidence(self) -> float:
        """The weighted sum, 0-1."""
        return round(sum(weight * getattr(self, name) for name, weight in WEIGHTS.items()), 4)

    @property
    def missing_info(self) -> list[str]:
        """Unresolved references first, then the uncovered question terms."""
        missing = list(self.unresolved)
        if self.uncovered:
            missing.append(NOT_FOUND + ", ".join(self.uncovered))
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


def heuristic_confidence(
    question: str,
    documents: Sequence[Document],
    *,
    catalog: Catalog | None = None,
    links: Links = "citations",
) -> ConfidenceSignals:
    """Score the documents against the question; no documents (or no content terms) score 0.

    What is unresolved is what the corpus links to and was not read yet, as the analyzer would
    follow it (`links`): the citations of the passages the question is about, or the names they
    mention that the catalog has a passage about (each as a follow-up query)."""
    wanted = set(terms(question))
    if not documents or not wanted:
        missing = tuple(dict.fromkeys(terms(question)))
        return ConfidenceSignals(0.0, 0.0, 0.0, 0.0, uncovered=missing)
    relevance = max(min(1.0, analyzer.relevance(wanted, doc)) for doc in documents)
    uncovered = analyzer.uncovered_terms(question, documents)
    read = catalog.read_documents() if catalog is not None else []
    if links == "citations":
        refs = analyzer.unresolved_references(question, documents, read)
        unresolved = [r.query() for r in refs]
    else:
        names = analyzer.bridge_names(question, documents, catalog)
        unresolved = [analyzer.follow_up(question, name) for name in names]
    unresolved += [
        analyzer.follow_up(question, name)
        for name in analyzer.question_names(question, catalog)
        if analyzer.follow_up(question, name) not in unresolved
    ]
    coverage = 1.0 - len(set(uncovered)) / len(wanted)
    return ConfidenceSignals(
        relevance=relevance,
        recency=recency(documents),
        diversity=min(1.0, len({doc.book_id for doc in documents}) / DIVERSE_BOOKS),
        completeness=max(0.0, coverage - UNRESOLVED_PENALTY * len(unresolved)),
        uncovered=tuple(uncovered),
        unresolved=tuple(unresolved),
        coverage=coverage,
        open_references=min(1.0, len(unresolved) / MAX_OPEN_REFERENCES),
        margin=score_margin(documents),
        log_passages=math.log(len(documents)),
    )


def score_margin(documents: Sequence[Document]) -> float:
    """How far retrieval scores fell from the first passage to the last, 0-1 (in rank order).

    A ranking still near its best score at the cut suggests more passages like these lie below
    it; one that has dropped off suggests the rest is less related. Not positive scores: 0.
    """
    if len(documents) < 2 or documents[0].score <= 0:
        return 0.0
    return min(1.0, max(0.0, 1.0 - documents[-1].score / documents[0].score))


class RuleAssessor:
    """The heuristic confidence: no call, so no usage; its signals go to the trace. `links`: how
    the corpus links its passages (see `caprag.steps.analyze.LINKS`)."""

    kind = "rule"
    model = "offline"

    def __init__(self, links: Links = "citations") -> None:
        self.links = links

    async def __call__(
        self, question: str, documents: Sequence[Document], catalog: Catalog | None = None
    ) -> StepResult[ConfidenceAssessment]:
        signals = heuristic_confidence(question, documents, catalog=catalog, links=self.links)
        return StepResult(value=signals.assessment(), usage=None, signals=signals.as_dict())


def assess_values(
    question: str,
    documents: Sequence[Document],
    output_cap: int | None = None,
    library: str = DEFAULT_LIBRARY,
) -> dict[str, str]:
    """The ASSESS prompt's arguments, with the lengths of the assessment's schema fitted to
    `output_cap` (None: the schema's own bounds)."""
    items = model_limits(ConfidenceAssessment, output_cap)["missing_info"].items
    return {
        "question": question,
        "library": library,
        "passages": format_passages(documents) or "(none)",
        "max_missing": str(min(MAX_QUERIES, items) if items is not None else MAX_QUERIES),
        **prompt_values(ConfidenceAssessment, output_cap, ASSESS.fields),
    }


class LLMAssessor:
    """The model's self-assessment (a confidence outside 0-1 is a parse failure)."""

    kind = "llm"

    def __init__(self, client: StructuredClient, wording: Wording = NEUTRAL) -> None:
        self.client = client
        self.model = client.model
        self.wording = wording

    async def __call__(
        self, question: str, documents: Sequence[Document], catalog: Catalog | None = None
    ) -> StepResult[ConfidenceAssessment]:
        """The model reads the passages itself (`catalog` is for the rule)."""
        try:
            value, usage = await self.client.structured(
                "assess",
                ASSESS,
                ConfidenceAssessment,
                **assess_values(
                    question, documents, self.client.max_output_tokens, self.wording.library
                ),
            )
        except StepFailedError as failed:
            zero = ConfidenceAssessment(
                confidence=0.0, reasoning="the self-assessment could not be used"
            )
            return StepResult(value=zero, usage=failed.usage)
        return StepResult(value=value, usage=usage)
