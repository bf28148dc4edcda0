"""Cost dry run (`experiment.dry_run=true`): how many LLM calls, tokens and dollars a run would
take, estimated without calling any LLM endpoint.

Two estimates, side by side:
1. from a sample: a few questions (spread over the dataset) go through the real pipeline with the
   offline backend standing in for the LLM. It renders the same versioned prompts, so prompt
   tokens are what the endpoint would be sent; the number of calls follows the offline decisions.
2. worst case: every step at its bound (the strategy's `max_llm_calls`, a generation per
   question and a rewrite per follow-up turn), each call as long as the longest prompt of that
   step seen in the sample plus the configured output cap.
Both are priced with the configured model's prices (`caprag.llm.usage`).
"""

from __future__ import annotations

import asyncio
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from caprag.llm.usage import PRICE_TABLE_VERSION, known_model, price
from caprag.serve.services import AskResult, Pipeline
from caprag.strategies import RetrievalStrategy
from experiments.harness.data import Dataset, EvalCase

DEFAULT_PRICE_MODEL = "gpt-4o-mini"


def client_config(cfg: DictConfig) -> Any:
    """The configured LLM client's settings (empty for llm=offline)."""
    return cfg.llm.get("client") or {}


def estimate_price_model(cfg: DictConfig) -> str:
    """The model the run's calls would be billed as (offline: its reference price model)."""
    model = client_config(cfg).get("model")
    return str(model or cfg.llm.get("price_model") or DEFAULT_PRICE_MODEL)


@dataclass
class StepCost:
    """One pipeline step in the sample: calls and the longest prompt seen."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    max_prompt_tokens: int = 0


@dataclass
class CostEstimate:
    """What a run would cost: sample-based expectation and worst case, for `questions`."""

    strategy: str
    model: str
    questions: int
    follow_ups: int
    sampled: int
    steps: dict[str, StepCost]
    worst_calls: dict[str, int] | None
    output_cap: int | None
    notes: list[str] = field(default_factory=list)

    # ----- expectation from the sample -------------------------------------------------------
    @property
    def calls(self) -> float:
        """Expected LLM calls for the whole run."""
        return self._scale(sum(s.calls for s in self.steps.values()))

    @property
    def prompt_tokens(self) -> float:
        """Expected prompt tokens for the whole run."""
        return self._scale(sum(s.prompt_tokens for s in self.steps.values()))

    @property
    def completion_tokens(self) -> float:
        """Expected completion tokens (offline answers are short: a floor, not a ceiling)."""
        return self._scale(sum(s.completion_tokens for s in self.steps.values()))

    @property
    def usd(self) -> float | None:
        """Expected cost; None when the price table does not know the model."""
        if not known_model(self.model):
            return None
        return price(self.model, round(self.prompt_tokens), round(self.completion_tokens))

    def _scale(self, sampled_total: int) -> float:
        return sampled_total / self.sampled * self.questions if self.sampled else 0.0

    # ----- worst case ------------------------------------------------------------------------
    def worst_calls_total(self) -> int | None:
        """Most LLM calls the run can make; None when the strategy states no bound."""
        if self.worst_calls is None:
            return None
        per_question = sum(self.worst_calls.values()) + 1  # + generate
        return per_question * self.questions + self.follow_ups  # + a rewrite per follow-up

    def _longest_prompt(self, step: str) -> int:
        seen = self.steps.get(step)
        if seen and seen.calls:
            return seen.max_prompt_tokens
        return max((s.max_prompt_tokens for s in self.steps.values()), default=0)

    def worst_tokens(self) -> tuple[int, int] | None:
        """(prompt, completion) tokens with every call at its bound."""
        if self.worst_calls is None:
            return None
        cap = self.output_cap or max((s.completion_tokens for s in self.steps.values()), default=0)
        per_step = dict(self.worst_calls)  # a strategy's own generations (Self-Ask, Iter-RetGen)
        per_step["generate"] = per_step.get("generate", 0) + 1  # + the pipeline's
        prompt = sum(n * self._longest_prompt(step) for step, n in per_step.items())
        calls = sum(per_step.values())
        prompt_total = prompt * self.questions + self.follow_ups * self._longest_prompt("rewrite")
        completion_total = (calls * self.questions + self.follow_ups) * cap
        return prompt_total, completion_total

    def worst_usd(self) -> float | None:
        """Worst-case cost; None without a bound or a price."""
        tokens = self.worst_tokens()
        if tokens is None or not known_model(self.model):
            return None
        return price(self.model, *tokens)

    def table(self) -> str:
        """The estimate as the terminal shows it."""

        def usd(value: float | None) -> str:
            return f"${value:,.4f}" if value is not None else f"unknown ({self.model} not priced)"

        worst_calls = self.worst_calls_total()
        worst_tokens = self.worst_tokens()
        lines = [
            f"dry run: {self.strategy}, {self.questions} questions "
            f"({self.follow_ups} follow-up turns), priced as {self.model} ({PRICE_TABLE_VERSION});"
            " no LLM was called",
            "",
            "| estimate | LLM calls | prompt tokens | completion tokens | USD |",
            "|---|---|---|---|---|",
            f"| from a sample of {self.sampled} questions | {self.calls:,.0f} | "
            f"{self.prompt_tokens:,.0f} | {self.completion_tokens:,.0f} | {usd(self.usd)} |",
        ]
        if worst_calls is None or worst_tokens is None:
            lines.append("| worst case | unbounded: the strategy states no call limit | | | |")
        else:
            lines.append(
                f"| worst case | {worst_calls:,} | {worst_tokens[0]:,} | {worst_tokens[1]:,} | "
                f"{usd(self.worst_usd())} |"
            )
        lines += ["", "| step | calls in sample | mean prompt tokens | longest prompt |"]
        lines.append("|---|---|---|---|")
        for step, cost in sorted(self.steps.items()):
            mean = cost.prompt_tokens / cost.calls if cost.calls else 0
            lines.append(f"| {step} | {cost.calls} | {mean:,.0f} | {cost.max_prompt_tokens:,} |")
        lines += ["", *self.notes]
        return "\n".join(lines)


def sample_cases(dataset: Dataset, n: int) -> list[EvalCase]:
    """n cases spread evenly over the dataset (sets are stored one after another)."""
    cases = dataset.cases
    if n >= len(cases):
        return list(cases)
    step = len(cases) / n
    return [cases[int(i * step)] for i in range(n)]


async def _ask_sample(
    cases: list[EvalCase], pipeline_for: Callable[[EvalCase], Pipeline]
) -> list[AskResult]:
    results: list[AskResult] = []
    for case in cases:
        pipeline = pipeline_for(case)
        thread = f"dry-run-{case.id}"
        for turn in case.turns:
            results.append(await pipeline.ask(turn.question, thread))
    return results


def estimate_cost(
    cfg: DictConfig,
    dataset: Dataset,
    strategy: RetrievalStrategy,
    pipeline_for: Callable[[EvalCase], Pipeline],
) -> CostEstimate:
    """Estimate the run's LLM cost; the pipelines given must use the offline stand-in."""
    cases = sample_cases(dataset, max(1, int(cfg.experiment.dry_run_sample)))
    results = asyncio.run(_ask_sample(cases, pipeline_for))
    steps: dict[str, StepCost] = defaultdict(StepCost)
    for result in results:
        for usage in result.usage:
            cost = steps[usage.step]
            cost.calls += 1
            cost.prompt_tokens += usage.prompt_tokens
            cost.completion_tokens += usage.completion_tokens
            cost.max_prompt_tokens = max(cost.max_prompt_tokens, usage.prompt_tokens)
    repeats = max(1, int(cfg.experiment.repeats))
    client = client_config(cfg)
    cap: Any = client.get("max_output_tokens")
    follow_ups = sum(len(case.turns) - 1 for case in dataset.cases) * repeats
    notes = [
        "Sample calls follow the offline backend's decisions (a real LLM may stop earlier or go "
        "further, up to the worst case); its answers are short, so sample completion tokens are "
        "a floor.",
    ]
    if cap is None:
        notes.append("No output cap is configured: worst-case completions use the sample's.")
    if client.get("parse_attempts", 1) > 1:
        notes.append(
            f"Replies that do not parse are retried up to {client.parse_attempts} times; the "
            "worst case assumes every reply parses."
        )
    if cfg.experiment.cache and "cache" in client:
        notes.append("Calls already in the response cache will cost nothing; not subtracted here.")
    if results:
        per_question = statistics.fmean(len(r.usage) for r in results)
        notes.append(f"Sample: {len(results)} questions, {per_question:.2f} LLM calls each.")
    return CostEstimate(
        strategy=strategy.name,
        model=estimate_price_model(cfg),
        questions=dataset.questions * repeats,
        follow_ups=follow_ups,
        sampled=len(results),
        steps=dict(steps),
        worst_calls=strategy.max_llm_calls(),
        output_cap=int(cap) if cap is not None else None,
        notes=notes,
    )
