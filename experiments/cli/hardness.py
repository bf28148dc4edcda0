"""`python -m experiments.hardness`: gold-passage ranks for one search with the question alone."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from caprag.config import load_settings
from caprag.retrieval.ingest import ingest_path, open_index
from caprag.retrieval.store import PassageIndex
from experiments.results.questions import (
    QUESTIONS_DIR,
    GoldQuestion,
    load_conversations,
    load_questions,
)

DEPTH = 50


@dataclass
class SetHardness:
    """Single-query ranks of the gold passages of one set."""

    name: str
    questions: int
    recall_at_5: float
    recall_at_10: float
    outside_top_10: float


def gold_ranks(index: PassageIndex, question: GoldQuestion, depth: int = DEPTH) -> list[int | None]:
    """1-based rank of each gold passage in a single search with the question (None: not found)."""
    ids = [d.passage_id for d in index.search(question.search_text, depth)]
    return [ids.index(p) + 1 if p in ids else None for p in question.gold_passages]


def recall(ranks: list[int | None], k: int) -> float:
    """Share of gold passages ranked within k."""
    return sum(1 for r in ranks if r is not None and r <= k) / len(ranks)


def measure(
    index: PassageIndex, name: str, questions: list[GoldQuestion]
) -> tuple[SetHardness, list[str]]:
    """Aggregate and per-question lines for one set."""
    answerable = [q for q in questions if q.gold_passages]
    lines = []
    r5 = r10 = outside = 0.0
    for q in answerable:
        ranks = gold_ranks(index, q)
        r5 += recall(ranks, 5)
        r10 += recall(ranks, 10)
        missed = any(r is None or r > 10 for r in ranks)
        outside += missed
        shown = ", ".join(
            f"{p}@{r or '>' + str(DEPTH)}" for p, r in zip(q.gold_passages, ranks, strict=True)
        )
        lines.append(f"{q.id}\t{'OUT' if missed else 'in '}\t{shown}")
    n = max(len(answerable), 1)
    return SetHardness(name, len(answerable), r5 / n, r10 / n, outside / n), lines


def load_any(path: Path) -> list[GoldQuestion]:
    """Questions of a set file; follow_up conversations are flattened into their turns."""
    if "follow_up" in path.name:
        return [t for c in load_conversations(path) for t in c.turns]
    return load_questions(path)


def main(argv: list[str] | None = None) -> int:
    """Print recall@5/@10 of the gold passages with a single query, per set."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.hardness", description=main.__doc__
    )
    parser.add_argument("files", nargs="*", type=Path, help="question files (default: every set)")
    parser.add_argument("--details", action="store_true", help="print each question's gold ranks")
    args = parser.parse_args(argv)
    settings = load_settings()
    ingest_path(settings.corpus, settings)
    index = open_index(settings)
    files = args.files or sorted(QUESTIONS_DIR.glob("*.jsonl"))
    print(f"embedding {settings.embedding}, single query with the question, k up to {DEPTH}")
    print("| set | questions | recall@5 | recall@10 | gold outside top 10 |")
    print("|---|---|---|---|---|")
    details = []
    for path in files:
        result, lines = measure(index, path.stem, load_any(path))
        details += lines
        if not result.questions:
            print(f"| {result.name} | 0 (no gold passages) | — | — | — |")
            continue
        print(
            f"| {result.name} | {result.questions} | {result.recall_at_5:.3f} | "
            f"{result.recall_at_10:.3f} | {result.outside_top_10:.0%} |"
        )
    if args.details:
        print("\n".join(details))
    return 0


if __name__ == "__main__":
    sys.exit(main())
