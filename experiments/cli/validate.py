"""`python -m experiments.validate`: check the question sets against the schema and the corpus."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from caprag.config import BUNDLED_CORPUS
from caprag.errors import CapragError
from caprag.retrieval.books import load_books
from experiments.results.questions import (
    QUESTIONS_DIR,
    SETS,
    Conversation,
    DatasetError,
    GoldQuestion,
    parse_set,
)

HOPS = {"single_book": (1, 1), "cross_book": (2, 3), "unanswerable": (0, 0), "follow_up": (1, 3)}


def _turns(item: GoldQuestion | Conversation) -> list[GoldQuestion]:
    return item.turns if isinstance(item, Conversation) else [item]


def validate(questions_dir: Path, corpus: Path) -> tuple[list[str], list[str]]:
    """Return (problems, summary lines); problems are 'file:line: message'."""
    passage_ids = {p.passage_id for book in load_books(corpus) for p in book.passages}
    problems: list[str] = []
    summary: list[str] = []
    seen_ids: dict[str, str] = {}
    seen_questions: dict[str, str] = {}
    for name in SETS:
        path = questions_dir / f"{name}.jsonl"
        if not path.exists():
            problems.append(f"{path}:0: question set {name!r} is missing")
            continue
        try:
            parsed, errors = parse_set(path, name)
        except DatasetError as exc:  # a line that is not JSON at all
            problems.append(str(exc))
            continue
        problems += [str(e) for e in errors]
        numbers = [n for n, _ in parsed]
        items = [item for _, item in parsed]
        low, high = HOPS[name]
        types: Counter[str] = Counter()
        hops: Counter[int] = Counter()
        for number, item in zip(numbers, items, strict=True):
            where = f"{path}:{number}"
            keys = [item.id] + (
                [t.id for t in item.turns] if isinstance(item, Conversation) else []
            )
            for key in keys:
                if key in seen_ids:
                    problems.append(f"{where}: id {key!r} repeats {seen_ids[key]}")
                seen_ids[key] = where
            if isinstance(item, Conversation) and not 3 <= len(item.turns) <= 5:
                problems.append(f"{where}: a conversation needs 3-5 turns, has {len(item.turns)}")
            for turn in _turns(item):
                types[turn.query_type] += 1
                hops[turn.hops] += 1
                text = " ".join(turn.search_text.lower().split())
                if text in seen_questions and name != "follow_up":
                    problems.append(f"{where}: question repeats {seen_questions[text]}")
                seen_questions.setdefault(text, where)
                if not low <= turn.hops <= high:
                    problems.append(
                        f"{where}: {turn.id} has {turn.hops} hops; {name} needs {low}-{high}"
                    )
                if name == "cross_book" and len(set(turn.books)) < 2:
                    problems.append(f"{where}: {turn.id} needs gold passages from 2+ books")
                if name == "follow_up" and not turn.standalone:
                    problems.append(f"{where}: {turn.id} has no standalone form")
                if name == "unanswerable" and turn.answer:
                    problems.append(f"{where}: {turn.id} is unanswerable but has an answer")
                for pid in turn.gold_passages:
                    if pid not in passage_ids:
                        problems.append(f"{where}: gold passage {pid!r} is not in the corpus")
        mix = ", ".join(f"{k} {v}" for k, v in sorted(types.items()))
        hop_mix = ", ".join(f"{k}:{v}" for k, v in sorted(hops.items()))
        summary.append(f"{name}: {len(items)} items ({mix}; hops {hop_mix})")
    return problems, summary


def main(argv: list[str] | None = None) -> int:
    """Validate every question set; exit 1 listing each problem with file and line."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.validate", description=main.__doc__
    )
    parser.add_argument("--questions", type=Path, default=QUESTIONS_DIR)
    parser.add_argument("--corpus", type=Path, default=BUNDLED_CORPUS)
    args = parser.parse_args(argv)
    try:
        problems, summary = validate(args.questions, args.corpus)
    except (CapragError, FileNotFoundError) as exc:  # a book or the corpus folder
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in summary:
        print(line)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    print(f"{len(problems)} problem(s)" if problems else "all question sets are valid")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
