"""`make reports-check`: a committed report that no longer matches the code is named, with what
changed; a fresh one passes (experiments.cli.reports)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from caprag.config import PROJECT_ROOT
from experiments.cli import reports


def _copy(report: reports.Report, root: Path) -> None:
    """The report's inputs and its file, as a checkout at `root` would hold them."""
    for path in reports.input_files(report):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PROJECT_ROOT / path, root / path)
    (root / "reports").mkdir(exist_ok=True)
    (root / "reports" / report.name).write_text("numbers\n")


def test_a_change_to_the_analyzer_rule_makes_the_reports_stale(tmp_path: Path) -> None:
    report = next(r for r in reports.reports() if r.name == "strategies.md")
    _copy(report, tmp_path)
    manifest = {report.name: {"inputs": reports.digests(report, tmp_path)}}
    assert reports.stale(report, manifest, tmp_path) == []
    rule = tmp_path / "caprag" / "steps" / "analyze.py"
    rule.write_text(rule.read_text().replace("MAX_NEW_QUERIES = 3", "MAX_NEW_QUERIES = 4"))
    assert reports.stale(report, manifest, tmp_path) == ["caprag/steps/analyze.py changed"]


def test_a_report_never_built_or_with_new_inputs_is_stale(tmp_path: Path) -> None:
    report = next(r for r in reports.reports() if r.name == "benchmarks.md")
    _copy(report, tmp_path)
    assert reports.stale(report, {}, tmp_path) == ["never built by `make reports`"]
    manifest = {report.name: {"inputs": reports.digests(report, tmp_path)}}
    (tmp_path / "caprag" / "steps" / "new_step.py").write_text("X = 1\n")
    assert reports.stale(report, manifest, tmp_path) == ["caprag/steps/new_step.py is new"]


def test_serving_code_is_not_an_input_of_any_report() -> None:
    for report in reports.reports():
        inputs = {str(p) for p in reports.input_files(report)}
        assert "caprag/serve/api.py" not in inputs and "caprag/steps/analyze.py" in inputs


def test_the_committed_manifest_names_every_report() -> None:
    manifest = json.loads((PROJECT_ROOT / "reports" / "manifest.json").read_text())
    assert {r.name for r in reports.reports()} <= set(manifest)
