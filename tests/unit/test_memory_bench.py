"""The memory section's pieces: the long question set it writes and how it follows a run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.harness.data import EvalCase, load_dataset
from experiments.harness.journal import Journal
from experiments.perf.memory import JournalProgress, copy_question_sets, section
from experiments.results.questions import SETS
from experiments.results.row import QuestionRow


def test_copied_sets_load_as_one_dataset_of_distinct_questions(tmp_path: Path) -> None:
    once = load_dataset("all", SETS)
    written = copy_question_sets(tmp_path, 3)
    copied = load_dataset("all", SETS, root=tmp_path)
    assert written == copied.questions == 3 * once.questions
    ids = [turn.id for case in copied.cases for turn in case.turns]
    assert len(set(ids)) == len(ids)
    assert len({case.id for case in copied.cases}) == len(copied.cases)


def test_progress_counts_the_questions_of_finished_cases_only(tmp_path: Path) -> None:
    cases = load_dataset("all", ["follow_up"]).cases[:2]
    progress = JournalProgress(tmp_path / "journals")
    assert progress.poll() == 0
    journal = Journal(tmp_path / "journals", "run").open()

    def rows(case: EvalCase) -> list[QuestionRow]:
        return [
            QuestionRow(
                case_id=case.id,
                question_id=t.id,
                set=case.set,
                query_type=t.query_type,
                turn=n,
                question=t.question,
                gold_answer=t.answer,
            )
            for n, t in enumerate(case.turns, start=1)
        ]

    journal.append("0:a", rows(cases[0]))
    assert progress.poll() == len(cases[0].turns)
    with journal.path.open("a") as handle:  # a line still being written
        handle.write(json.dumps({"case": "0:b", "rows": []})[:10])
    assert progress.poll() == len(cases[0].turns)
    journal.close()


@pytest.mark.slow
def test_section_reports_rss_as_the_run_goes() -> None:
    result = section(questions=400)
    assert result["questions"] == 2 * 348
    points = result["points"]
    assert [p["questions"] for p in points] == [500, 696]  # type: ignore[index]
    assert float(result["peak_mib"]) >= float(result["rss_at_questions_mib"]) > 0  # type: ignore[arg-type]
    assert "MiB per 1,000 questions" in str(result["markdown"])
