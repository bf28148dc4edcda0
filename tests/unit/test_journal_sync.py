"""The run journal's guarantees: an appended case survives the process being killed at once, and
a disk that cannot sync is an error the run sees, not a silent loss."""

from __future__ import annotations

import errno
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from caprag.config import PROJECT_ROOT
from experiments.harness import journal as journal_module
from experiments.harness.journal import Journal, JournalSyncError
from experiments.results.row import QuestionRow

APPEND_THEN_KILL = textwrap.dedent(
    """
    import os, signal, sys
    from experiments.results.row import QuestionRow
    from experiments.harness.journal import Journal

    journal = Journal(sys.argv[1], "run").open()
    for number in range(3):
        row = QuestionRow(
            case_id=f"c{number}", question_id=f"q{number}", set="set", query_type="factual",
            turn=1, question="question?", gold_answer="answer",
        )
        journal.append(f"0:c{number}", [row])
    os.kill(os.getpid(), signal.SIGKILL)  # no close, no sync, no exit handler
    """
)


def row(case: str) -> QuestionRow:
    return QuestionRow(
        case_id=case, question_id=case, set="set", query_type="factual", turn=1,
        question="question?", gold_answer="answer",
    )  # fmt: skip


def test_appended_cases_survive_a_kill_9_right_after_the_append(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", APPEND_THEN_KILL, str(tmp_path)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -9, done.stderr
    journal = Journal(tmp_path, "run")
    assert not journal.busy()  # the dead process's lock is gone
    assert sorted(journal.done()) == ["0:c0", "0:c1", "0:c2"]


def test_a_failed_fsync_is_raised_by_sync_and_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(_fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    journal = Journal(tmp_path, "run").open()
    journal.append("0:a", [row("a")])
    journal.sync()  # the real disk: fine
    monkeypatch.setattr(journal_module.os, "fsync", broken)
    journal.append("0:b", [row("b")])
    with pytest.raises(JournalSyncError, match=r"cannot sync the run journal .*run\.jsonl"):
        journal.sync()
    journal.append("0:c", [row("c")])
    with pytest.raises(JournalSyncError, match="Input/output error"):
        journal.close()
    monkeypatch.undo()
    # The lines were written all the same, and the lock was released.
    assert sorted(Journal(tmp_path, "run").done()) == ["0:a", "0:b", "0:c"]
    assert not Journal(tmp_path, "run").busy()


def test_close_syncs_every_line_and_removes_when_asked(tmp_path: Path) -> None:
    journal = Journal(tmp_path, "run").open()
    for number in range(50):
        journal.append(f"0:{number}", [row(str(number))])
    journal.close()
    assert len(Journal(tmp_path, "run").done()) == 50
    again = Journal(tmp_path, "run").open()
    again.close(remove=True)
    assert not again.exists
