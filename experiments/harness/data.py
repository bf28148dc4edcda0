"""Datasets for the harness: named question sets loaded as evaluation cases, validated up front."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from caprag.calibration import DEFAULT_CALIBRATION, calibration_names
from caprag.errors import ConfigError
from caprag.retrieval.books import Book
from caprag.retrieval.chroma_server import store_child
from caprag.steps.analyze import LINKS, Links
from experiments.results.questions import (
    QUESTIONS_DIR,
    SETS,
    Conversation,
    DatasetError,
    GoldQuestion,
    content_hash,
    parse_set,
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
    file: Path | None = None
    """The question file the case was read from (errors found later point back at it)."""
    line: int = 0
    """Its line in that file."""

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
    links: Links = "citations"
    """How the corpus links its passages, which the rule steps follow (a corpus property)."""
    calibration: str = DEFAULT_CALIBRATION
    """Adaptive's confidence model for this corpus (`strategy.calibration=auto`), fitted on
    other data."""
    library: str | None = None
    """What the steps' prompts call the corpus (`dataset.library`); None: from its books' titles
    (`caprag.text.library_name`)."""

    @property
    def content_hash(self) -> str:
        """sha256 (16 hex) over the question files."""
        return content_hash(self.files)

    @property
    def questions(self) -> int:
        """Number of questions (conversation turns counted one by one)."""
        return sum(len(case.turns) for case in self.cases)

    def check_gold_passages(self, known: Collection[str], where: str) -> None:
        """Raise DatasetError (file:line) for the first gold passage id that is not in `known`
        (the index's passage ids, read from `where`): it could never be retrieved, so its
        question would score recall 0 for a typo, not for a strategy."""
        unknown = [
            (case, turn.id, pid)
            for case in self.cases
            for turn in case.turns
            for pid in turn.gold_passages
            if pid not in known
        ]
        if not unknown:
            return
        case, question_id, pid = unknown[0]
        close = difflib.get_close_matches(pid, list(known), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        more = (
            f" ({len(unknown) - 1} more unknown; `python -m experiments.validate` lists all)"
            if len(unknown) > 1
            else ""
        )
        raise DatasetError(
            case.file or Path(self.name),
            case.line,
            f"gold passage {pid!r} of question {question_id} is not in the index of {where} "
            f"({len(known)} passages){hint}{more}",
        )

    def index_overrides(self, store: str | Path) -> dict[str, Any]:
        """build_index arguments for the dataset's own corpus, in its own store folder.

        Benchmarks never share a store with the rulebooks (or with each other), so ingesting one
        neither prunes nor re-embeds the other. The books come as a BookCorpus so that they can be
        passed to hydra.utils.instantiate as they are.
        """
        if self.books is None:
            return {}
        ids = "-".join(book.meta.book_id for book in self.books)
        return {"books": BookCorpus(self.books), "store": store_child(store, f"bench-{ids}")}


def load_dataset(
    name: str,
    sets: Sequence[str],
    root: Path | str = QUESTIONS_DIR,
    limit: int | None = None,
    path: str | None = None,
    limit_per_set: int | Mapping[str, int] | None = None,
    links: Links = "citations",
    calibration: str = DEFAULT_CALIBRATION,
    library: str | None = None,
) -> Dataset:
    """Load the named sets (or one explicit file); DatasetError with file:line on a bad line.

    `limit_per_set` keeps the first N cases of each set, or per set name ({follow_up: 1}; a set
    not named keeps all its cases).
    """
    root = Path(root)
    cases: list[EvalCase] = []
    files: list[Path] = []
    sources = [(s, Path(path) if path else root / f"{s}.jsonl") for s in sets]
    for set_name in sets:
        if set_name not in SETS:
            raise ConfigError(f"unknown question set {set_name!r}; known: {', '.join(SETS)}")
    if isinstance(limit_per_set, Mapping) and set(limit_per_set) - set(sets):
        unknown = ", ".join(sorted(str(k) for k in set(limit_per_set) - set(sets)))
        raise ConfigError(
            f"experiment.limit_per_set names set(s) {unknown} that dataset {name} does not have; "
            f"its sets: {', '.join(sets)}"
        )
    for set_name, file in sources:
        if not file.exists():
            raise FileNotFoundError(f"question set file {file} does not exist")
        files.append(file)
        items, errors = parse_set(file, set_name)
        if errors:
            raise errors[0]
        found = [
            EvalCase(
                item.id,
                set_name,
                tuple(item.turns) if isinstance(item, Conversation) else (item,),
                file=file,
                line=number,
            )
            for number, item in items
        ]
        keep = limit_per_set.get(set_name) if isinstance(limit_per_set, Mapping) else limit_per_set
        cases += found[:keep] if keep is not None else found
    if limit is not None:
        cases = cases[:limit]
    check_corpus_options(links, calibration)
    return Dataset(
        name=name,
        cases=cases,
        files=files,
        links=links,
        calibration=calibration,
        library=library,
    )


def check_corpus_options(links: str, calibration: str) -> None:
    """dataset.links and dataset.calibration name what exists (ConfigError naming the choices)."""
    if links not in LINKS:
        raise ConfigError(f"dataset.links={links!r} is not allowed: expected {' | '.join(LINKS)}")
    if calibration not in calibration_names():
        raise ConfigError(
            f"dataset.calibration={calibration!r} is not allowed: expected "
            + " | ".join(calibration_names())
        )
