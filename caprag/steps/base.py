"""What every step returns, and how a rule step is costed as if its prompt had been sent."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from caprag.llm.prompt import Prompt
from caprag.llm.usage import count_tokens, price
from caprag.schemas import CallUsage
from caprag.text import DEFAULT_LIBRARY, DEFAULT_REFUSAL

T = TypeVar("T")
Kind = Literal["rule", "llm"]
KINDS: tuple[Kind, ...] = ("rule", "llm")


@dataclass(frozen=True)
class StepResult(Generic[T]):
    """A step's value, the call it made (None for a rule that stands in for no call), and the
    heuristic signals behind it where a rule has them."""

    value: T
    usage: CallUsage | None
    signals: dict[str, float] | None = field(default=None)


@dataclass(frozen=True)
class Wording:
    """How the steps speak of the corpus: what their prompts call it (`library`, from the
    corpus's own book titles or the dataset's `library` option) and what the generator answers
    when the passages hold no answer (`refusal`). A refusal is also a flag on the answer
    (`GeneratedAnswer.refused`): nothing reads the text to find one."""

    library: str = DEFAULT_LIBRARY
    refusal: str = DEFAULT_REFUSAL


NEUTRAL = Wording()
"""The wording of a corpus nothing names: 'the library', and the default refusal."""


def fit(text: str, limit: int, what: str, notes: list[str] | None = None) -> str:
    """`text` within `limit` characters, cut at the last word boundary that fits (a rule built
    from a long question must still honour its schema's bounds); the cut is noted."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    if " " in cut[limit // 2 :]:
        cut = cut[: cut.rindex(" ")]
    cut = cut.rstrip()
    if notes is not None:
        notes.append(f"{what} cut from {len(text)} to {len(cut)} characters")
    return cut


class RuleStep:
    """A step answered by deterministic rules: no model, no network. Its usage is counted by
    rendering the same versioned prompt an LLM would get, priced at `price_model`, so rule and
    LLM runs compare on cost."""

    kind: Kind = "rule"
    model = "offline"

    def __init__(self, price_model: str = "gpt-4o-mini", wording: Wording = NEUTRAL) -> None:
        self.price_model = price_model
        self.wording = wording

    def costed(
        self,
        step: str,
        prompt: Prompt,
        value: T,
        out: str,
        t0: float,
        **values: str,
    ) -> StepResult[T]:
        """The value, with the usage of sending `prompt` filled with `values` and getting `out`."""
        prompt_tokens = count_tokens(prompt.text(**values))
        completion_tokens = count_tokens(out)
        latency_s = time.perf_counter() - t0
        usage = CallUsage(
            step=step,
            model=self.model,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost_usd=price(self.price_model, prompt_tokens, completion_tokens),
            latency_s=latency_s,
            started_at=time.time() - latency_s,
            counted="tokenizer",
            prompt_version=prompt.version,
        )
        return StepResult(value=value, usage=usage)
