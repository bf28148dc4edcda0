"""Output budgets: every schema's longest valid reply fits the cap it is fitted to."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, Field

from caprag.llm.budget import (
    CHARS_PER_TOKEN,
    ITEM_TOKENS,
    fitted,
    model_limits,
    model_schema,
    retry_cap,
)
from caprag.steps.analyze import SufficiencyDecision
from caprag.steps.assess import ConfidenceAssessment
from caprag.steps.classify import QueryClass
from caprag.steps.expand import Questions
from caprag.steps.generate import MAX_ANSWER_CHARS, GeneratedAnswer

SCHEMAS = [Questions, SufficiencyDecision, GeneratedAnswer, QueryClass, ConfidenceAssessment]


def longest_values(schema: dict[str, Any], node: dict[str, Any]) -> float:
    """Characters of the longest valid reply's values, list item syntax included; None for an
    unbounded string or list (which must not occur)."""
    if "$ref" in node:
        node = schema["$defs"][node["$ref"].split("/")[-1]]
    if node.get("type") == "object":
        return sum(longest_values(schema, sub) for sub in node.get("properties", {}).values())
    if node.get("type") == "array":
        assert "maxItems" in node, node
        item = longest_values(schema, node["items"]) + ITEM_TOKENS * CHARS_PER_TOKEN
        return float(node["maxItems"] * item)
    if node.get("type") == "string" and "enum" not in node:
        assert "maxLength" in node, node
        return float(node["maxLength"])
    return 0.0


@pytest.mark.parametrize("cap", [64, 128, 256, 1024])
@pytest.mark.parametrize("model", SCHEMAS, ids=lambda m: m.__name__)
def test_the_longest_valid_reply_fits_the_cap(model: type[BaseModel], cap: int) -> None:
    schema = model_schema(model, cap)
    # The values within the characters the cap holds, whatever the JSON around them costs.
    assert longest_values(schema, schema) <= cap * CHARS_PER_TOKEN
    assert "budget" not in str(schema)


def test_bounds_follow_the_cap_and_never_exceed_the_schemas_own() -> None:
    small = model_limits(GeneratedAnswer, 128)["answer"].chars
    large = model_limits(GeneratedAnswer, 1024)["answer"].chars
    huge = model_limits(GeneratedAnswer, 100_000)["answer"].chars
    assert small is not None and large is not None
    assert 100 < small < large < MAX_ANSWER_CHARS and huge == MAX_ANSWER_CHARS
    assert model_limits(GeneratedAnswer, None)["answer"].chars == MAX_ANSWER_CHARS


def test_weights_share_the_characters_and_lists_hold_fewer_items_under_a_small_cap() -> None:
    class Reply(BaseModel):
        long: str = Field(json_schema_extra={"budget": 3})
        short: str
        items: list[str] = Field(max_length=10)

    _schema, limits = fitted(Reply.model_json_schema(), 200)
    assert limits["long"].chars == pytest.approx(3 * (limits["short"].chars or 0), abs=3)
    items = limits["items"].items
    assert items is not None and 1 <= items < 10
    _schema, roomy = fitted(Reply.model_json_schema(), 5000)
    assert roomy["items"].items == 10


def test_nested_objects_in_lists_are_bounded() -> None:
    class Verdict(BaseModel):
        statement: str
        reason: str
        verdict: int

    class Verdicts(BaseModel):
        statements: list[Verdict]

    schema, limits = fitted(Verdicts.model_json_schema(), 256)
    verdict = schema["$defs"]["Verdict"]["properties"]
    assert verdict["statement"]["maxLength"] >= 16 and verdict["reason"]["maxLength"] >= 16
    assert longest_values(schema, schema) <= 256 * CHARS_PER_TOKEN
    assert limits["statements"].items is not None


@pytest.mark.parametrize("cap", [64, 128, 512])
@pytest.mark.parametrize("model", SCHEMAS, ids=lambda m: m.__name__)
def test_a_cut_reply_is_retried_with_room_for_one_token_per_character(
    model: type[BaseModel], cap: int
) -> None:
    """SmolLM2 wrote "1.1.1.1..." to the end of a 312-character reasoning (a token a character):
    the retry's cap holds the longest valid reply at that rate, and at least twice the cap."""
    larger = retry_cap(model, cap)
    assert larger is not None and larger >= 2 * cap
    schema = model_schema(model, cap)
    assert larger >= longest_values(schema, schema)
    assert retry_cap(model, None) is None


def test_the_classifier_retry_fits_its_reasoning_a_character_a_token() -> None:
    reasoning = model_limits(QueryClass, 128)["reasoning"].chars
    assert reasoning is not None and reasoning > 2 * 128 - 40  # what twice the cap could not hold
    larger = retry_cap(QueryClass, 128)
    assert larger is not None and larger > reasoning


def test_the_classifiers_cut_reply_fits_its_retry() -> None:
    """SmolLM2's reply to the classifier, cut at a retry cap of 336 tokens: its reasoning "1.1.1..."
    to the bound, laid out with a newline and indent per key, every character a token. The retry
    holds every character of it."""
    reasoning = model_limits(QueryClass, 128)["reasoning"].chars
    assert reasoning is not None
    sent = {"query_type": "operational", "reasoning": ("1." * reasoning)[:reasoning]}
    larger = retry_cap(QueryClass, 128)
    assert larger is not None and larger > len(json.dumps(sent, indent=2))


def test_a_lists_retry_holds_every_item_laid_out() -> None:
    limit = model_limits(Questions, 128)["questions"]
    assert limit.chars is not None and limit.items is not None
    sent = {"questions": ["1." * (limit.chars // 2)] * limit.items}
    larger = retry_cap(Questions, 128)
    assert larger is not None and larger > len(json.dumps(sent, indent=2))
