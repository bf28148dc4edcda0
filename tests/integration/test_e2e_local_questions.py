"""The local-model pass's question sets: each conversation cut to its first turns, the rest kept
line for line."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.perf.e2e_local import question_sets
from experiments.results.questions import QUESTIONS_DIR


def test_conversations_keep_their_first_turns_and_every_line_stays_where_it_was(
    tmp_path: Path,
) -> None:
    folder = question_sets(tmp_path / "questions", 3)
    for original in sorted(QUESTIONS_DIR.glob("*.jsonl")):
        before = original.read_text(encoding="utf-8").splitlines()
        after = (folder / original.name).read_text(encoding="utf-8").splitlines()
        assert len(after) == len(before), original.name
        for old, new in zip(before, after, strict=True):
            if not old.strip():
                assert not new.strip()
                continue
            item, cut = json.loads(old), json.loads(new)
            if "turns" in item:
                assert cut["turns"] == item["turns"][:3]
                assert {**cut, "turns": item["turns"]} == item
            else:
                assert cut == item
    assert question_sets(tmp_path / "unused", None) == QUESTIONS_DIR
    assert not (tmp_path / "unused").exists()
