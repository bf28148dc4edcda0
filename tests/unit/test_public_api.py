"""Libraries through their public API only: the checker (tests/public_api.py) over this checkout,
and over planted files that break each rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.public_api import FORBIDDEN_NAMES, violations, violations_in


def test_the_project_uses_no_library_internals_and_no_other_module_s_private_names() -> None:
    assert violations() == []


def plant(root: Path, where: str, source: str) -> list[str]:
    path = root / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return list(violations_in(path, root))


def test_a_planted_request_payload_call_is_caught(tmp_path: Path) -> None:
    found = plant(
        tmp_path,
        "caprag/llm/sneaky.py",
        "def send(chat, messages):\n    return chat._get_request_payload(messages)\n",
    )
    assert found == [
        "caprag/llm/sneaky.py:2: uses ._get_request_payload (ChatOpenAI's request building)"
    ]
    assert violations(tmp_path) == found  # and the whole-tree scan finds it too


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore\n",
            "imports mlflow.store.tracking.sqlalchemy_store.SqlAlchemyStore",
        ),
        ("def f(client):\n    client._upload_trace_data(1, 2)\n", "uses ._upload_trace_data"),
        ("def f(store):\n    store.engine.dispose(close=False)\n", "uses engine.dispose"),
        ("async def f(client):\n    await client.post('/chat/completions')\n", "client.post"),
        ("def f(saver):\n    return saver.storage, saver.blobs\n", "uses saver.storage"),
        ("def f(saver):\n    return saver.writes\n", "uses saver.writes"),
        ("def f(saver):\n    return saver.conn\n", "uses saver.conn"),
        ("def f(r):\n    return r.first.steps__['raw']\n", "uses .steps__"),
        (
            "from langchain_openai.chat_models import _client_utils\n",
            "imports langchain_openai.chat_models._client_utils",
        ),
        ("from experiments.harness.journal import _without\n", "imports _without from"),
        ("from caprag.retrieval.embeddings import _minilm_dir\n", "imports _minilm_dir from"),
    ],
)
def test_each_forbidden_use_is_caught(tmp_path: Path, source: str, expected: str) -> None:
    found = plant(tmp_path, "experiments/results/planted.py", source)
    assert any(expected in line for line in found), found


def test_a_module_may_use_its_own_private_names(tmp_path: Path) -> None:
    assert plant(tmp_path, "caprag/own.py", "from caprag.own import _helper\n") == []
    assert plant(tmp_path, "caprag/pkg/a.py", "from . import b\nfrom .b import public\n") == []


def test_a_bench_that_patches_the_project_is_caught_and_one_that_injects_is_not(
    tmp_path: Path,
) -> None:
    patched = plant(
        tmp_path,
        "experiments/perf/patched.py",
        "from experiments.harness import run as run_module\n"
        "from experiments.harness.evaluate import Evaluator\n\n"
        "def bench():\n"
        "    run_module.row_cache = lambda *a: None\n"
        "    setattr(Evaluator, '_score', None)\n",
    )
    assert [line.split(": ", 1)[1] for line in patched] == [
        "patches run_module…row_cache (inject it instead)",
        "setattr in a bench (inject what it needs instead)",
    ]
    injected = plant(
        tmp_path,
        "experiments/perf/injected.py",
        "from experiments.harness.run import run\n\n"
        "class Watch:\n"
        "    def __init__(self):\n"
        "        self.seconds = {}\n\n"
        "def bench(cfg):\n"
        "    return run(cfg, hooks=Watch())\n",
    )
    assert injected == []


def test_every_forbidden_name_says_what_it_belongs_to() -> None:
    assert all(FORBIDDEN_NAMES.values())
