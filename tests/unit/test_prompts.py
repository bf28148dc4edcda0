"""Every prompt renders whole: no placeholder left unfilled, no argument left unused."""

from __future__ import annotations

import re

import pytest

from caprag.llm.prompt import Prompt, PromptError
from caprag.steps import ALL_PROMPTS, analyze, generate, prompt_versions
from tests.fakes import FLURRY

PLACEHOLDER = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")
DOCS = [FLURRY]


@pytest.mark.parametrize("prompt", ALL_PROMPTS, ids=lambda p: p.name)
def test_every_prompt_renders_every_placeholder_of_both_messages(prompt: Prompt) -> None:
    values = {name: f"<{name.upper()}>" for name in prompt.fields}
    system, user = prompt.render(**values)
    sent = f"{system.content}\n{user.content}"
    assert not PLACEHOLDER.search(sent), sent
    for name, marker in values.items():
        assert marker in sent, f"{prompt.name}: {{{name}}} is not in what is sent"


@pytest.mark.parametrize("prompt", ALL_PROMPTS, ids=lambda p: p.name)
def test_a_missing_or_unused_argument_is_refused(prompt: Prompt) -> None:
    values = {name: "x" for name in prompt.fields}
    with pytest.raises(PromptError, match="arguments it does not use: stray"):
        prompt.render(**values, stray="y")
    first = sorted(prompt.fields)[0]
    with pytest.raises(PromptError, match=f"no value for {{{first}"):
        prompt.render(**{k: v for k, v in values.items() if k != first})


def test_system_prompts_have_their_numbers_filled() -> None:
    """The bug that shipped: system messages reached the model with literal {max_queries}."""
    values = analyze.prompt_values("q", DOCS, ["q"], 3)
    system, _user = analyze.ANALYZE.render(**values)
    assert "at most 3 new_queries" in str(system.content)
    system, _user = generate.GENERATE.render(**generate.prompt_values("q", DOCS, ()))
    assert f"answer exactly: '{generate.REFUSAL}'" in str(system.content)


def test_prompt_versions_name_every_step() -> None:
    assert set(prompt_versions()) == {
        "expand",
        "analyze",
        "generate",
        "rewrite",
        "classify",
        "assess",
        "reason",
        "ask",
    }
