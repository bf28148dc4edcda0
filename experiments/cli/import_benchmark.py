"""`python -m experiments.import_benchmark FORMAT FILE -o OUT.jsonl`: official files to the schema.

Converts the official HotpotQA (distractor), MuSiQue, 2WikiMultihopQA and MultiHop-RAG files into
the benchmark JSONL schema of `datasets/benchmarks/README.md`, which
`experiments.harness.benchmarks` loads (`dataset=jsonl dataset.path=OUT.jsonl`). Gold paragraphs go
to `supporting` in hop order, the rest of a question's context to `distractors`; an unanswerable
question has `answerable: false` and no supporting paragraph. Every written record is checked with
the loader's own model, so an
output file always loads. A bad input record stops the import with `FILE: record N: field 'x': what
was expected` (exit 2); the output is written to a temporary file and renamed, never left half.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from tqdm import tqdm

from experiments.harness.benchmarks import BenchmarkRecord
from experiments.results.questions import explain

FORMATS = ("hotpotqa", "musique", "2wikimultihopqa", "multihop-rag")
MULTIHOP_RAG_DISTRACTORS = 8
SEED = 13
"""The sample conversions in datasets/benchmarks drew with random.Random(13) too."""


class ImportFailed(Exception):
    """An input file or record that cannot be converted; the message is one line."""


class RecordError(Exception):
    """A record field that is missing or of the wrong kind."""

    def __init__(self, where: str, expected: str) -> None:
        self.where = where
        self.expected = expected
        super().__init__(f"field {where!r}: {expected}" if where else expected)


class Skip(Exception):
    """A valid record the schema cannot hold; the reason is counted in the summary."""


@dataclass
class Summary:
    """What an import read, wrote and skipped."""

    read: int = 0
    written: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    first_skipped: dict[str, str] = field(default_factory=dict)
    """The first record skipped for each reason (its number, and its id when it has one)."""
    types: Counter[str] = field(default_factory=Counter)
    unanswerable: int = 0

    def lines(self, output: Path) -> list[str]:
        """The summary as printed after an import."""
        types = ", ".join(f"{name} {n}" for name, n in sorted(self.types.items()))
        return [
            f"records read: {self.read}",
            f"written: {self.written} -> {output}",
            self.skipped_line(),
            f"question types: {types or '-'}",
            f"unanswerable: {self.unanswerable}",
        ]

    def skip(self, reason: str, number: int, value: object) -> None:
        """Count a skipped record under its reason (the first one of each reason is named)."""
        self.skipped[reason] += 1
        if reason not in self.first_skipped:
            name = value.get("_id", value.get("id")) if isinstance(value, dict) else None
            self.first_skipped[reason] = f"record {number}" + (
                f" (id {name})" if isinstance(name, str | int) else ""
            )

    def skipped_line(self) -> str:
        """How many records were skipped, per reason, with the first record of each."""
        reasons = "; ".join(
            f"{reason}: {n}, first {self.first_skipped.get(reason, '?')}"
            for reason, n in self.skipped.most_common()
        )
        return f"skipped: {sum(self.skipped.values())}" + (f" ({reasons})" if reasons else "")


# 1. Reading fields with a name for every complaint.


def _kind(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if type(value) in (int, float):
        return "a number"
    return names.get(type(value), type(value).__name__)


class Fields:
    """One JSON object whose accessors raise RecordError naming the field path."""

    def __init__(self, value: object, path: str = "") -> None:
        if not isinstance(value, dict):
            raise RecordError(path, f"expected an object, found {_kind(value)}")
        self.value: dict[str, Any] = value
        self.path = path

    def _where(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def get(self, name: str, expected: str, check: Callable[[object], bool]) -> Any:
        """The field's value when check accepts it."""
        if name not in self.value:
            raise RecordError(self._where(name), f"missing; expected {expected}")
        value = self.value[name]
        if not check(value):
            raise RecordError(self._where(name), f"expected {expected}, found {_kind(value)}")
        return value

    def text(self, name: str, *, empty: bool = False) -> str:
        """A string field (non-empty unless empty=True)."""
        expected = "a string" if empty else "a non-empty string"
        value = self.get(name, expected, lambda v: isinstance(v, str) and bool(empty or v.strip()))
        return str(value)

    def optional_text(self, name: str) -> str:
        """A string field that may be missing or null ('' then)."""
        if self.value.get(name) is None:
            return ""
        return str(self.get(name, "a string", lambda v: isinstance(v, str)))

    def flag(self, name: str) -> bool:
        """A boolean field."""
        return bool(self.get(name, "true or false", lambda v: isinstance(v, bool)))

    def items(self, name: str) -> list[Any]:
        """An array field."""
        return list(self.get(name, "an array", lambda v: isinstance(v, list)))

    def obj(self, name: str, index: int) -> Fields:
        """Element `index` of array `name`, as an object."""
        return Fields(self.value[name][index], f"{self._where(name)}[{index}]")

    def where(self, name: str) -> str:
        """The path of a field, for a complaint raised outside the accessors."""
        return self._where(name)


def _titled_paragraphs(record: Fields, name: str) -> list[tuple[str, list[str]]]:
    """`context`: [[title, [sentence, ...]], ...] (HotpotQA and 2WikiMultihopQA)."""
    paragraphs = []
    for i, item in enumerate(record.items(name)):
        where = f"{record.where(name)}[{i}]"
        if not (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and item[0].strip()
            and isinstance(item[1], list)
            and all(isinstance(s, str) for s in item[1])
        ):
            raise RecordError(where, "expected [title, [sentence, ...]] with a non-empty title")
        paragraphs.append((item[0], list(item[1])))
    return paragraphs


def _support_facts(record: Fields, name: str) -> list[tuple[str, int]]:
    """`supporting_facts`: [[title, sentence index], ...]."""
    facts = []
    for i, item in enumerate(record.items(name)):
        if not (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], int)
            and not isinstance(item[1], bool)
        ):
            raise RecordError(f"{record.where(name)}[{i}]", "expected [title, sentence index]")
        facts.append((item[0], item[1]))
    return facts


# 2. One converter per format: an official record to a schema record (a dict).


def _join_hotpot(sentences: Sequence[str]) -> str:
    # HotpotQA's sentences keep their leading spaces: joined as they are, they are the paragraph.
    return "".join(sentences)


def _join_spaced(sentences: Sequence[str]) -> str:
    # 2WikiMultihopQA's sentences are stripped: a space goes between two that do not have one.
    text = ""
    for sentence in sentences:
        if text and sentence and not text[-1].isspace() and not sentence[0].isspace():
            text += " "
        text += sentence
    return text


def _from_context(
    record: Fields, join: Callable[[Sequence[str]], str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """(supporting, distractors, support titles missing from the context) from context + facts."""
    context = _titled_paragraphs(record, "context")
    facts = _support_facts(record, "supporting_facts")
    by_title: dict[str, list[str]] = {}
    for title, sentences in context:
        by_title.setdefault(title, sentences)
    support_ids: dict[str, list[int]] = {}
    for title, sent_id in facts:  # in order of first appearance, as the shipped sample
        support_ids.setdefault(title, []).append(sent_id)
    supporting = []
    missing = []
    for title, ids in support_ids.items():
        sentences = by_title.get(title, [])
        if not join(sentences).strip():
            missing.append(title)
            continue
        supporting.append(
            {
                "title": title,
                "text": join(sentences),
                "sentences": sentences,
                "support_sent_ids": ids,
            }
        )
    distractors = []
    seen = set(support_ids)
    for title, sentences in context:
        if title in seen or not join(sentences).strip():
            continue
        seen.add(title)
        distractors.append({"title": title, "text": join(sentences)})
    return supporting, distractors, missing


def _record(
    *,
    id: str,
    question: str,
    answer: str,
    type: str,
    supporting: list[dict[str, Any]],
    distractors: list[dict[str, Any]],
    source: str,
    extra: dict[str, Any],
    answerable: bool = True,
    aliases: Sequence[str] = (),
) -> dict[str, Any]:
    return {
        "id": id,
        "question": question,
        "answer": answer if answerable else "",
        "answer_aliases": [a for a in dict.fromkeys(aliases) if a != answer] if answerable else [],
        "type": type,
        "multihop": True,
        "hops": len(supporting) if answerable else 0,
        "answerable": answerable,
        "supporting": supporting if answerable else [],
        "distractors": distractors if answerable else [*supporting, *distractors],
        "source": source,
        "extra": extra,
    }


def _type(value: str, where: str, allowed: Sequence[str] | None = None) -> str:
    if not re.fullmatch(r"[^:\s]+", value) or (allowed is not None and value not in allowed):
        expected = f"one of {', '.join(allowed)}" if allowed else "a type without ':' or spaces"
        raise RecordError(where, f"expected {expected}, found {value!r}")
    return value


def convert_hotpotqa(record: Fields, source: str) -> dict[str, Any]:
    """A HotpotQA distractor-setting record: gold = the context paragraphs named by the facts."""
    supporting, distractors, missing = _from_context(record, _join_hotpot)
    if not supporting:
        raise Skip("no supporting paragraph in the context")
    extra = {"level": record.optional_text("level"), "missing_support_titles": missing}
    return _record(
        id=record.text("_id"),
        question=record.text("question"),
        answer=record.text("answer", empty=True),
        type=_type(record.text("type"), record.where("type"), ("bridge", "comparison")),
        supporting=supporting,
        distractors=distractors,
        source=source,
        extra=extra,
    )


def convert_2wiki(record: Fields, source: str) -> dict[str, Any]:
    """A 2WikiMultihopQA record: HotpotQA's layout plus evidence triples (kept in extra)."""
    supporting, distractors, missing = _from_context(record, _join_spaced)
    if not supporting:
        raise Skip("no supporting paragraph in the context")
    evidences = record.value.get("evidences", [])
    if not isinstance(evidences, list):
        raise RecordError(record.where("evidences"), f"expected an array, found {_kind(evidences)}")
    types = ("comparison", "inference", "compositional", "bridge_comparison")
    return _record(
        id=record.text("_id"),
        question=record.text("question"),
        answer=record.text("answer", empty=True),
        type=_type(record.text("type"), record.where("type"), types),
        supporting=supporting,
        distractors=distractors,
        source=source,
        extra={"evidences": evidences, "missing_support_titles": missing},
    )


HOPS_PREFIX = re.compile(r"^(\d)hop(\d*)__")


def convert_musique(record: Fields, source: str) -> dict[str, Any]:
    """A MuSiQue record: type = hop count (`2hop`...), gold in the decomposition's order."""
    qid = record.text("id")
    decomposition = record.items("question_decomposition")
    prefix = HOPS_PREFIX.match(qid)
    if prefix:
        hop_type, shape = f"{prefix.group(1)}hop", prefix.group(0).rstrip("_")
    elif decomposition:
        hop_type = shape = f"{len(decomposition)}hop"
    else:
        raise RecordError(
            record.where("question_decomposition"),
            "expected the hops (a non-empty array, or an id such as 2hop__...)",
        )
    answerable = record.flag("answerable") if "answerable" in record.value else True
    aliases = record.items("answer_aliases") if "answer_aliases" in record.value else []
    if not all(isinstance(a, str) for a in aliases):
        raise RecordError(record.where("answer_aliases"), "expected an array of strings")
    paragraphs: dict[int, dict[str, Any]] = {}
    gold: list[int] = []
    for i, _ in enumerate(record.items("paragraphs")):
        paragraph = record.obj("paragraphs", i)
        idx = paragraph.get("idx", "an integer", lambda v: isinstance(v, int))
        text = paragraph.text("paragraph_text", empty=True)
        if paragraph.flag("is_supporting"):
            gold.append(idx)
        if text.strip():
            paragraphs[idx] = {"title": paragraph.text("title"), "text": text}
    order = []  # hop order: each step's paragraph_support_idx, then any other gold paragraph
    for i, _ in enumerate(decomposition):
        support = record.obj("question_decomposition", i).value.get("paragraph_support_idx")
        if isinstance(support, int) and support in gold and support not in order:
            order.append(support)
    order += [idx for idx in gold if idx not in order]
    supporting = [paragraphs[idx] for idx in order if idx in paragraphs]
    if answerable and not supporting:
        raise RecordError(
            record.where("paragraphs"),
            "expected a paragraph with is_supporting true and some text (answerable is true)",
        )
    distractors = [p for idx, p in paragraphs.items() if idx not in order]
    extra: dict[str, Any] = {
        "shape": shape,
        "decomposition": [
            step.get("question", "") for step in decomposition if isinstance(step, dict)
        ],
    }
    answer = record.text("answer", empty=True)
    if not answerable:
        extra["answer_of_the_answerable_twin"] = answer
    return _record(
        id=qid,
        question=record.text("question"),
        answer=answer,
        aliases=aliases,
        type=hop_type,
        supporting=supporting,
        distractors=distractors,
        source=source,
        extra=extra,
        answerable=answerable,
    )


@dataclass
class Article:
    """One MultiHop-RAG corpus article as a paragraph."""

    title: str
    text: str
    url: str

    def paragraph(self) -> dict[str, Any]:
        """The article in the schema's paragraph form."""
        return {"title": self.title, "text": self.text}


def read_corpus(path: Path) -> list[Article]:
    """MultiHop-RAG's corpus: [{title, body, url, ...}]; an article without a body is left out."""
    articles = []
    for number, value in _records(path, load_json(path)):
        try:
            article = Fields(value)
            body = article.text("body", empty=True)
            if body.strip():
                articles.append(Article(article.text("title"), body, article.optional_text("url")))
        except RecordError as exc:
            raise ImportFailed(f"{path}: record {number}: {exc}") from None
    if not articles:
        raise ImportFailed(f"{path}: no article with a body in the corpus")
    return articles


class MultihopRag:
    """MultiHop-RAG queries against its corpus: gold = the articles its evidence names."""

    TYPES = ("inference_query", "comparison_query", "temporal_query", "null_query")

    def __init__(self, corpus: Sequence[Article]) -> None:
        self.corpus = list(corpus)
        self.by_url: dict[str, int] = {}
        self.by_title: dict[str, int] = {}
        for i, article in enumerate(self.corpus):
            if article.url:
                self.by_url.setdefault(article.url, i)
            self.by_title.setdefault(article.title, i)
        self.gold: dict[str, list[int]] = {}
        """Corpus positions of each query's gold articles, by query id."""
        self.number = 0

    def __call__(self, record: Fields, source: str) -> dict[str, Any]:
        """One query (id `q<position>`); `add_distractors` gives it its distractors later."""
        self.number += 1
        kind = _type(record.text("question_type"), record.where("question_type"), self.TYPES)
        answerable = kind != "null_query"
        gold: list[int] = []
        evidence = []
        for i, _ in enumerate(record.items("evidence_list")):
            item = record.obj("evidence_list", i)
            url, title = item.optional_text("url"), item.optional_text("title")
            found = self.by_url.get(url) if url else None
            if found is None:
                found = self.by_title.get(title)
            if found is None and answerable:
                raise RecordError(
                    item.path,
                    f"expected an article of the corpus (no url {url!r} or title {title!r})",
                )
            if found is not None and found not in gold:
                gold.append(found)
            evidence.append({"title": title, "url": url, "fact": item.optional_text("fact")})
        if answerable and not gold:
            raise RecordError(record.where("evidence_list"), "expected at least one evidence item")
        qid = f"q{self.number:05d}"
        self.gold[qid] = gold
        return _record(
            id=qid,
            question=record.text("query"),
            answer=record.text("answer", empty=True),
            type=kind,
            supporting=[self.corpus[i].paragraph() for i in gold],
            distractors=[],
            source=source,
            extra={"evidence": evidence},
            answerable=answerable,
        )

    def add_distractors(self, records: Sequence[dict[str, Any]], count: int, seed: int) -> None:
        """Give each query `count` random other articles, then spread the articles no query has
        yet over the queries in turn, so the file (hence the pooled index) is the whole corpus."""
        rng = random.Random(seed)
        picked: dict[str, list[int]] = {}
        used: set[int] = set()
        for record in records:
            gold = set(self.gold[record["id"]])
            pool = [i for i in range(len(self.corpus)) if i not in gold]
            picked[record["id"]] = sorted(rng.sample(pool, min(count, len(pool))))
            used |= gold | set(picked[record["id"]])
        left = [i for i in range(len(self.corpus)) if i not in used]
        for n, article in enumerate(left):
            picked[records[n % len(records)]["id"]].append(article)
        for record in records:
            record["distractors"] = [self.corpus[i].paragraph() for i in picked[record["id"]]]


# 3. Files: read, convert every record, write atomically.


def load_json(path: Path) -> Any:
    """The whole file as JSON; ImportFailed naming the file and position when it is not."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ImportFailed(f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise ImportFailed(f"{path}: byte {exc.start}: expected UTF-8 text") from None
    except OSError as exc:
        raise ImportFailed(f"{path}: cannot read the file ({exc.strerror or exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ImportFailed(
            f"{path}: line {exc.lineno}, column {exc.colno}: not valid JSON ({exc.msg})"
        ) from None


def load_jsonl(path: Path) -> list[Any]:
    """One JSON value per non-blank line; ImportFailed naming the file and line when not."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ImportFailed(f"{path}: no such file") from None
    except OSError as exc:
        raise ImportFailed(f"{path}: cannot read the file ({exc.strerror or exc})") from None
    values = []
    for number, raw in enumerate(data.splitlines(), start=1):
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            raise ImportFailed(f"{path}: line {number}, byte {exc.start}: expected UTF-8") from None
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ImportFailed(
                f"{path}: line {number}, column {exc.colno}: not valid JSON ({exc.msg})"
            ) from None
        if not isinstance(value, dict):
            raise ImportFailed(
                f"{path}: line {number}: expected one JSON object per line, found {_kind(value)}"
            )
        values.append(value)
    return values


def _records(path: Path, data: Any) -> Iterator[tuple[int, Any]]:
    if not isinstance(data, list):
        raise ImportFailed(f"{path}: expected a JSON array of records, found {_kind(data)}")
    return enumerate(data, start=1)


def convert(
    fmt: str,
    path: Path,
    corpus: Path | None = None,
    limit: int | None = None,
    distractors: int = MULTIHOP_RAG_DISTRACTORS,
    seed: int = SEED,
    progress: bool | None = None,
) -> tuple[list[dict[str, Any]], Summary]:
    """Every convertible record of an official file in the schema, with the import's summary."""
    if fmt not in FORMATS:
        raise ImportFailed(f"unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")
    if (fmt == "multihop-rag") != (corpus is not None):
        raise ImportFailed(
            "multihop-rag needs --corpus CORPUS.json"
            if fmt == "multihop-rag"
            else f"--corpus is for multihop-rag, not {fmt}"
        )
    converter: Callable[[Fields, str], dict[str, Any]]
    rag: MultihopRag | None = None
    if fmt == "multihop-rag":
        assert corpus is not None
        rag = MultihopRag(read_corpus(corpus))
        converter = rag
    else:
        converter = {
            "hotpotqa": convert_hotpotqa,
            "2wikimultihopqa": convert_2wiki,
            "musique": convert_musique,
        }[fmt]
    data = load_jsonl(path) if fmt == "musique" else load_json(path)
    numbered = list(_records(path, data))
    source = path.stem
    summary = Summary()
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    bar = tqdm(
        numbered,
        desc=f"importing {path.name}",
        unit="record",
        disable=not sys.stderr.isatty() if progress is None else not progress,
    )
    for number, value in bar:
        if limit is not None and summary.written >= limit:
            break
        summary.read += 1
        try:
            record = converter(Fields(value), source)
        except RecordError as exc:
            raise ImportFailed(f"{path}: record {number}: {exc}") from None
        except Skip as exc:
            summary.skip(str(exc), number, value)
            continue
        if record["id"] in seen:
            summary.skip("repeated id", number, value)
            continue
        seen.add(record["id"])
        out.append(record)
        summary.written += 1
        summary.types[record["type"]] += 1
        summary.unanswerable += not record["answerable"]
    bar.close()
    if rag is not None:
        rag.add_distractors(out, distractors, seed)
    for number, record in enumerate(out, start=1):  # the loader's own check, before writing
        try:
            BenchmarkRecord.model_validate(record).check()
        except ValidationError as exc:
            raise ImportFailed(f"{path}: output record {number}: {explain(exc)}") from None
        except ValueError as exc:
            raise ImportFailed(f"{path}: output record {number}: {exc}") from None
    if not out:
        raise ImportFailed(
            f"{path}: no record could be converted ({summary.read} read; {summary.skipped_line()})"
        )
    return out, summary


def write_atomic(records: Sequence[dict[str, Any]], output: Path) -> None:
    """Write the JSONL to a temporary file beside `output`, then rename it over `output`."""
    output.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=output.parent, prefix=f".{output.name}.")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, output)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    """Convert an official benchmark file to caprag's benchmark JSONL; exit 2 on bad input."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.import_benchmark",
        description=main.__doc__,
        epilog="Then: python -m experiments.run dataset=jsonl dataset.path=OUT.jsonl "
        "dataset.name=NAME",
    )
    parser.add_argument("format", choices=FORMATS)
    parser.add_argument(
        "file", type=Path, help="the official file (multihop-rag: the queries JSON)"
    )
    parser.add_argument("-o", "--output", type=Path, required=True, help="the JSONL to write")
    parser.add_argument("--corpus", type=Path, help="multihop-rag only: the corpus JSON")
    parser.add_argument("--limit", type=int, help="convert only the first N usable records")
    parser.add_argument(
        "--distractors",
        type=int,
        default=MULTIHOP_RAG_DISTRACTORS,
        help="multihop-rag only: random corpus articles per query (default %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=SEED, help="for the multihop-rag draw")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    if args.distractors < 0:
        parser.error("--distractors must be 0 or more")
    try:
        records, summary = convert(
            args.format, args.file, args.corpus, args.limit, args.distractors, args.seed
        )
        write_atomic(records, args.output)
    except ImportFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {args.output}: cannot write ({exc.strerror or exc})", file=sys.stderr)
        return 2
    for line in summary.lines(args.output):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
