"""Bad harness input fails before any question, with one line naming the file:line or the key.

Each test drives the harness as a user does: `run(cfg)` on a composed Hydra config, or the real
CLI `python -m experiments.run ...` (exit 2, `error: ...` on stderr, no traceback).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from caprag.config import PROJECT_ROOT, load_settings
from caprag.errors import BookFormatError, CapragError, ConfigError
from caprag.retrieval.ingest import ingest_path
from experiments.harness.run import run
from experiments.harness.settings import check_tracking_uri
from experiments.results.questions import DatasetError
from tests.conftest import FIXTURE_BOOKS, FIXTURE_QUESTIONS

CONF = PROJECT_ROOT / "conf"


def overrides(
    tmp: Path, questions: Path = FIXTURE_QUESTIONS, corpus: Path = FIXTURE_BOOKS
) -> list[str]:
    return [
        f"paths.corpus={corpus}",
        f"paths.questions={questions}",
        f"paths.store={tmp / 'store'}",
        f"paths.cache={tmp / 'llm-cache.sqlite'}",
        f"paths.journals={tmp / 'journals'}",
        "retriever=wordllama",
        "tracking.enabled=false",
        "experiment.progress=false",
        "experiment.ragas=false",
    ]


def make_cfg(tmp: Path, *extra: str, **paths: Path) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[*overrides(tmp, **paths), *extra])


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "experiments.run", *args],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=600,
        env={"PATH": "/usr/bin:/bin"},
    )


def assert_one_line_error(done: subprocess.CompletedProcess[str], *parts: str) -> str:
    """Exit 2, one `error: ...` line on stderr holding every part, no traceback."""
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr[-2000:]
    for part in parts:
        assert part in errors[0]
    return errors[0]


def copy_questions(tmp: Path) -> Path:
    questions = tmp / "questions"
    shutil.copytree(FIXTURE_QUESTIONS, questions)
    return questions


def copy_books(tmp: Path) -> Path:
    books = tmp / "books"
    shutil.copytree(FIXTURE_BOOKS, books)
    return books


# 1. A gold passage the index does not have ------------------------------------------------------


def test_unknown_gold_passage_fails_at_load_with_file_line(tmp_path: Path) -> None:
    questions = copy_questions(tmp_path)
    file = questions / "cross_book.jsonl"
    file.write_text(file.read_text().replace('"gifts/night-eyes"', '"gifts/night-eye"'))
    with pytest.raises(DatasetError) as info:
        run(make_cfg(tmp_path, "dataset=cross_book", questions=questions))
    message = str(info.value)
    assert message.startswith(f"{file}:2: gold passage 'gifts/night-eye' of question t-cb-2")
    assert "did you mean 'gifts/night-eyes'" in message
    assert not (tmp_path / "journals").exists()  # no question ran


def test_unknown_gold_passage_in_a_later_turn_names_the_conversation_line(tmp_path: Path) -> None:
    questions = copy_questions(tmp_path)
    file = questions / "follow_up.jsonl"
    file.write_text(file.read_text().replace('"fighting/flurry"', '"fighting/fury"'))
    with pytest.raises(DatasetError, match=rf"^{file}:1: gold passage 'fighting/fury'"):
        run(make_cfg(tmp_path, "dataset=follow_up", questions=questions))


def test_unknown_gold_passage_fails_in_the_cli(tmp_path: Path) -> None:
    questions = copy_questions(tmp_path)
    file = questions / "single_book.jsonl"
    file.write_text(file.read_text().replace('"basics/resting"', '"basics/rest"'))
    done = run_cli(*overrides(tmp_path, questions), "dataset=single_book")
    assert_one_line_error(done, f"{file}:2: gold passage 'basics/rest'")
    assert "run " not in done.stdout  # no question was asked


# 2. Settings outside what they allow ------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "shown"),
    [
        ("retriever.k=-1", "retriever.k=-1 is not allowed: expected a whole number of at least 1"),
        ("retriever.k=0", "retriever.k=0 is not allowed: expected a whole number of at least 1"),
        ("retriever.k=abc", "retriever.k='abc' is not allowed"),
        (
            "experiment.limit=-1",
            "experiment.limit=-1 is not allowed: expected a whole number of at least 1 or null",
        ),
        ("experiment.limit=0", "experiment.limit=0 is not allowed"),
        ("experiment.limit=2.5", "experiment.limit=2.5 is not allowed"),
        ("experiment.limit_per_set=0", "experiment.limit_per_set=0 is not allowed"),
        ("experiment.limit_per_set={single_book:-2}", "experiment.limit_per_set.single_book=-2"),
        (
            "experiment.question_timeout_s=0",
            "experiment.question_timeout_s=0 is not allowed: expected a number above 0",
        ),
        ("experiment.question_timeout_s=-5", "experiment.question_timeout_s=-5 is not allowed"),
        ("experiment.concurrency=0", "experiment.concurrency=0 is not allowed"),
        ("experiment.repeats=0", "experiment.repeats=0 is not allowed"),
        ("experiment.dry_run_sample=0", "experiment.dry_run_sample=0 is not allowed"),
        ("experiment.cache=maybe", "experiment.cache='maybe' is not allowed: expected true or"),
        ("pipeline.history_pairs=-1", "pipeline.history_pairs=-1 is not allowed"),
        ("strategy.max_hops=0", "strategy.max_hops=0 is not allowed"),
        ("retriever.index.chunk_chars=0", "retriever.index.chunk_chars=0 is not allowed"),
    ],
)
def test_settings_below_their_minimum_fail_before_the_run(
    override: str, shown: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as info:
        run(make_cfg(tmp_path, "dataset=single_book", override))
    assert str(info.value).startswith(shown)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "store").exists()  # nothing was built


@pytest.mark.parametrize(
    ("group", "override", "shown"),
    [
        ("strategy=adaptive", "strategy.depth_chunks=[5,0,30]", "strategy.depth_chunks=[5, 0, 30]"),
        ("strategy=adaptive", "strategy.timeout_s=0", "strategy.timeout_s=0 is not allowed"),
        ("strategy=multi-question", "strategy.n_subquestions=0", "strategy.n_subquestions=0"),
        ("llm=openai", "llm.client.timeout_s=-1", "llm.client.timeout_s=-1 is not allowed"),
        ("llm=openai", "llm.client.parse_attempts=0", "llm.client.parse_attempts=0 is not"),
        ("judge=openai", "judge.max_output_tokens=0", "judge.max_output_tokens=0 is not allowed"),
    ],
)
def test_group_settings_below_their_minimum_fail_before_the_run(
    group: str, override: str, shown: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    with pytest.raises(ConfigError) as info:
        run(make_cfg(tmp_path, "dataset=single_book", group, override))
    assert str(info.value).startswith(shown)
    assert not (tmp_path / "store").exists()


def test_limit_per_set_naming_a_set_the_dataset_lacks_fails(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"names set.s. single that dataset single_book"):
        run(make_cfg(tmp_path, "dataset=single_book", "experiment.limit_per_set={single:1}"))


def test_adaptive_settings_that_do_not_fit_together_are_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        run(make_cfg(tmp_path, "dataset=single_book", "strategy=adaptive", "strategy.max_depth=5"))
    assert str(info.value) == (
        "strategy.max_depth=5 is not allowed: expected a whole number from 1 to 3 (one per "
        "depth_chunks)"
    )
    assert not (tmp_path / "store").exists()  # refused before the index is built


@pytest.mark.parametrize(
    ("override", "shown"),
    [
        ("retriever.k=abc", "retriever.k='abc' is not allowed"),
        ("experiment.limit=-1", "experiment.limit=-1 is not allowed"),
        (
            "tracking.uri=garbage://x",
            "tracking.uri='garbage://x' is not allowed: expected "
            "sqlite:///PATH, file:PATH, a plain folder path, http(s)://HOST[:PORT], postgresql",
        ),
        (
            "strategy=iter-retgen strategy.rounds=abc",
            "strategy.rounds='abc' is not allowed: expected a whole number of at least 1",
        ),
        (
            "strategy=self-ask +strategy.max_hops=2",
            "strategy.max_hops=2 is not allowed: self-ask has no option 'max_hops'",
        ),
    ],
)
def test_bad_settings_are_one_line_errors_in_the_cli(
    override: str, shown: str, tmp_path: Path
) -> None:
    done = run_cli(*overrides(tmp_path), "tracking.enabled=true", *override.split())
    assert_one_line_error(done, shown)
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize(
    "uri",
    [
        "sqlite:///mlruns.db",
        "sqlite:////tmp/x/mlruns.db",
        "file:///tmp/mlruns",
        "file:mlruns",
        "mlruns",
        "/tmp/mlruns",
        "http://127.0.0.1:5000",
        "https://mlflow.example.org/",
        "databricks",
        "databricks://profile",
        "postgresql://mlflow@db.example.org/mlflow",
        "mysql+pymysql://mlflow@127.0.0.1:3306/mlflow",
    ],
)
def test_tracking_uris_mlflow_opens_are_accepted(uri: str, tmp_path: Path) -> None:
    check_tracking_uri(make_cfg(tmp_path, "tracking.enabled=true", f"tracking.uri='{uri}'"))


@pytest.mark.parametrize(
    "uri", ["garbage://x", "sqlite://", "sqlite:mlruns.db", "http://", "s3://bucket/mlruns", " "]
)
def test_tracking_uris_mlflow_cannot_open_are_refused(uri: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tracking.uri=.* is not allowed: expected sqlite:///"):
        check_tracking_uri(make_cfg(tmp_path, f"tracking.uri='{uri}'"))


def test_a_bad_mlflow_tracking_uri_variable_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "garbage://x")
    with pytest.raises(ConfigError, match=r"^MLFLOW_TRACKING_URI='garbage://x' is not allowed"):
        run(make_cfg(tmp_path, "tracking.enabled=true", "tracking.uri=null"))


# 3. Unreadable, empty or broken books and question files ----------------------------------------

LATIN1_BOOK = (
    "---\nbook_id: latin\nshort: Latin\ntitle: Latin\nedition: 1\npublished: 2024-01-01\n---\n"
    "<!-- page 1 -->\n## Caf\u00e9\nA caf\u00e9.\n"
).encode("latin-1")
BAD_BOOKS = [
    ("empty", b"", 1, "the file is empty (expected front matter starting with '---')"),
    ("blank", b"\n  \n", 1, "the file is empty"),
    ("no-front-matter", b"# Notes\n\nSome text.\n", 1, "expected front matter starting with"),
    ("broken-front-matter", b"--\nbook_id: x\n---\n", 1, "expected front matter starting with"),
    ("unclosed-front-matter", b"---\nbook_id: x\nshort: X\n", 3, "front matter is not closed"),
    ("latin-1", LATIN1_BOOK, 9, "expected UTF-8 text, found byte 0xe9 at column 7"),
    ("binary", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", 1, "expected UTF-8 text, found byte 0x89"),
    ("nul", b"---\x00\x00\n", 1, "expected text, found a NUL byte"),
]


@pytest.mark.parametrize(("name", "data", "line", "message"), BAD_BOOKS)
def test_a_bad_book_in_the_corpus_fails_the_run_with_file_line(
    name: str, data: bytes, line: int, message: str, tmp_path: Path
) -> None:
    books = copy_books(tmp_path)
    bad = books / f"{name}.md"
    bad.write_bytes(data)
    with pytest.raises(BookFormatError) as info:
        run(make_cfg(tmp_path, "dataset=single_book", corpus=books))
    assert str(info.value).startswith(f"{bad}:{line}: {message}")


@pytest.mark.parametrize(("name", "data", "line", "message"), BAD_BOOKS[:1] + BAD_BOOKS[5:7])
def test_the_api_start_up_ingest_gets_the_same_book_errors(
    name: str, data: bytes, line: int, message: str, tmp_path: Path
) -> None:
    books = copy_books(tmp_path)
    bad = books / f"{name}.md"
    bad.write_bytes(data)
    settings = load_settings(chroma_dir=tmp_path / "store", embedding="wordllama")
    with pytest.raises(BookFormatError) as info:
        ingest_path(books, settings)
    assert str(info.value).startswith(f"{bad}:{line}: {message}")


def test_a_corpus_folder_without_books_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "books"
    empty.mkdir()
    (empty / "README.md").write_text("# Not a book\n")
    with pytest.raises(CapragError, match="no books in this folder"):
        run(make_cfg(tmp_path, "dataset=single_book", corpus=empty))


def test_a_bad_book_is_a_one_line_error_in_the_cli(tmp_path: Path) -> None:
    books = copy_books(tmp_path)
    (books / "empty.md").write_bytes(b"")
    (books / "zz-latin.md").write_bytes(LATIN1_BOOK)
    done = run_cli(*overrides(tmp_path, corpus=books), "dataset=single_book")
    assert_one_line_error(done, f"{books / 'empty.md'}:1: the file is empty")


BAD_QUESTION_FILES = [
    ("empty", b"", 1, "the file has no questions (expected one JSON object per line)"),
    ("blank", b"\n\n", 1, "the file has no questions"),
    ("latin-1", '{"id": "caf\u00e9"}\n'.encode("latin-1"), 1, "expected UTF-8 text, found byte"),
    ("binary", b"\x89PNG\r\n\x1a\n\x00\x00", 1, "expected UTF-8 text, found byte 0x89"),
]


@pytest.mark.parametrize(("name", "data", "line", "message"), BAD_QUESTION_FILES)
def test_a_bad_question_file_fails_the_run_with_file_line(
    name: str, data: bytes, line: int, message: str, tmp_path: Path
) -> None:
    questions = copy_questions(tmp_path)
    file = questions / "single_book.jsonl"
    file.write_bytes(data)
    with pytest.raises(DatasetError) as info:
        run(make_cfg(tmp_path, "dataset=single_book", questions=questions))
    assert str(info.value).startswith(f"{file}:{line}: {message}")


def test_a_latin1_line_after_good_ones_names_its_line(tmp_path: Path) -> None:
    questions = copy_questions(tmp_path)
    file = questions / "single_book.jsonl"
    good = file.read_bytes()
    file.write_bytes(good + '{"id": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(DatasetError, match=rf"^{file}:4: expected UTF-8 text, found byte 0xe9"):
        run(make_cfg(tmp_path, "dataset=single_book", questions=questions))


def test_a_question_file_that_is_a_folder_is_a_file_error(tmp_path: Path) -> None:
    questions = copy_questions(tmp_path)
    file = questions / "single_book.jsonl"
    file.unlink()
    file.mkdir()
    with pytest.raises(DatasetError, match=rf"^{file}:1: cannot read the file"):
        run(make_cfg(tmp_path, "dataset=single_book", questions=questions))


def test_a_bad_question_file_is_a_one_line_error_in_the_cli(tmp_path: Path) -> None:
    questions = copy_questions(tmp_path)
    file = questions / "cross_book.jsonl"
    file.write_bytes('{"id": "caf\u00e9"}\n'.encode("latin-1"))
    done = run_cli(*overrides(tmp_path, questions), "dataset=cross_book")
    assert_one_line_error(done, f"{file}:1: expected UTF-8 text")


# 4. A run in which every question fails ----------------------------------------------------------

EVERY_QUESTION_FAILS = [
    "dataset=single_book",
    "++llm._target_=tests.fakes.flaky_steps",
    "++llm.hang_on=no-question-says-this",
    "++llm.garble_on=''",  # every question's analysis is unparseable
]


def test_a_run_where_every_question_failed_still_shows_coverage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run(make_cfg(tmp_path, *EVERY_QUESTION_FAILS))
    assert result.summary["failed"] == 3 and result.all_failed
    recall = result.aggregates["recall_at_k"]
    assert (recall.mean, recall.coverage) == (None, "0/3")
    assert recall.missing_reasons == {"question failed": 3}
    assert result.aggregates["f1"].coverage == "0/3"
    out, err = capsys.readouterr()
    assert "| questions answered " in out and "| 0 " in out
    assert "| gold-passage recall@k " in out and "| 0/3 " in out
    assert "most common error: 3 of 3: StructuredOutputError: could not parse the LLM reply" in out
    assert "warning: every question failed (3 of 3), so no metric has a value" in err


def test_a_run_where_every_question_failed_exits_1_with_a_warning(tmp_path: Path) -> None:
    done = run_cli(*overrides(tmp_path), *EVERY_QUESTION_FAILS)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "warning: every question failed (3 of 3)" in done.stderr
    assert "| gold-passage recall@k " in done.stdout and "0/3" in done.stdout


def test_a_run_with_some_failures_exits_0_and_names_the_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run(make_cfg(tmp_path, *EVERY_QUESTION_FAILS[:3], "++llm.garble_on=stamina"))
    assert result.summary["failed"] == 1 and not result.all_failed
    out, err = capsys.readouterr()
    assert "most common error: 1 of 1: StructuredOutputError: could not parse" in out
    assert "| 2 " in out and "2/3" in out
    assert "warning" not in err
