"""An identical rerun takes finished rows back instead of answering again; any change that can
alter a row (the case, the config, the index, the code) asks again."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from omegaconf import DictConfig

from experiments.harness import reuse
from experiments.harness.data import EvalCase
from experiments.harness.reuse import RowCache, code_fingerprint
from experiments.harness.run import run
from experiments.results.row import QuestionRow
from experiments.support.openai_stub import StubServer
from tests.conftest import FIXTURE_BOOKS
from tests.integration.test_harness import FIXTURE_QUESTIONS, make_cfg


def _cfg(tmp: Path, *overrides: str, questions: Path = FIXTURE_QUESTIONS) -> DictConfig:
    return make_cfg(
        tmp,
        "dataset=curated",
        "experiment.ragas=false",
        "tracking.enabled=false",
        "retriever=wordllama",
        *overrides,
        questions=questions,
    )


def _comparable(rows: list[QuestionRow]) -> list[tuple[str, str, list[str], dict[str, float]]]:
    keep = ("recall_at_k", "f1", "hops", "tokens", "llm_calls", "cost_usd")
    return [
        (r.question_id, r.answer, r.context_ids, {k: r.values[k] for k in keep if k in r.values})
        for r in rows
    ]


def test_identical_rerun_reuses_every_case_and_gives_the_same_rows(tmp_path: Path) -> None:
    first = run(_cfg(tmp_path))
    assert first.summary["reused_cases"] == 0
    again = run(_cfg(tmp_path))
    cases = len({r.case_id for r in first.rows})
    assert again.summary["reused_cases"] == cases
    assert _comparable(again.rows) == _comparable(first.rows)
    # Selecting fewer cases still reuses them; caching off asks every question again.
    some = run(_cfg(tmp_path, "experiment.limit=2"))
    assert some.summary["reused_cases"] == 2
    off = run(_cfg(tmp_path, "experiment.cache=false"))
    assert "reused_cases" not in off.summary
    assert _comparable(off.rows) == _comparable(first.rows)


def test_a_changed_setting_or_question_or_book_asks_again(tmp_path: Path) -> None:
    questions = tmp_path / "questions"
    shutil.copytree(FIXTURE_QUESTIONS, questions)
    books = tmp_path / "books"
    shutil.copytree(FIXTURE_BOOKS, books)
    corpus = f"paths.corpus={books}"
    first = run(_cfg(tmp_path, corpus, questions=questions))
    cases = len({r.case_id for r in first.rows})

    assert (
        run(_cfg(tmp_path, corpus, "retriever.k=3", questions=questions)).summary["reused_cases"]
        == 0
    ), "another k is another row"

    # One question's gold answer changes: that case alone is asked again.
    file = next(p for p in sorted(questions.glob("*.jsonl")) if p.read_text().strip())
    lines = file.read_text().splitlines()
    lines[0] = lines[0].replace('"answer": "', '"answer": "changed ', 1)
    assert '"answer": "changed ' in lines[0]
    file.write_text("\n".join(lines) + "\n")
    assert run(_cfg(tmp_path, corpus, questions=questions)).summary["reused_cases"] == cases - 1

    # A book's text changes: the index changes, so nothing is reused.
    book = sorted(books.glob("*.md"))[0]
    book.write_text(book.read_text() + "\n\nA new closing paragraph about lanterns.\n")
    assert run(_cfg(tmp_path, corpus, questions=questions)).summary["reused_cases"] == 0


def test_code_fingerprint_follows_every_source_file(tmp_path: Path) -> None:
    package = tmp_path / "caprag"
    (package / "steps").mkdir(parents=True)
    (package / "steps" / "analyze.py").write_text("PROMPT = 'a'\n")
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "x.pyc").write_bytes(b"1")
    before = code_fingerprint(tmp_path, ["caprag"])
    (package / "__pycache__" / "x.pyc").write_bytes(b"2")
    assert code_fingerprint(tmp_path, ["caprag"]) == before, "bytecode is not code"
    (package / "steps" / "analyze.py").write_text("PROMPT = 'b'\n")
    assert code_fingerprint(tmp_path, ["caprag"]) != before


def test_a_code_change_asks_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run(_cfg(tmp_path, "experiment.limit=2"))
    monkeypatch.setattr(reuse, "code_fingerprint", lambda: "edited")
    assert run(_cfg(tmp_path, "experiment.limit=2")).summary["reused_cases"] == 0


def test_only_cases_whose_turns_all_succeeded_are_stored(tmp_path: Path) -> None:
    from experiments.results.questions import GoldQuestion

    turn = GoldQuestion(
        id="q1",
        question="What?",
        answer="a",
        gold_passages=[],
        hops=0,
        books=[],
        query_type="factual",
    )
    case = EvalCase(id="c1", set="s", turns=(turn,))
    cache = RowCache(tmp_path / "cache.sqlite", "fp")
    row = QuestionRow(
        case_id="c1", question_id="q1", set="s", query_type="factual", turn=1, question="What?",
        gold_answer="a", values={"llm_calls": 2.0},
    )  # fmt: skip
    failed = row.model_copy(update={"status": "failed", "error": "x"})
    assert not cache.put(0, case, [failed])
    assert cache.get(0, case) is None
    assert cache.put(0, case, [row])
    assert cache.get(1, case) is None, "another repeat is another row"
    (got,) = cache.get(0, case) or []
    assert got.values["llm_calls_cached"] == 2.0 and got.values["cost_usd_spent"] == 0.0
    assert RowCache(tmp_path / "cache.sqlite", "other").get(0, case) is None


def test_rerun_against_a_model_sends_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with StubServer() as stub:
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        monkeypatch.setenv("OPENAI_BASE_URL", stub.base_url)
        first = run(_cfg(tmp_path, "llm=openai", "experiment.limit=3"))
        assert stub.requests > 0
        stub.reset()
        again = run(_cfg(tmp_path, "llm=openai", "experiment.limit=3"))
        assert stub.requests == 0 and again.summary["reused_cases"] == 3
        assert again.mean("cost_usd_spent") == 0.0
        assert again.mean("tokens") == first.mean("tokens")
        assert all(call.cached for r in again.rows for call in r.calls or [])


def test_reused_rows_are_traced_in_the_new_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = ("tracking.enabled=true", "experiment.limit=3")
    first = run(_cfg(tmp_path, *overrides))
    again = run(_cfg(tmp_path, *overrides))
    assert again.summary["reused_cases"] == 3 and again.run_id != first.run_id
    assert again.traces == len(again.rows)
    assert "not written by the trace writer" not in capsys.readouterr().err
