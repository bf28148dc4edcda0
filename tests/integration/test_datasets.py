"""The shipped question sets validate against the corpus; a broken copy fails with file:line."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from caprag.config import BUNDLED_CORPUS
from experiments.cli.validate import main, validate
from experiments.results.questions import QUESTIONS_DIR, DatasetError, load_questions


def test_shipped_sets_are_valid() -> None:
    problems, summary = validate(QUESTIONS_DIR, BUNDLED_CORPUS)
    assert problems == []
    counts = {line.split(":")[0]: int(line.split()[1]) for line in summary}
    assert counts["single_book"] >= 80 and counts["cross_book"] >= 80
    assert counts["follow_up"] >= 20 and counts["unanswerable"] >= 15


def test_every_query_type_is_in_both_main_sets() -> None:
    for name in ("single_book", "cross_book"):
        types = {q.query_type for q in load_questions(QUESTIONS_DIR / f"{name}.jsonl")}
        assert types == {"factual", "operational", "decision", "strategic"}


@pytest.fixture
def broken_copy(tmp_path: Path) -> Path:
    target = tmp_path / "questions"
    shutil.copytree(QUESTIONS_DIR, target, ignore=shutil.ignore_patterns("parts"))
    return target


def test_unknown_gold_passage_is_reported_with_file_and_line(
    broken_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = broken_copy / "cross_book.jsonl"
    lines = path.read_text().splitlines()
    lines[4] = re.sub(
        r'"gold_passages": \["([a-z]+)/[a-z0-9-]+"',
        r'"gold_passages": ["\1/no-such-rule"',
        lines[4],
    )
    path.write_text("\n".join(lines) + "\n")
    problems, _ = validate(broken_copy, BUNDLED_CORPUS)
    assert any(p.startswith(f"{path}:5: gold passage") and "no-such-rule" in p for p in problems)
    assert main(["--questions", str(broken_copy)]) == 1
    assert f"{path}:5:" in capsys.readouterr().err


def test_broken_json_and_missing_field_name_the_line(broken_copy: Path) -> None:
    path = broken_copy / "single_book.jsonl"
    lines = path.read_text().splitlines()
    lines[2] = lines[2][:-3]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=rf"{path}:3: not valid JSON"):
        load_questions(path)
    lines[2] = '{"id": "x", "question": "q"}'
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=rf"{path}:3: answer: Field required"):
        load_questions(path)


def test_every_bad_line_is_reported_not_only_the_first(broken_copy: Path) -> None:
    path = broken_copy / "single_book.jsonl"
    lines = path.read_text().splitlines()
    lines[3] = lines[3].replace('"hops": 1', '"hops": 2')
    lines[7] = lines[7].replace('"query_type": "', '"query_type": "x', 1)
    path.write_text("\n".join(lines) + "\n")
    problems, _ = validate(broken_copy, BUNDLED_CORPUS)
    assert any(p.startswith(f"{path}:4:") and "hops is 2" in p for p in problems)
    assert any(p.startswith(f"{path}:8: query_type") for p in problems)


def test_duplicate_ids_and_unknown_passages_are_found(broken_copy: Path) -> None:
    path = broken_copy / "single_book.jsonl"
    lines = path.read_text().splitlines()
    lines.append(lines[0])
    lines.append(
        lines[1]
        .replace('"gold_passages": ["core/', '"gold_passages": ["core/x', 1)
        .replace('"id": "', '"id": "new-', 1)
        .replace('?"', '??"', 1)
    )
    path.write_text("\n".join(lines) + "\n")
    problems, _ = validate(broken_copy, BUNDLED_CORPUS)
    last = len(lines)
    assert any(p.startswith(f"{path}:{last - 1}: id ") and "repeats" in p for p in problems)
    assert any(p.startswith(f"{path}:{last}: gold passage 'core/x") for p in problems)


def test_limit_per_set_takes_a_number_or_one_per_set() -> None:
    from experiments.harness.data import load_dataset

    sets = ["single_book", "follow_up", "unanswerable"]
    each = load_dataset("all", sets, limit_per_set=2)
    assert [c.set for c in each.cases] == ["single_book"] * 2 + ["follow_up"] * 2 + [
        "unanswerable"
    ] * 2
    mixed = load_dataset("all", sets, limit_per_set={"single_book": 3, "follow_up": 1})
    counts = {s: sum(c.set == s for c in mixed.cases) for s in sets}
    everything = load_dataset("all", ["unanswerable"])
    assert counts == {"single_book": 3, "follow_up": 1, "unanswerable": len(everything.cases)}
