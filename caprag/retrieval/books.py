"""Parse rulebook Markdown (front matter, page markers, chapters, sections) into passages."""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from caprag.errors import BookFormatError, CapragError
from caprag.text import DEFAULT_LIBRARY, iter_citations, library_name

REQUIRED_META = ("book_id", "short", "title", "edition", "published")
PAGE_MARKER = re.compile(r"^<!--\s*page\s+(\d+)\s*-->\s*$")
BOOK_ID = re.compile(r"^[a-z][a-z0-9_-]{1,40}$")


def slugify(heading: str) -> str:
    """Turn a section heading into the slug part of a passage id."""
    return re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")


@dataclass(frozen=True)
class BookMeta:
    """Bibliographic metadata of one rulebook."""

    book_id: str
    short: str
    title: str
    edition: int
    published: dt.date


@dataclass(frozen=True)
class Passage:
    """One retrievable section of a rulebook (a parent chunk)."""

    passage_id: str
    book: BookMeta
    chapter: str
    section: str
    page: int
    text: str
    line: int


@dataclass
class Book:
    """A parsed rulebook: metadata, passages and the hash of its source text."""

    meta: BookMeta
    path: Path
    content_hash: str
    passages: list[Passage] = field(default_factory=list)


def _parse_front_matter(path: Path, lines: list[str]) -> tuple[BookMeta, int]:
    if not lines or lines[0].strip() != "---":
        found = lines[0].strip()[:40] if lines else ""
        raise BookFormatError(
            path, 1, f"expected front matter starting with '---', found {found!r}"
        )
    values: dict[str, tuple[str, int]] = {}
    for number, raw in enumerate(lines[1:], start=2):
        line = raw.strip()
        if line == "---":
            end = number
            break
        if not line:
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise BookFormatError(
                path, number, f"expected 'key: value' in front matter, got {line!r}"
            )
        values[key.strip()] = (value.strip().strip('"').strip("'"), number)
    else:
        raise BookFormatError(path, len(lines), "front matter is not closed with '---'")
    missing = [key for key in REQUIRED_META if key not in values]
    if missing:
        raise BookFormatError(
            path,
            end,
            f"front matter lacks required key(s) {', '.join(missing)}"
            f" (required: {', '.join(REQUIRED_META)})",
        )
    book_id, line_no = values["book_id"]
    if not BOOK_ID.match(book_id):
        raise BookFormatError(path, line_no, f"book_id {book_id!r} must match {BOOK_ID.pattern}")
    edition_text, line_no = values["edition"]
    if not edition_text.isdigit():
        raise BookFormatError(
            path, line_no, f"edition must be a whole number, got {edition_text!r}"
        )
    published_text, line_no = values["published"]
    try:
        published = dt.date.fromisoformat(published_text)
    except ValueError:
        raise BookFormatError(
            path, line_no, f"published must be a date YYYY-MM-DD, got {published_text!r}"
        ) from None
    meta = BookMeta(
        book_id=book_id,
        short=values["short"][0],
        title=values["title"][0],
        edition=int(edition_text),
        published=published,
    )
    return meta, end


def read_text(path: Path) -> str:
    """A book's text; BookFormatError naming the line of the first byte that is not text."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BookFormatError(path, 1, f"cannot read the file ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark is not part of the front matter
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise BookFormatError(
            path,
            line,
            f"expected UTF-8 text, found byte 0x{data[exc.start]:02x} at column {column} "
            "(save the file as UTF-8)",
        ) from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise BookFormatError(path, line, "expected text, found a NUL byte (a binary file?)")
    return text


def parse_book(path: Path | str) -> Book:
    """Read one rulebook file; raise BookFormatError with file and line on bad input."""
    path = Path(path)
    source = read_text(path)
    lines = source.splitlines()
    if not source.strip():
        raise BookFormatError(
            path, 1, "the file is empty (expected front matter starting with '---')"
        )
    meta, body_start = _parse_front_matter(path, lines)
    book = Book(meta=meta, path=path, content_hash=hashlib.sha256(source.encode()).hexdigest())
    page: int | None = None
    chapter = ""
    current: dict[str, object] | None = None
    body: list[str] = []
    seen: dict[str, int] = {}

    def close() -> None:
        if current is None:
            return
        text = "\n".join(body).strip()
        if not text:
            raise BookFormatError(path, int(str(current["line"])), "section has no text")
        book.passages.append(
            Passage(
                passage_id=f"{meta.book_id}/{current['slug']}",
                book=meta,
                chapter=chapter,
                section=str(current["section"]),
                page=int(str(current["page"])),
                text=text,
                line=int(str(current["line"])),
            )
        )

    for number, raw in enumerate(lines[body_start:], start=body_start + 1):
        marker = PAGE_MARKER.match(raw.strip())
        if marker:
            new_page = int(marker.group(1))
            if page is not None and new_page <= page:
                raise BookFormatError(
                    path,
                    number,
                    f"page {new_page} does not follow page {page} (pages must increase)",
                )
            page = new_page
            continue
        if raw.startswith("### "):
            raise BookFormatError(path, number, "headings deeper than '##' are not allowed")
        if raw.startswith("# ") or raw.startswith("## "):
            if page is None:
                raise BookFormatError(
                    path, number, "heading before the first '<!-- page N -->' marker"
                )
            close()
            body = []
            current = None
            if raw.startswith("# "):
                chapter = raw[2:].strip()
                continue
            section = raw[3:].strip()
            slug = slugify(section)
            if not slug:
                raise BookFormatError(path, number, f"heading {section!r} gives an empty id")
            if slug in seen:
                raise BookFormatError(
                    path, number, f"section id {meta.book_id}/{slug} repeats line {seen[slug]}"
                )
            seen[slug] = number
            current = {"section": section, "slug": slug, "page": page, "line": number}
            continue
        if current is None:
            if raw.strip() and not raw.strip().startswith("<!--"):
                raise BookFormatError(path, number, "text outside a '## ' section")
            continue
        body.append(raw)
    close()
    if not book.passages:
        raise BookFormatError(path, len(lines), "book has no '## ' sections")
    return book


def find_book_files(path: Path | str) -> list[Path]:
    """The Markdown books of a folder: every `*.md` file in it but README.md (or the one file).

    Every such file is a book: one that cannot be parsed is an error, never skipped.
    """
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"no book file or folder at {path}")
    return sorted(
        p
        for p in path.iterdir()
        if p.suffix.lower() == ".md"
        and p.name.upper() != "README.MD"
        and not p.name.startswith(".")  # editor lock and swap files
        and not p.is_dir()
    )


def load_books(path: Path | str) -> list[Book]:
    """Parse every book under path; raise on a folder without books or a repeated book_id."""
    files = find_book_files(path)
    if not files:
        raise CapragError(
            f"{path}: no books in this folder (expected Markdown files *.md with front matter)"
        )
    books = [parse_book(file) for file in files]
    owners: dict[str, Path] = {}
    for book in books:
        if book.meta.book_id in owners:
            raise BookFormatError(
                book.path,
                2,
                f"book_id {book.meta.book_id!r} is also used by {owners[book.meta.book_id]}",
            )
        owners[book.meta.book_id] = book.path
    return books


def library_of(books: Iterable[Book]) -> str:
    """What the steps' prompts call these books (`caprag.text.library_name` of their titles)."""
    return library_name([book.meta.title for book in books])


def corpus_library(path: Path | str) -> str:
    """What the steps call the corpus at `path`, from its books' titles (their front matter
    only: the bodies are not parsed); a folder that holds no readable book is 'the library'
    (ingesting it says what is wrong)."""
    try:
        titles = [
            _parse_front_matter(file, read_text(file).splitlines())[0].title
            for file in find_book_files(path)
        ]
    except (CapragError, OSError):
        return DEFAULT_LIBRARY
    return library_name(titles)


def main(argv: list[str] | None = None) -> int:
    """Check book files and print a summary of each."""
    parser = argparse.ArgumentParser(prog="python -m caprag.books", description=main.__doc__)
    parser.add_argument("paths", nargs="+", type=Path)
    args = parser.parse_args(argv)
    status = 0
    for path in args.paths:
        try:
            for book in load_books(path):
                words = [len(p.text.split()) for p in book.passages]
                refs = sum(len(list(iter_citations(p.text))) for p in book.passages)
                print(
                    f"{book.path}: {book.meta.book_id} ok, {len(book.passages)} passages, "
                    f"pages {book.passages[0].page}-{book.passages[-1].page}, "
                    f"words/passage min {min(words)} max {max(words)}, {refs} citations"
                )
        except (CapragError, FileNotFoundError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
