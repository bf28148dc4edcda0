"""`python -m caprag ask` with the adaptive strategy prints each round's depth, chunks,
confidence, threshold and decision, the same rounds its decision log keeps (issue 19, point 5)."""

from __future__ import annotations

import re
from pathlib import Path

from caprag.serve.decision_log import DecisionLog
from tests.reliability.test_cli import ask, index_dir  # noqa: F401  (the shared index fixture)

CROSS_REF = "What penalty does the second attack of a Flurry suffer?"
ROUND = re.compile(
    r"^  round (\d+): depth (\d+)/(\d+), (\d+) chunks, confidence ([\d.]+), "
    r"threshold ([\d.]+) → (\S+)$",
    re.MULTILINE,
)
ADAPTIVE = {"RETRIEVAL_STRATEGY": "adaptive", "CAPRAG_DEPTH_CHUNKS": "2,4,8"}


def test_adaptive_rounds_are_printed_as_the_log_keeps_them(
    tmp_path: Path,
    index_dir: Path,  # noqa: F811
) -> None:
    done = ask(tmp_path, index_dir, CROSS_REF, "--power", "auto", **ADAPTIVE)
    assert done.returncode == 0, done.stderr
    [record] = DecisionLog(tmp_path / ".caprag" / "decisions.db").records()  # the default file
    printed = ROUND.findall(done.stdout)
    assert printed, done.stdout
    assert printed == [
        (
            str(r.round),
            str(r.depth),
            "3",
            str(r.chunks),
            f"{r.confidence:.2f}",
            f"{r.threshold:.2f}",
            r.decision,
        )
        for r in record.rounds
    ]
    assert f"power auto (request), {record.query_type} question, ladder 2 / 4 / 8 chunks, " in (
        done.stdout
    )
    assert f"stopped: {record.stop_reason}" in done.stdout
    assert f"request {record.request_id}" in done.stdout
    assert "hop 1:" not in done.stdout  # the rounds replace the hop counts


def test_without_a_power_the_cli_uses_fixed_depth_2(tmp_path: Path, index_dir: Path) -> None:  # noqa: F811
    log = tmp_path / "log.db"
    done = ask(tmp_path, index_dir, CROSS_REF, CAPRAG_DECISION_LOG=str(log), **ADAPTIVE)
    assert done.returncode == 0, done.stderr
    assert "power 2 (balanced) (default)" in done.stdout
    assert [r[1:4] + r[6:] for r in ROUND.findall(done.stdout)] == [("2", "3", "4", "forced_depth")]
    forced = ask(
        tmp_path, index_dir, CROSS_REF, "--power", "1", CAPRAG_DECISION_LOG=str(log), **ADAPTIVE
    )
    assert "power 1 (quick) (request)" in forced.stdout
    assert [r[1] for r in ROUND.findall(forced.stdout)] == ["1"]
    assert [r.power for r in DecisionLog(log).records()] == ["1", "2"]


def test_a_bad_power_is_refused(tmp_path: Path, index_dir: Path) -> None:  # noqa: F811
    done = ask(tmp_path, index_dir, CROSS_REF, "--power", "5", **ADAPTIVE)
    assert done.returncode == 2
    assert "argument --power: invalid choice: '5'" in done.stderr


def test_other_strategies_still_print_hops(tmp_path: Path, index_dir: Path) -> None:  # noqa: F811
    done = ask(tmp_path, index_dir, CROSS_REF, RETRIEVAL_STRATEGY="multi-hop")
    assert done.returncode == 0, done.stderr
    assert "  hop 1: 1 query(ies)" in done.stdout and "round 1:" not in done.stdout
