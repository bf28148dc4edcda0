"""The pipeline's LLM steps, one module each: prompt, output schema, rule and LLM implementation.

`Steps` is what a strategy and the graph receive: one implementation per step, rule or LLM, mixed
freely (`build_steps(client, analyzer="rule", generator="llm")`). All rule is the offline
baseline; all LLM is a real model doing every step.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from caprag.errors import ConfigError
from caprag.llm.client import StructuredClient
from caprag.llm.prompt import History, Prompt
from caprag.registry import ROLES
from caprag.retrieval.catalog import Catalog
from caprag.schemas import Document
from caprag.steps.analyze import (
    ANALYZE,
    Links,
    LLMAnalyzer,
    RuleAnalyzer,
    SufficiencyDecision,
)
from caprag.steps.ask import ASK, LLMAsker, RuleAsker, SelfAskTurn
from caprag.steps.assess import ASSESS, ConfidenceAssessment, LLMAssessor, RuleAssessor
from caprag.steps.base import KINDS, NEUTRAL, StepResult, Wording
from caprag.steps.classify import CLASSIFY, LLMClassifier, QueryClass, RuleClassifier
from caprag.steps.expand import EXPAND, LLMExpander, RuleExpander
from caprag.steps.generate import GENERATE, GeneratedAnswer, LLMGenerator, RuleGenerator
from caprag.steps.reason import REASON, LLMReasoner, RuleReasoner, Thought
from caprag.steps.rewrite import REWRITE, LLMRewriter, RuleRewriter

ALL_PROMPTS: tuple[Prompt, ...] = (
    EXPAND,
    ANALYZE,
    GENERATE,
    REWRITE,
    CLASSIFY,
    ASSESS,
    REASON,
    ASK,
)

CHOICES = ("auto", *KINDS)
"""auto: the LLM when there is a client, else the rule."""


class Step(Protocol):
    """What every implementation says of itself."""

    @property
    def kind(self) -> str:
        """rule or llm."""
        ...

    @property
    def model(self) -> str:
        """The model that answers ('offline' for a rule)."""
        ...


class Expander(Step, Protocol):
    async def __call__(self, question: str, n: int) -> StepResult[list[str]]: ...


class Analyzer(Step, Protocol):
    async def __call__(
        self,
        question: str,
        documents: Sequence[Document],
        searched: Sequence[str],
        catalog: Catalog | None = None,
    ) -> StepResult[SufficiencyDecision]: ...


class Generator(Step, Protocol):
    async def __call__(
        self,
        question: str,
        documents: Sequence[Document],
        history: History = (),
        confidence: tuple[float, float] | None = None,
    ) -> StepResult[GeneratedAnswer]: ...


class Rewriter(Step, Protocol):
    async def __call__(self, question: str, history: History) -> StepResult[str]: ...


class Classifier(Step, Protocol):
    async def __call__(self, question: str) -> StepResult[QueryClass]: ...


class Assessor(Step, Protocol):
    async def __call__(
        self, question: str, documents: Sequence[Document], catalog: Catalog | None = None
    ) -> StepResult[ConfidenceAssessment]: ...


class Reasoner(Step, Protocol):
    async def __call__(
        self, question: str, documents: Sequence[Document], reasoning: Sequence[str]
    ) -> StepResult[Thought]: ...


class Asker(Step, Protocol):
    async def __call__(
        self, question: str, asked: Sequence[tuple[str, str]]
    ) -> StepResult[SelfAskTurn]: ...


@dataclass(frozen=True)
class Steps:
    """One implementation of each step; call them as `await steps.analyze(...)`."""

    expand: Expander
    analyze: Analyzer
    generate: Generator
    rewrite: Rewriter
    classify: Classifier
    assess: Assessor
    reason: Reasoner = field(default_factory=RuleReasoner)
    """IRCoT's next reasoning sentence (the rule unless chosen otherwise)."""
    ask: Asker = field(default_factory=RuleAsker)
    """Self-Ask's next follow-up question or final answer."""

    def kinds(self) -> dict[str, str]:
        """Step → rule or llm."""
        return {role: getattr(self, step).kind for role, step in ROLES.items()}

    @property
    def backend(self) -> str:
        """offline (every step by its rule), llm (every step by the model) or mixed."""
        kinds = set(self.kinds().values())
        return "offline" if kinds == {"rule"} else "llm" if kinds == {"llm"} else "mixed"

    @property
    def model(self) -> str:
        """The model of the LLM steps ('offline' when there are none)."""
        models = [getattr(self, step).model for step in ROLES.values()]
        return next((m for m in models if m != "offline"), "offline")

    def describe(self) -> str:
        """'analyzer=rule generator=llm ...', for run names and logs."""
        return " ".join(f"{role}={kind}" for role, kind in self.kinds().items())


def build_steps(
    client: StructuredClient | None = None,
    *,
    rewrite_client: StructuredClient | None = None,
    price_model: str = "gpt-4o-mini",
    choices: Mapping[str, str] | None = None,
    links: Links = "citations",
    wording: Wording = NEUTRAL,
) -> Steps:
    """Steps chosen per role (`choices`: role → auto | rule | llm; missing roles are auto).

    `client` runs the LLM steps, `rewrite_client` (default `client`) the rewrite; rule steps are
    costed at `price_model`. Choosing `llm` for a role without a client is a ConfigError.
    `links`: how the corpus links its passages, which the rule analyzer follows: `citations`
    (as the bundled books cite, '(Combat, p. 41)') or `names` (a name that is another passage's
    title, as in encyclopaedic text): a property of the corpus, chosen per dataset. `wording`:
    what the prompts call the corpus and the generator's refusal (`caprag.steps.base.Wording`).
    """
    chosen = dict(choices or {})
    unknown = sorted(set(chosen) - set(ROLES))
    if unknown:
        raise ConfigError(f"unknown step {unknown[0]!r}: choose among {', '.join(ROLES)}")
    kinds: dict[str, str] = {}
    for role in ROLES:
        choice = str(chosen.get(role) or "auto")
        if choice not in CHOICES:
            raise ConfigError(f"{role}={choice!r}: use one of {', '.join(CHOICES)}")
        if choice == "llm" and client is None:
            raise ConfigError(
                f"{role}=llm needs a language model: choose llm=openai (CAPRAG_LLM=openai)"
            )
        kinds[role] = ("llm" if client is not None else "rule") if choice == "auto" else choice

    def pick(role: str, rule: Any, make: Any, with_client: StructuredClient | None = client) -> Any:
        if kinds[role] != "llm":
            return rule
        assert with_client is not None
        return make(with_client)

    worded = functools.partial
    return Steps(
        expand=pick(
            "expander", RuleExpander(price_model, wording), worded(LLMExpander, wording=wording)
        ),
        analyze=pick(
            "analyzer",
            RuleAnalyzer(price_model, links=links, wording=wording),
            worded(LLMAnalyzer, wording=wording),
        ),
        generate=pick(
            "generator", RuleGenerator(price_model, wording), worded(LLMGenerator, wording=wording)
        ),
        rewrite=pick("rewriter", RuleRewriter(price_model), LLMRewriter, rewrite_client or client),
        classify=pick(
            "classifier",
            RuleClassifier(price_model, wording),
            worded(LLMClassifier, wording=wording),
        ),
        assess=pick("confidence", RuleAssessor(links), worded(LLMAssessor, wording=wording)),
        reason=pick("reasoner", RuleReasoner(price_model), LLMReasoner),
        ask=pick("asker", RuleAsker(price_model), LLMAsker),
    )


def rule_steps(
    price_model: str = "gpt-4o-mini", links: Links = "citations", wording: Wording = NEUTRAL
) -> Steps:
    """Every step by its rule: the offline baseline (no model, no key, no network)."""
    return build_steps(None, price_model=price_model, links=links, wording=wording)


def prompt_versions() -> dict[str, str]:
    """Name → version of every prompt, for run metadata."""
    return {prompt.name: prompt.version for prompt in ALL_PROMPTS}


__all__ = [
    "ALL_PROMPTS",
    "ROLES",
    "StepResult",
    "Steps",
    "Wording",
    "build_steps",
    "prompt_versions",
    "rule_steps",
]
