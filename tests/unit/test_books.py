"""Book parsing: the corpus format and its errors (file and line)."""

from __future__ import annotations

from pathlib import Path

import pytest

from caprag.errors import BookFormatError
from caprag.retrieval.books import iter_citations, load_books, parse_book, slugify
from tests.conftest import FIXTURE_BOOKS

GOOD_HEAD = "---\nbook_id: demo\nshort: Demo\ntitle: Demo\nedition: 1\npublished: 2024-01-01\n---\n"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "book.md"
    path.write_text(text)
    return path


def test_fixture_books_parse_into_passages_with_pages_and_ids() -> None:
    books = {b.meta.book_id: b for b in load_books(FIXTURE_BOOKS)}
    flurry = next(p for p in books["fighting"].passages if p.section == "Flurry")
    assert flurry.passage_id == "fighting/flurry"
    assert flurry.page == 4
    assert flurry.chapter == "Chapter 1: Attacks"
    assert "Old Soldier (Gifts, p. 7)" in " ".join(flurry.text.split())
    assert books["gifts"].meta.edition == 1


def test_slug_rule() -> None:
    assert slugify("Table 3: Harm by Weapon") == "table-3-harm-by-weapon"
    assert slugify("Ember-Blind") == "ember-blind"


def test_missing_metadata_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "---\nbook_id: demo\ntitle: Demo\n---\n<!-- page 1 -->\n## A\ntext\n")
    with pytest.raises(BookFormatError) as info:
        parse_book(path)
    assert str(info.value).startswith(f"{path}:4:")
    assert "short, edition, published" in str(info.value)


def test_no_front_matter_is_line_1(tmp_path: Path) -> None:
    path = write(tmp_path, "# Just a heading\n")
    with pytest.raises(BookFormatError, match=r"book\.md:1: expected front matter"):
        parse_book(path)


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ("<!-- page 2 -->\n## A\nx\n<!-- page 1 -->\n", 11, "page 1 does not follow page 2"),
        ("<!-- page 1 -->\n## A\nx\n## A\ny\n", 11, "repeats line 9"),
        ("## A\nx\n", 8, "before the first"),
        ("<!-- page 1 -->\n### Deep\n", 9, "deeper than"),
        ("<!-- page 1 -->\nloose text\n", 9, "outside a '## ' section"),
    ],
)
def test_body_errors_name_the_line(tmp_path: Path, body: str, line: int, message: str) -> None:
    path = write(tmp_path, GOOD_HEAD + body)
    with pytest.raises(BookFormatError) as info:
        parse_book(path)
    assert info.value.line == line
    assert message in info.value.message


def test_bad_date_and_edition(tmp_path: Path) -> None:
    path = write(
        tmp_path, GOOD_HEAD.replace("2024-01-01", "last spring") + "<!-- page 1 -->\n## A\nx\n"
    )
    with pytest.raises(BookFormatError, match=r":6: published must be a date"):
        parse_book(path)


def test_citations_are_found_in_both_forms() -> None:
    text = "modified by Rapid Strike (Combat, p. 41); see Powers, p. 100 for more."
    assert [(s, p) for s, p, _ in iter_citations(text)] == [("Combat", 41), ("Powers", 100)]
