"""Question sets: the JSONL schema, a loader that reports file:line, and corpus validation."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError, model_validator

from caprag.config import PROJECT_ROOT
from caprag.steps.classify import QueryType

QUESTIONS_DIR = PROJECT_ROOT / "datasets" / "questions"
SETS = ("single_book", "cross_book", "follow_up", "unanswerable")


class DatasetError(Exception):
    """A question file is malformed or does not match the corpus; names file and line."""

    def __init__(self, path: Path | str, line: int, message: str) -> None:
        self.path = Path(path)
        self.line = line
        self.message = message
        super().__init__(f"{self.path}:{line}: {message}")


class GoldQuestion(BaseModel):
    """One question with its gold answer and gold passages (in hop order)."""

    id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    answer: str
    answer_aliases: list[str] = Field(default_factory=list)
    """Other accepted answers (benchmarks such as SQuAD list several; curated sets have none)."""
    reference: str = ""
    gold_passages: list[str]
    hops: int = Field(ge=0, le=5)
    books: list[str]
    query_type: QueryType
    standalone: str | None = None
    set: str = ""
    label: str = ""
    """Why a person said a run failed this question (a failure tag or their words), kept when
    the question is exported from the dashboard; empty in the curated sets."""

    @model_validator(mode="after")
    def _consistent(self) -> GoldQuestion:
        if self.hops != len(self.gold_passages):
            raise ValueError(
                f"hops is {self.hops} but there are {len(self.gold_passages)} gold passages"
            )
        books = list(dict.fromkeys(p.split("/")[0] for p in self.gold_passages))
        if sorted(books) != sorted(self.books):
            raise ValueError(f"books {self.books} do not match the gold passages' books {books}")
        return self

    @property
    def answerable(self) -> bool:
        """Unanswerable questions have no gold passage."""
        return bool(self.gold_passages)

    @property
    def search_text(self) -> str:
        """What retrieval should search with: the standalone form when there is one."""
        return self.standalone or self.question


class Conversation(BaseModel):
    """A follow_up item: turns asked one after another on one thread."""

    id: str = Field(min_length=1)
    turns: list[GoldQuestion] = Field(min_length=2, max_length=8)


def read_jsonl(path: Path) -> Iterable[tuple[int, dict[str, object]]]:
    """(line number, object) for each non-blank line; DatasetError (file:line) on a file that
    cannot be read, bytes that are not UTF-8 text, broken JSON or a line that is not an object."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DatasetError(path, 1, f"cannot read the file ({exc.strerror or exc})") from None
    for number, raw in enumerate(data.splitlines(), start=1):
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            raise DatasetError(
                path,
                number,
                f"expected UTF-8 text, found byte 0x{raw[exc.start]:02x} at column "
                f"{exc.start + 1} (save the file as UTF-8)",
            ) from None
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(
                path, number, f"not valid JSON ({exc.msg}, column {exc.colno})"
            ) from None
        if not isinstance(value, dict):
            raise DatasetError(path, number, "expected a JSON object")
        yield number, value


def explain(exc: ValidationError) -> str:
    """A pydantic error as 'field: message; ...' for a file:line report."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(x) for x in error["loc"])
        parts.append(f"{where}: {error['msg']}" if where else error["msg"])
    return "; ".join(parts)


def _parse(set_name: str, value: dict[str, object]) -> GoldQuestion | Conversation:
    if set_name == "follow_up":
        turns = value.get("turns")
        if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
            raise ValueError("turns: expected a list of question objects")
        return Conversation.model_validate(
            {**value, "turns": [{"set": set_name, **t} for t in turns]}
        )
    return GoldQuestion.model_validate({"set": set_name, **value})


def parse_set(
    path: Path | str, set_name: str
) -> tuple[list[tuple[int, GoldQuestion | Conversation]], list[DatasetError]]:
    """Every valid item with its line number, and an error for every invalid line."""
    path = Path(path)
    items: list[tuple[int, GoldQuestion | Conversation]] = []
    errors: list[DatasetError] = []
    lines = 0
    for number, value in read_jsonl(path):
        lines += 1
        try:
            items.append((number, _parse(set_name, value)))
        except ValidationError as exc:
            errors.append(DatasetError(path, number, explain(exc)))
        except ValueError as exc:
            errors.append(DatasetError(path, number, str(exc)))
    if not lines:
        errors.append(
            DatasetError(path, 1, "the file has no questions (expected one JSON object per line)")
        )
    return items, errors


def load_questions(path: Path | str, set_name: str = "") -> list[GoldQuestion]:
    """Load a set of single questions (every set but follow_up); raise on the first bad line."""
    items, errors = parse_set(path, set_name)
    if errors:
        raise errors[0]
    return [item for _, item in items if isinstance(item, GoldQuestion)]


def load_conversations(path: Path | str) -> list[Conversation]:
    """Load the follow_up set; raise on the first bad line."""
    items, errors = parse_set(path, "follow_up")
    if errors:
        raise errors[0]
    return [item for _, item in items if isinstance(item, Conversation)]


def content_hash(paths: Sequence[Path]) -> str:
    """sha256 over the files' bytes, for run metadata."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
