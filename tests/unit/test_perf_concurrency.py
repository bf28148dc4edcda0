"""The concurrency bench's bookkeeping: questions per level and CPU by library."""

from __future__ import annotations

import cProfile
import pstats
import random
from pathlib import Path

import pytest

from experiments.perf import concurrency
from experiments.perf.concurrency import COMPONENTS, cpu_by_component, questions_for
from experiments.results.aggregate import percentile

HARNESS = next(name for name, markers in COMPONENTS if "experiments" in markers)


def test_each_level_asks_enough_questions_to_keep_that_many_in_flight() -> None:
    assert questions_for(1) == questions_for(16) == 48
    assert questions_for(64) == 192


def test_a_builtins_time_is_counted_under_the_library_that_called_it() -> None:
    values = [random.random() for _ in range(5000)]
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(50):
        percentile(values, 0.5)  # experiments/evaluate.py: nearly all its time is in sorted()
    profile.disable()
    found = cpu_by_component(pstats.Stats(profile))
    assert found[HARNESS] > 0.8 * sum(found.values())


def test_project_files_are_counted_by_their_path_in_a_checkout_named_caprag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(concurrency, "PROJECT_ROOT", Path("/ci/caprag"))
    assert concurrency._component("/ci/caprag/experiments/results/aggregate.py") == HARNESS
    assert concurrency._component("/ci/caprag/caprag/steps/analyze.py").startswith("caprag")
