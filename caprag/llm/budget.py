"""Output budgets: schemas whose longest valid reply fits a call's output cap.

A server that constrains decoding to a JSON schema (llama.cpp's grammar, OpenAI's strict mode)
closes the JSON only if the schema lets it close within the output cap: a string allowed 2,000
characters under a 128-token cap is cut mid-string and the reply never parses. So every string
and list a step's schema holds is bounded from the cap:

    characters = (cap - syntax tokens) x CHARS_PER_TOKEN, shared across the fields by weight

where the syntax tokens are what the JSON around the values costs (keys, quotes, separators, one
fixed cost per number or boolean), and each field's weight is its `budget` in the schema
(`Field(json_schema_extra={"budget": 3})`; default 1). A list gets its share for all its items:
as many items as fit at `MIN_ITEM_CHARS` each (within its own `maxItems`), each item its share
of the list's characters. A bound is never raised above the schema's own (`max_length=` of the
pydantic field), and a cap of None leaves the schema's own bounds.

The same numbers are what a prompt tells the model (`prompt_values`), so the model is asked for
what the grammar allows.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

CHARS_PER_TOKEN = 3.0
"""Characters one output token is counted to carry. English prose runs at ~4 characters per
token in BPE vocabularies (SmolLM2's, OpenAI's); 3 leaves room for short words, numbers, ids and
JSON escapes, which tokenise worse."""
KEY_TOKENS = 4
"""Tokens a key costs beside its name: quotes, colon, separator, the value's quotes."""
SCALAR_TOKENS = 6
"""Tokens of a number, boolean or enum value (a confidence `0.75`, `true`, `"factual"`)."""
ITEM_TOKENS = 2
"""Tokens each list item costs beside its text: quotes and a comma."""
FRAME_TOKENS = 4
"""The braces and the whitespace the grammar allows around them."""
MIN_ITEM_CHARS = 48
"""The fewest characters a list item is given: a query that keeps its citation, a passage id. A
list whose share cannot give its items this many holds fewer items."""
MIN_FIELD_CHARS = 16
"""The fewest characters a string field is given, however small the cap."""
RETRY_FACTOR = 2
"""A reply cut at the cap anyway is retried once with at least this many times the cap."""


@dataclass(frozen=True)
class FieldLimit:
    """How long one field of a reply may be: characters (per item, for a list) and items."""

    chars: int | None
    items: int | None = None


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        resolved: dict[str, Any] = schema.get("$defs", {})[ref.split("/")[-1]]
        return resolved
    return node


def _string_of(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any] | None:
    """The string schema of a field (through `anyOf: [string, null]`), if it is a string."""
    node = _resolve(schema, node)
    if node.get("type") == "string" and "enum" not in node:
        return node
    for option in node.get("anyOf", []):
        if option.get("type") == "string" and "enum" not in option:
            return dict(option)
    return None


def _key_tokens(name: str) -> int:
    return KEY_TOKENS + max(1, round(len(name) / CHARS_PER_TOKEN))


def _object_cost(schema: dict[str, Any], obj: dict[str, Any]) -> tuple[int, float]:
    """(syntax tokens, total budget weight) of one object of `obj`'s shape."""
    tokens = FRAME_TOKENS
    weight = 0.0
    for name, node in obj.get("properties", {}).items():
        tokens += _key_tokens(name)
        node = _resolve(schema, node)
        if _string_of(schema, node) is not None or node.get("type") == "array":
            weight += float(node.get("budget", 1))
        else:
            tokens += SCALAR_TOKENS
    return tokens, weight


def _fit_object(
    schema: dict[str, Any], obj: dict[str, Any], chars: float, limits: dict[str, FieldLimit]
) -> None:
    """Bound every string and list of `obj` (in place) within `chars` characters of values."""
    syntax, weight = _object_cost(schema, obj)
    free = max(0.0, chars - syntax * CHARS_PER_TOKEN)
    for name, node in obj.get("properties", {}).items():
        target = _resolve(schema, node)
        share = free * float(target.get("budget", 1)) / weight if weight else 0.0
        string = _string_of(schema, target)
        if string is not None:
            bound = max(MIN_FIELD_CHARS, int(share))
            own = string.get("maxLength")
            bound = min(bound, own) if isinstance(own, int) else bound
            _set_string_bound(target, bound)
            limits[name] = FieldLimit(chars=bound)
        elif target.get("type") == "array":
            limits[name] = _fit_list(schema, target, share)


def _set_string_bound(node: dict[str, Any], bound: int) -> None:
    if node.get("type") == "string":
        node["maxLength"] = bound
    for option in node.get("anyOf", []):
        if option.get("type") == "string":
            option["maxLength"] = bound


def _fit_list(schema: dict[str, Any], node: dict[str, Any], share: float) -> FieldLimit:
    """Bound a list's items and their length within `share` characters (in place)."""
    items = node.setdefault("items", {})
    own_items = node.get("maxItems")
    element = _resolve(schema, items)
    per_item_syntax = ITEM_TOKENS * CHARS_PER_TOKEN
    if element.get("type") == "object":
        syntax, _ = _object_cost(schema, element)
        per_item_syntax += syntax * CHARS_PER_TOKEN
    fits = int(share // (MIN_ITEM_CHARS + per_item_syntax))
    count = max(1, min(fits, own_items) if isinstance(own_items, int) else fits)
    node["maxItems"] = count
    per_item = max(0.0, share / count - ITEM_TOKENS * CHARS_PER_TOKEN)
    if element.get("type") == "object":
        # A nested object (a RAGAS verdict): its own fields share each item's characters. Its
        # definition is shared by every list of it, so the copy in $defs is bounded once.
        nested: dict[str, FieldLimit] = {}
        _fit_object(schema, element, per_item, nested)
        return FieldLimit(chars=int(per_item), items=count)
    string = _string_of(schema, element)
    if string is None:
        return FieldLimit(chars=None, items=count)
    bound = max(MIN_FIELD_CHARS, int(per_item))
    own = string.get("maxLength")
    bound = min(bound, own) if isinstance(own, int) else bound
    _set_string_bound(items, bound)
    return FieldLimit(chars=bound, items=count)


def fitted(
    schema: Mapping[str, Any], cap: int | None
) -> tuple[dict[str, Any], dict[str, FieldLimit]]:
    """A JSON schema (a copy) whose longest valid reply fits `cap` output tokens, and each
    top-level field's limit. `cap` None: the schema's own bounds, unchanged."""
    out = copy.deepcopy(dict(schema))
    limits: dict[str, FieldLimit] = {}
    if cap is None:
        for name, node in out.get("properties", {}).items():
            target = _resolve(out, node)
            string = _string_of(out, target)
            if string is not None:
                limits[name] = FieldLimit(chars=string.get("maxLength"))
            elif target.get("type") == "array":
                element = _string_of(out, target.get("items", {}))
                limits[name] = FieldLimit(
                    chars=element.get("maxLength") if element else None,
                    items=target.get("maxItems"),
                )
        return _without_weights(out), limits
    _fit_object(out, out, cap * CHARS_PER_TOKEN, limits)
    return _without_weights(out), limits


def _without_weights(node: Any) -> Any:
    """The schema without its `budget` weights (ours, not JSON Schema's: not sent)."""
    if isinstance(node, dict):
        return {k: _without_weights(v) for k, v in node.items() if k != "budget"}
    if isinstance(node, list):
        return [_without_weights(v) for v in node]
    return node


@functools.cache
def _fitted_model(model: type[BaseModel], cap: int | None) -> str:
    schema, limits = fitted(model.model_json_schema(), cap)
    return json.dumps(
        {"schema": schema, "limits": {k: [v.chars, v.items] for k, v in limits.items()}}
    )


def model_schema(model: type[BaseModel], cap: int | None) -> dict[str, Any]:
    """`model`'s JSON schema fitted to `cap` (cached per model and cap)."""
    schema: dict[str, Any] = json.loads(_fitted_model(model, cap))["schema"]
    return schema


def model_limits(model: type[BaseModel], cap: int | None) -> dict[str, FieldLimit]:
    """Each top-level field's limit in `model`'s schema fitted to `cap`."""
    raw = json.loads(_fitted_model(model, cap))["limits"]
    return {k: FieldLimit(chars=v[0], items=v[1]) for k, v in raw.items()}


def prompt_values(
    model: type[BaseModel], cap: int | None, fields: Collection[str]
) -> dict[str, str]:
    """What a prompt says of each field's length, for the placeholders among `fields` it has:
    `{<field>_chars}` and `{<field>_items}` (a field without a bound says 'any number of')."""
    values: dict[str, str] = {}
    for name, limit in model_limits(model, cap).items():
        values[f"{name}_chars"] = str(limit.chars) if limit.chars is not None else "any number of"
        values[f"{name}_items"] = str(limit.items) if limit.items is not None else "any number of"
    return {k: v for k, v in values.items() if k in fields}


REPLY_END_TOKENS = 4
"""Tokens beside the reply's characters: the end-of-text token and the whitespace a grammar
allows after the closing brace."""


def longest_reply_tokens(model: type[BaseModel], cap: int | None) -> int | None:
    """Output tokens the longest reply `model`'s schema fitted to `cap` allows takes when every
    character is a token of its own, the worst a tokenizer does (runs of digits and dots such as
    "1.1.1.1", which a small model may write to the end of a string): the reply's characters as
    models lay JSON out (two-space indent, a key per line; keys, quotes and separators
    included). None: a string or list has no bound."""
    schema = model_schema(model, cap)
    longest = _longest_value(schema, schema)
    if longest is _UNBOUNDED:
        return None
    return len(json.dumps(longest, indent=2, ensure_ascii=False)) + REPLY_END_TOKENS


_UNBOUNDED = object()
LONGEST_NUMBER = -0.123456789
"""A number as long as a model writes one (a confidence, a score): the grammar bounds neither
digits nor decimals, so a reply that writes more is cut like an unbounded string."""


def _longest_value(schema: dict[str, Any], node: dict[str, Any]) -> Any:
    """The longest valid value of `node` (`_UNBOUNDED` if a string or list has no bound)."""
    node = _resolve(schema, node)
    if "enum" in node:
        return max((v for v in node["enum"]), key=lambda v: len(json.dumps(v)))
    options = node.get("anyOf")
    if options:
        values = [_longest_value(schema, option) for option in options]
        if any(v is _UNBOUNDED for v in values):
            return _UNBOUNDED
        return max(values, key=lambda v: len(json.dumps(v)))
    kind = node.get("type")
    if kind == "object":
        value: dict[str, Any] = {}
        for name, child in node.get("properties", {}).items():
            value[name] = _longest_value(schema, child)
            if value[name] is _UNBOUNDED:
                return _UNBOUNDED
        return value
    if kind == "array":
        count = node.get("maxItems")
        item = _longest_value(schema, node.get("items", {}))
        if not isinstance(count, int) or item is _UNBOUNDED:
            return _UNBOUNDED
        return [item] * count
    if kind == "string":
        bound = node.get("maxLength")
        return "x" * bound if isinstance(bound, int) else _UNBOUNDED
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return LONGEST_NUMBER  # number, integer


def retry_cap(model: type[BaseModel], cap: int | None) -> int | None:
    """The cap a reply cut at `cap` is retried with: twice the cap, or the longest reply the
    schema allows at one token per character when that is more, so the retry's JSON always
    closes (None: no known cap)."""
    if cap is None:
        return None
    return max(cap * RETRY_FACTOR, longest_reply_tokens(model, cap) or 0)
