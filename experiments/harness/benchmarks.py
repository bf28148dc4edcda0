"""Public QA benchmarks (one JSONL schema) as harness datasets, each with its own synthetic book.

The schema is described in `datasets/benchmarks/README.md`. Every paragraph of the file, supporting
and distractor alike, becomes a `Passage` of one `Book` whose id is the dataset name; equal
paragraphs across questions are one passage. The corpus is always the whole file: `limit`,
`limit_per_set` and `types` choose which questions are asked, never what is indexed, so the index is
embedded once and the first N questions score exactly as they do in the full run.

Modes: `pooled` searches every paragraph of the file for every question; `distractor` lets each
question search only its own paragraphs (the case's `scope`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from caprag.errors import ConfigError
from caprag.retrieval.books import BOOK_ID, Book, BookMeta, Passage, slugify
from caprag.steps.analyze import Links
from caprag.text import DEFAULT_LIBRARY
from experiments.harness.data import Dataset, EvalCase, check_corpus_options
from experiments.results.questions import DatasetError, GoldQuestion, explain, read_jsonl

Mode = Literal["pooled", "distractor"]
MODES: tuple[Mode, ...] = ("pooled", "distractor")
UNDATED = dt.date(1970, 1, 1)
"""Benchmarks have a single edition; the date only orders editions, so any fixed value works."""


class Paragraph(BaseModel):
    """One context paragraph of a benchmark question."""

    model_config = ConfigDict(strict=True)

    title: str = Field(min_length=1)
    text: str = Field(min_length=1)
    sentences: list[str] | None = None
    support_sent_ids: list[int] | None = None


class BenchmarkRecord(BaseModel):
    """One line of a benchmark file (the schema of `datasets/benchmarks/README.md`)."""

    model_config = ConfigDict(strict=True)  # JSON types as written: "yes" is not a bool

    id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    answer: str
    answer_aliases: list[str] = Field(default_factory=list)
    type: str = Field(min_length=1, pattern=r"^[^:\s]+$")
    multihop: bool | None = None
    hops: int | None = None
    answerable: bool
    supporting: list[Paragraph]
    distractors: list[Paragraph]
    source: str = ""
    extra: dict[str, Any] = Field(default_factory=dict)

    def check(self) -> None:
        """Raise ValueError when the record contradicts itself."""
        if self.answerable and not self.supporting:
            raise ValueError("answerable is true but supporting is empty")
        if self.answerable and self.hops is not None and self.hops != len(self.supporting):
            raise ValueError(
                f"hops is {self.hops} but there are {len(self.supporting)} supporting paragraphs"
            )


def passage_id(book_id: str, title: str, text: str) -> str:
    """`<book_id>/<slug(title)>-<sha1(title+text)[:8]>`: equal paragraphs share one id."""
    digest = hashlib.sha1((title + text).encode("utf-8")).hexdigest()[:8]
    return f"{book_id}/{slugify(title) or 'p'}-{digest}"


def read_benchmark(path: Path | str) -> list[tuple[int, BenchmarkRecord]]:
    """Every record with its line number; DatasetError (file:line) on the first bad line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"benchmark file {path} does not exist")
    records: list[tuple[int, BenchmarkRecord]] = []
    seen: dict[str, int] = {}
    for number, value in read_jsonl(path):
        try:
            record = BenchmarkRecord.model_validate(value)
            record.check()
        except ValidationError as exc:
            raise DatasetError(path, number, explain(exc)) from None
        except ValueError as exc:
            raise DatasetError(path, number, str(exc)) from None
        if record.id in seen:
            raise DatasetError(path, number, f"id {record.id!r} repeats line {seen[record.id]}")
        seen[record.id] = number
        records.append((number, record))
    if not records:
        raise DatasetError(path, 1, "no questions in the file")
    return records


def build_book(name: str, path: Path, records: Sequence[tuple[int, BenchmarkRecord]]) -> Book:
    """One book holding every distinct paragraph, in order of first appearance."""
    # A capitalised short name, as citations are written: "(Hotpotqa, p. 12)" is line 12.
    short = name[:1].upper() + name[1:]
    meta = BookMeta(
        book_id=name, short=short, title=f"{name} (benchmark)", edition=1, published=UNDATED
    )
    passages: dict[str, Passage] = {}
    for number, record in records:
        for paragraph in [*record.supporting, *record.distractors]:
            pid = passage_id(name, paragraph.title, paragraph.text)
            if pid not in passages:
                # page = the line where the paragraph first appears, so a citation finds it.
                passages[pid] = Passage(
                    passage_id=pid,
                    book=meta,
                    chapter="",
                    section=paragraph.title,
                    page=number,
                    text=paragraph.text,
                    line=number,
                )
    digest = hashlib.sha256(f"{meta.book_id}\x00{meta.short}\x00{meta.title}".encode())
    for passage in passages.values():
        digest.update(f"\x00{passage.passage_id}\x00{passage.page}\x00".encode())
        digest.update(passage.section.encode())
        digest.update(b"\x00")
        digest.update(passage.text.encode())
    return Book(
        meta=meta, path=path, content_hash=digest.hexdigest(), passages=list(passages.values())
    )


def _case(name: str, record: BenchmarkRecord, mode: Mode, path: Path, line: int) -> EvalCase:
    gold = (
        [passage_id(name, p.title, p.text) for p in record.supporting] if record.answerable else []
    )
    set_name = f"{name}:{record.type}"
    question = GoldQuestion(
        id=record.id,
        question=record.question,
        answer=record.answer,
        answer_aliases=record.answer_aliases,
        reference=record.answer,
        gold_passages=gold,
        hops=len(gold),
        books=[name] if gold else [],
        query_type="factual",
        set=set_name,
    )
    scope = None
    if mode == "distractor":
        paragraphs = [*record.supporting, *record.distractors]
        scope = tuple(dict.fromkeys(passage_id(name, p.title, p.text) for p in paragraphs))
    return EvalCase(record.id, set_name, (question,), scope=scope, file=path, line=line)


def load_benchmark(
    name: str,
    path: str | Path,
    mode: Mode = "pooled",
    limit: int | None = None,
    limit_per_set: int | Mapping[str, int] | None = None,
    types: Sequence[str] | None = None,
    links: Links = "names",
    calibration: str = "curated",
    library: str | None = None,
) -> Dataset:
    """Load a benchmark file as a dataset with its own corpus; cases keep the file's order.

    A question's set is `<name>:<type>` (e.g. `hotpotqa:bridge`): limit_per_set and per-set
    results work per benchmark question type (a mapping is keyed by type: {bridge: 3}; a type not
    named keeps all its questions).
    """
    if not str(path or "").strip() or str(path) == "???":
        raise ConfigError("a benchmark needs a file: set dataset.path=FILE (benchmark JSONL)")
    if mode not in MODES:
        raise ConfigError(f"unknown benchmark mode {mode!r}; allowed: {', '.join(MODES)}")
    if not BOOK_ID.match(name):
        raise ConfigError(
            f"benchmark name {name!r} is its book id and must match {BOOK_ID.pattern}"
        )
    if isinstance(types, str):  # dataset.types=bridge on the command line
        types = [types]
    path = Path(path)
    records = read_benchmark(path)
    known = {record.type for _, record in records}
    if types is not None and set(types) - known:
        raise ConfigError(
            f"unknown question type(s) {', '.join(sorted(set(types) - known))} in {path}; "
            f"known: {', '.join(sorted(known))}"
        )
    if isinstance(limit_per_set, Mapping) and set(limit_per_set) - known:
        unknown = ", ".join(sorted(str(k) for k in set(limit_per_set) - known))
        raise ConfigError(
            f"experiment.limit_per_set names question type(s) {unknown} that {path} does not "
            f"have; known: {', '.join(sorted(known))}"
        )
    cases: list[EvalCase] = []
    per_set: Counter[str] = Counter()
    for number, record in records:
        try:  # every line is checked, also those the limits leave out
            case = _case(name, record, mode, path, number)
        except ValidationError as exc:
            raise DatasetError(path, number, explain(exc)) from None
        if types is not None and record.type not in types:
            continue
        keep = (
            limit_per_set.get(record.type) if isinstance(limit_per_set, Mapping) else limit_per_set
        )
        if keep is not None and per_set[case.set] >= keep:
            continue
        per_set[case.set] += 1
        cases.append(case)
    if limit is not None:
        cases = cases[:limit]
    check_corpus_options(links, calibration)
    return Dataset(
        name=name,
        cases=cases,
        files=[path],
        books=[build_book(name, path, records)],
        links=links,
        calibration=calibration,
        library=library or DEFAULT_LIBRARY,  # its one book's title names the file, not the corpus
    )


EMBED_RATE = {"minilm": 60.0, "wordllama": 400.0}
"""Benchmark paragraphs embedded per second on 2 cores (reports/bench.md: `scale` measured 63.5
HotpotQA paragraphs/s with minilm at 20,000; `ingest` 426 passages/s with wordllama)."""


def pool_notice(dataset: Dataset, kind: str = "dense", embedding: str = "minilm") -> str:
    """What a benchmark run is about to index, said before it ingests: the pool's size beside the
    questions asked, the first embedding's estimated time, and what `dataset.mode` changes."""
    pool = sum(len(book.passages) for book in dataset.books or ())
    questions = len(dataset.cases)
    distractor = any(case.scope is not None for case in dataset.cases)
    if kind == "bm25":
        cost = "bm25 embeds nothing (its index takes seconds)"
    else:
        rate = EMBED_RATE.get(embedding)
        estimate = f"about {pool / rate:,.0f} s" if rate else "time unknown for this embedding"
        cost = (
            f"the first run embeds them with {embedding} ({estimate} on 2 cores; an unchanged "
            "pool is not embedded again; retriever=bm25 embeds nothing)"
        )
    if distractor:
        mode = (
            "dataset.mode=distractor: each question searches only its own paragraphs "
            "(gold + distractors); dataset.mode=pooled searches all of them (harder)"
        )
    else:
        mode = (
            "dataset.mode=pooled: every question searches all of them (the hard setting); "
            "dataset.mode=distractor searches only each question's own paragraphs (gold + "
            "distractors, the benchmark's published setting; same index)"
        )
    return (
        f"{dataset.name}: {questions} question(s) over a pool of {pool:,} paragraphs; {cost}.\n"
        f"  {mode}."
    )
