"""`python -m caprag ask` as a user runs it (issue 16): follow-ups across processes, a SQLite
store that lets the process exit, and bad input as one `error:` line."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from caprag.__main__ import main
from tests.conftest import FIXTURE_BOOKS

HANG_S = 600  # only catches a hang (the bug: a process that never exits); a call takes seconds


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One vector store of the fixture books for every call here (the first call fills it)."""
    return tmp_path_factory.mktemp("cli-index")


def settings_for(index_dir: Path) -> dict[str, str]:
    """The fixture books, the shared store and k=2."""
    return {
        "CAPRAG_CORPUS": str(FIXTURE_BOOKS),
        "CAPRAG_CHROMA_DIR": str(index_dir),
        "CAPRAG_K": "2",
    }


def ask(workdir: Path, index_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m caprag ask ARGS` in `workdir` (where its default store lives)."""
    settings = settings_for(index_dir)
    defaults = ("CAPRAG_CHECKPOINTER", "CAPRAG_DECISION_LOG")  # their files in `workdir`
    inherited = {k: v for k, v in os.environ.items() if k not in defaults}
    return subprocess.run(
        [sys.executable, "-m", "caprag", "ask", *args],
        cwd=workdir,
        env={**inherited, **settings, **env},
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


def test_a_follow_up_in_a_second_process_continues_the_conversation(
    tmp_path: Path, index_dir: Path
) -> None:
    thread = str(uuid.uuid4())
    first = ask(tmp_path, index_dir, "What does Old Soldier cost?", "--thread", thread)
    assert first.returncode == 0, first.stderr
    assert "6 gift points" in first.stdout
    assert f"(new conversation: continue it with --thread {thread})" in first.stdout
    second = ask(tmp_path, index_dir, "What penalty does it halve?", "--thread", thread)
    assert second.returncode == 0, second.stderr
    assert "(searched as: What penalty does Old Soldier halve?)" in second.stdout
    assert "new conversation" not in second.stdout
    assert (tmp_path / ".caprag" / "cli-chat.db").is_file()  # the CLI's default store


def test_a_question_without_thread_says_how_to_continue(tmp_path: Path, index_dir: Path) -> None:
    done = ask(tmp_path, index_dir, "How long does a torch burn?")
    assert done.returncode == 0, done.stderr
    said = done.stdout.strip().splitlines()[-1]
    assert said.startswith("(new conversation: continue it with --thread ")
    uuid.UUID(said.removeprefix("(new conversation: continue it with --thread ").rstrip(")"))


def test_an_explicit_sqlite_store_lets_the_process_exit(tmp_path: Path, index_dir: Path) -> None:
    store = tmp_path / "chat.db"
    done = ask(
        tmp_path,
        index_dir,
        "How long does a torch burn?",
        "--thread",
        "t",
        CAPRAG_CHECKPOINTER=f"sqlite:{store}",
    )
    assert done.returncode == 0, done.stderr
    assert "one hour" in done.stdout and store.is_file()
    assert not (tmp_path / ".caprag" / "cli-chat.db").exists()  # the setting overrides it


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (("",), {}, "error: the question is empty"),
        (("  \t ",), {}, "error: the question is empty"),
        (("\u200b\u200c\ufeff",), {}, "error: the question is empty"),
        (("x" * 4001,), {}, "error: the question has 4001 characters; the limit is 4000"),
        (("ok?", "--thread", " "), {}, "error: --thread needs a thread id"),
        (("ok?",), {"CAPRAG_K": "abc"}, "error: invalid settings: CAPRAG_K='abc'"),
        (("ok?",), {"CAPRAG_CHECKPOINTER": "bogus"}, "unknown checkpointer 'bogus'"),
        (
            ("ok?",),
            {"CAPRAG_CHECKPOINTER": "sqlite:/nonexistent/x.db"},
            "error: cannot open the conversation store",
        ),
    ],
    ids=["empty", "blank", "zero-width", "too-long", "blank-thread", "k", "checkpointer", "store"],
)
def test_bad_input_is_one_error_line_and_exit_2(
    args: tuple[str, ...],
    env: dict[str, str],
    said: str,
    tmp_path: Path,
    index_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # In this process: the entry point's main() is what `python -m caprag` exits with, and the
    # tests above already pay for the interpreter and its imports in processes of their own.
    monkeypatch.chdir(tmp_path)
    for key in ("CAPRAG_CHECKPOINTER", "CAPRAG_DECISION_LOG"):  # their files in tmp_path
        monkeypatch.delenv(key, raising=False)
    for key, value in {**settings_for(index_dir), **env}.items():
        monkeypatch.setenv(key, value)
    code = main(["ask", *args])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert err.count("\n") == 1 and said in err, err
    assert out == ""
