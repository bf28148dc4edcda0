"""An import that converts nothing says why: the reasons of the skipped records, counted, with the
first record of each (probe: it said only "no record could be converted (3 read)")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from caprag.config import PROJECT_ROOT
from experiments.cli.import_benchmark import main

HOTPOTQA = PROJECT_ROOT / "tests" / "fixtures" / "official" / "hotpotqa_dev_distractor.json"


def test_an_import_of_only_skipped_records_names_each_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = json.loads(HOTPOTQA.read_text(encoding="utf-8"))
    for record in records:
        record["supporting_facts"] = [["Not In Context", 0]]
    path = tmp_path / "hotpot.json"
    path.write_text(json.dumps(records), encoding="utf-8")
    assert main(["hotpotqa", str(path), "-o", str(tmp_path / "out.jsonl")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"error: {path}: no record could be converted ({len(records)} read; skipped: "
        f"{len(records)} (no supporting paragraph in the context: {len(records)}, "
        f"first record 1 (id {records[0]['_id']})))"
    )
