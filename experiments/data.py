"""Datasets for the harness: named question sets loaded as evaluation cases, validated up front."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from experiments.questions import (
    QUESTIONS_DIR,
    SETS,
    GoldQuestion,
    content_hash,
    load_conversations,
    load_questions,
)


@dataclass(frozen=True)
class EvalCase:
    """One thing to run: a single question, or a conversation whose turns share a thread."""

    id: str
    set: str
    turns: tuple[GoldQuestion, ...]

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

    @property
    def content_hash(self) -> str:
        """sha256 (16 hex) over the question files."""
        return content_hash(self.files)

    @property
    def questions(self) -> int:
        """Number of questions (conversation turns counted one by one)."""
        return sum(len(case.turns) for case in self.cases)


def load_dataset(
    name: str,
    sets: Sequence[str],
    root: Path | str = QUESTIONS_DIR,
    limit: int | None = None,
    path: str | None = None,
    limit_per_set: int | None = None,
) -> Dataset:
    """Load the named sets (or one explicit file); DatasetError with file:line on a bad line."""
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
        cases += found[:limit_per_set] if limit_per_set is not None else found
    if limit is not None:
        cases = cases[:limit]
    return Dataset(name=name, cases=cases, files=files)
