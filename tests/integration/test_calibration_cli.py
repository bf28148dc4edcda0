"""`python -m experiments.calibration fit|check` on the fixture corpus, end to end."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import caprag.calibration as library
from caprag.calibration import Calibration
from experiments.cli import calibration as cli
from experiments.scoring import calibration
from tests.integration.test_harness import fixture_overrides


def test_fit_writes_a_calibration_and_check_says_where_it_was_fitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for module in (cli, library):  # where the CLI saves, and where the library loads from
        monkeypatch.setattr(module, "CALIBRATIONS", tmp_path / "calibration")
    overrides = [*fixture_overrides(tmp_path), "strategy.depth_chunks=[2,4,8]"]
    assert cli.main(["fit", "fixture", "dataset=all", *overrides]) == 0
    saved = yaml.safe_load((tmp_path / "calibration" / "fixture.yaml").read_text())
    fitted = Calibration.from_config(saved)
    assert fitted is not None and set(fitted.weights) == set(calibration.FEATURES)
    assert fitted.fitted_on.startswith("all ")
    out = capsys.readouterr().out
    assert "(fitted on it: in-sample): 24 rows" in out  # 8 answerable turns x 3 depths

    assert cli.main(["check", "fixture", "dataset=all", *overrides]) == 0
    assert "all (IN-SAMPLE: fitted on this dataset)" in capsys.readouterr().out
    assert cli.main(["check", "fixture", "dataset=single_book", *overrides]) == 0
    out = capsys.readouterr().out
    assert "single_book (held out)" in out and "single_book depth 3" in out
    with pytest.raises(ValueError, match="no calibration 'missing'"):
        cli.main(["check", "missing", "dataset=all", *overrides])
