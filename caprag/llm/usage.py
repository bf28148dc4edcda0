"""Token counting and pricing: reported usage when given, a tokenizer count otherwise."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from caprag.retrieval.embeddings import minilm_dir

PRICE_TABLE_VERSION = "prices-2026-11"
# USD per million tokens (input, output). Offline calls are priced as if sent to a reference model.
PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-5-mini": (0.25, 2.00),
    "local": (0.0, 0.0),
}


@functools.cache
def _tokenizer() -> Any:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def count_tokens(text: str) -> int:
    """Count tokens with the bundled WordPiece tokenizer (an estimate close to BPE counts)."""
    if not text:
        return 0
    return len(_tokenizer().encode(text, add_special_tokens=False).ids)


def price(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    """Cost in USD from the price table; None for a model the table does not have (unknown,
    never 0: a free local server is the table's `local`)."""
    rates = PRICES.get(model) or PRICES.get(model.split("/")[-1])
    if rates is None:
        return None
    return (prompt_tokens * rates[0] + completion_tokens * rates[1]) / 1_000_000


def total_cost(costs: Iterable[float | None]) -> float | None:
    """The sum of calls' costs; None (unknown) when any of them is unknown."""
    total = 0.0
    for cost in costs:
        if cost is None:
            return None
        total += cost
    return total


def known_model(model: str) -> bool:
    """Whether the price table has the model."""
    return model in PRICES or model.split("/")[-1] in PRICES
