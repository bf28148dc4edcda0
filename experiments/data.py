"""Datasets for the harness: named question sets loaded as evaluation cases, validated up front."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from caprag.books import Book
from experiments.questions import (
    QUESTIONS_DIR,
    SETS,
    GoldQuestion,
    content_hash,
    load_conversations,
    load_questions,
)


class BookCorpus(Sequence[Book]):
    """A dataset's own books, in one object that Hydra's instantiate passes through untouched.

    instantiate(cfg, books=[...]) would turn a list of Book dataclasses into configs; any other
    Sequence reaches the target as it is.
    """

    def __init__(self, books: Iterable[Book]) -> None:
        self._books = tuple(books)

    @overload
    def __getitem__(self, index: int) -> Book: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Book]: ...
    def __getitem__(self, index: int | slice) -> Book | Sequence[Book]:
        return self._books[index]

    def __len__(self) -> int:
        return len(self._books)

    def __repr__(self) -> str:
        return f"BookCorpus({', '.join(b.meta.book_id for b in self._books)})"


@dataclass(frozen=True)
class EvalCase:
    """One thing to run: a single question, or a conversation whose turns share a thread."""

    id: str
    set: str
    turns: tuple[GoldQuestion, ...]
    scope: tuple[str, ...] | None = None
    """Passage ids the case may search (benchmark distractor mode); None: the whole index."""

    @property
    def is_conversation(self) -> bool:
        """Follow-up cases have more than one turn."""
        return len(self.turns) > 1


@dataclass
class Dataset:
    """The cases of one or more question sets, with the hash of their files."""

    name: str
    cases: list[EvalCase]
    files: list[Path] = field(default_factory=list)
    books: list[Book] | None = None
    """The dataset's own corpus (benchmarks); None: the configured rulebook corpus."""

    @property
    def content_hash(self) -> str:
        """sha256 (16 hex) over the question files."""
        return content_hash(self.files)

    @property
    def questions(self) -> int:
        """Number of questions (conversation turns counted one by one)."""
        return sum(len(case.turns) for case in self.cases)

    def index_overrides(self, store: str | Path) -> dict[str, Any]:
        """build_index arguments for the dataset's own corpus, in its own store folder.

        Benchmarks never share a store with the rulebooks (or with each other), so ingesting one
        neither prunes nor re-embeds the other. The books come as a BookCorpus so that they can be
        passed to hydra.utils.instantiate as they are.
        """
        if self.books is None:
            return {}
        ids = "-".join(book.meta.book_id for book in self.books)
        return {"books": BookCorpus(self.books), "store": str(Path(store) / f"bench-{ids}")}


def load_dataset(
    name: str,
    sets: Sequence[str],
    root: Path | str = QUESTIONS_DIR,
    limit: int | None = None,
    path: str | None = None,
    limit_per_set: int | Mapping[str, int] | None = None,
) -> Dataset:
    """Load the named sets (or one explicit file); DatasetError with file:line on a bad line.

    `limit_per_set` keeps the first N cases of each set, or per set name ({follow_up: 1}; a set
    not named keeps all its cases).
    """
    root = Path(root)
    cases: list[EvalCase] = []
    files: list[Path] = []
    sources = [(s, Path(path) if path else root / f"{s}.jsonl") for s in sets]
    for set_name, file in sources:
        if set_name not in SETS:
            raise ValueError(f"unknown question set {set_name!r}; known: {', '.join(SETS)}")
        if not file.exists():
            raise FileNotFoundError(f"question set file {file} does not exist")
        files.append(file)
        if set_name == "follow_up":
            found = [EvalCase(c.id, set_name, tuple(c.turns)) for c in load_conversations(file)]
        else:
            found = [EvalCase(q.id, set_name, (q,)) for q in load_questions(file, set_name)]
        keep = limit_per_set.get(set_name) if isinstance(limit_per_set, Mapping) else limit_per_set
        cases += found[:keep] if keep is not None else found
    if limit is not None:
        cases = cases[:limit]
    return Dataset(name=name, cases=cases, files=files)
