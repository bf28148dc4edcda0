"""Per-question metrics as pure functions: retrieval against gold passages, answer against gold."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def strip_citations(answer: str) -> str:
    """Drop '[book/passage]' markers the generator adds."""
    return re.sub(r"\[[a-z0-9_-]+/[a-z0-9-]+\]", " ", answer)


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal."""
    return float(normalize_answer(strip_citations(prediction)) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """SQuAD token F1 between prediction and gold."""
    pred = normalize_answer(strip_citations(prediction)).split()
    ref = normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    common = Counter(pred) & Counter(ref)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred)
    recall = same / len(ref)
    return 2 * precision * recall / (precision + recall)


def recall_at_k(retrieved: Sequence[str], gold: Sequence[str], k: int) -> float:
    """Share of gold passages among the first k retrieved."""
    top = set(retrieved[:k])
    return sum(1 for g in gold if g in top) / len(gold)


def precision_at_k(retrieved: Sequence[str], gold: Sequence[str], k: int) -> float:
    """Share of the first k retrieved that are gold (over what was actually retrieved)."""
    top = retrieved[:k]
    if not top:
        return 0.0
    return sum(1 for r in top if r in set(gold)) / len(top)


def reciprocal_rank(retrieved: Sequence[str], gold: Sequence[str]) -> float:
    """1 / rank of the first gold passage (0 when none is retrieved)."""
    for rank, passage in enumerate(retrieved, start=1):
        if passage in set(gold):
            return 1.0 / rank
    return 0.0


def cumulative_recall(
    hops: Sequence[Sequence[str]], gold: Sequence[str], max_hops: int
) -> list[float]:
    """Recall of the distinct passages retrieved up to each hop, carried past the last hop taken."""
    seen: set[str] = set()
    curve: list[float] = []
    for number in range(max_hops):
        if number < len(hops):
            seen.update(hops[number])
        curve.append(sum(1 for g in gold if g in seen) / len(gold))
    return curve
