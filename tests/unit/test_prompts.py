"""Every prompt renders whole: no placeholder left unfilled, no argument left unused."""

from __future__ import annotations

import re

import pytest

from caprag.config import PROJECT_ROOT
from caprag.llm.budget import model_limits, prompt_values
from caprag.llm.prompt import Prompt, PromptError
from caprag.retrieval.books import corpus_library
from caprag.steps import ALL_PROMPTS, analyze, assess, classify, expand, generate, prompt_versions
from caprag.steps.base import Wording
from caprag.text import DEFAULT_REFUSAL, library_name
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
    assert f"answer exactly: '{DEFAULT_REFUSAL}'" in str(system.content)
    assert "about the library using only" in str(system.content)


def test_the_prompts_name_the_library_and_the_refusal_they_are_given() -> None:
    """No prompt says 'rulebooks': each names the corpus it was built for (Wording)."""
    wording = Wording(library="the Ashen March archive", refusal="Nothing on that here.")
    values = generate.prompt_values("q", DOCS, (), wording=wording)
    system, _user = generate.GENERATE.render(**values)
    assert "about the Ashen March archive" in str(system.content)
    assert "answer exactly: 'Nothing on that here.'" in str(system.content)
    for prompt in ALL_PROMPTS:
        assert "rulebook" not in (prompt.system + prompt.user).lower(), prompt.name


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


@pytest.mark.parametrize("cap", [64, 128, 512])
def test_prompts_as_sent_state_the_lengths_the_fitted_schema_allows(cap: int) -> None:
    """What the model is told is what the grammar lets it write: both come from the cap."""
    limits = model_limits(analyze.SufficiencyDecision, cap)
    system, _user = analyze.ANALYZE.render(**analyze.prompt_values("q", DOCS, ["q"], 3, cap))
    queries = limits["new_queries"]
    assert queries.items is not None
    asked = min(3, queries.items)
    assert (
        f"at most {asked} new_queries of at most {queries.chars} characters each" in system.content
    )
    assert f"(at most {limits['reasoning'].chars} characters)" in str(system.content)

    answer = model_limits(generate.GeneratedAnswer, cap)
    system, _user = generate.GENERATE.render(
        **generate.prompt_values("q", DOCS, (), output_cap=cap)
    )
    assert f"the answer is at most {answer['answer'].chars} characters" in str(system.content)
    assert f"(at most {answer['source_ids'].items})" in str(system.content)

    missing = model_limits(assess.ConfidenceAssessment, cap)
    system, _user = assess.ASSESS.render(**assess.assess_values("q", DOCS, cap))
    assert f"of at most {missing['missing_info'].chars} characters" in str(system.content)

    expanded = model_limits(expand.Questions, cap)["questions"]
    system, _user = expand.EXPAND.render(
        question="q",
        library="the library",
        n=str(expand.asked_for(4, cap)),
        **prompt_values(expand.Questions, cap, expand.EXPAND.fields),
    )
    assert f"each at most {expanded.chars} characters" in str(system.content)

    reasoning = model_limits(classify.QueryClass, cap)["reasoning"]
    system, _user = classify.CLASSIFY.render(
        question="q",
        library="the library",
        **prompt_values(classify.QueryClass, cap, classify.CLASSIFY.fields),
    )
    assert f"(at most {reasoning.chars} characters)" in str(system.content)


def test_rule_steps_state_the_schemas_own_bounds() -> None:
    """Without a cap (a rule step costed as if its prompt were sent) the schema's own bounds."""
    system, _user = generate.GENERATE.render(**generate.prompt_values("q", DOCS, ()))
    assert f"at most {generate.MAX_ANSWER_CHARS} characters" in str(system.content)


def test_the_library_is_named_from_its_books_titles() -> None:
    assert library_name(["Cinderwake Core Rules", "Cinderwake Combat: Steel and Sinew"]) == (
        "the Cinderwake books"
    )
    assert library_name(["The Guide of Rivers", "The Guide of Hills"]) == "the Guide books"
    assert library_name(["Hill Almanac"]) == "the book 'Hill Almanac'"
    assert library_name(["Hills", "Rivers"]) == library_name([]) == "the library"
    assert corpus_library(PROJECT_ROOT / "datasets" / "books") == "the Cinderwake books"
    assert corpus_library(PROJECT_ROOT / "no-such-folder") == "the library"
