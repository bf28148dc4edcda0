"""A small bounded load test against the real server process on loopback (the full one: bench)."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.perf.loadtest import run_load
from tests.conftest import FIXTURE_BOOKS

pytestmark = pytest.mark.slow


def test_concurrent_conversations_do_not_cross_talk(tmp_path: Path) -> None:
    env = {
        "CAPRAG_CORPUS": str(FIXTURE_BOOKS),
        "CAPRAG_CHROMA_DIR": str(tmp_path / "store"),
        "CAPRAG_K": "2",
    }
    result = run_load(3, 4, env=env, timeout_s=600)
    assert result.requests == 12
    assert result.errors == [] and result.cross_talk == [] and result.unresolved == []
