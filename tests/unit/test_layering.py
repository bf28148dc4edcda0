"""Rooms import downward only and nothing imports a circle (tests/layering.py), on this checkout
and on planted trees that break each rule."""

from __future__ import annotations

from pathlib import Path

from tests import layering


def test_this_checkout_imports_downward_only_and_has_no_circle() -> None:
    edges = layering.graph()
    assert [str(v) for v in layering.upward(edges)] == []
    assert [str(v) for v in layering.against_rooms(edges)] == []
    assert layering.circles(edges) == []


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in {"caprag/__init__.py": "", "experiments/__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_planted_circle_is_found(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "experiments/harness/__init__.py": "",
            "experiments/harness/run.py": "from experiments.harness.workers import pool\n",
            "experiments/harness/workers.py": (
                "def pool():\n    from experiments.harness import run\n"
            ),
        },
    )
    found = layering.circles(layering.graph(root))
    assert found == [["experiments.harness.run", "experiments.harness.workers"]]


def test_an_upward_and_a_sideways_import_are_found(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "caprag/serve/api.py": "import experiments.results.row\n",
            "experiments/results/__init__.py": "",
            "experiments/results/row.py": "from experiments.scoring import measures\n",
            "experiments/scoring/__init__.py": "",
            "experiments/scoring/measures.py": "from experiments.results.row import Row\n",
            "experiments/cli/__init__.py": "",
            "experiments/cli/gate.py": "from experiments.perf import bench\n",
            "experiments/perf/__init__.py": "",
            "experiments/perf/bench.py": "",
        },
    )
    found = {(v.module, v.imported) for v in layering.upward(layering.graph(root))}
    assert found == {
        ("caprag.serve.api", "experiments.results.row"),
        ("experiments.results.row", "experiments.scoring.measures"),
        ("experiments.cli.gate", "experiments.perf.bench"),
    }


def test_an_import_against_each_room_rule_is_found(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "caprag/retrieval/__init__.py": "",
            "caprag/retrieval/hybrid.py": "from caprag.strategies import Retriever\n",
            "caprag/retrieval/store.py": "def serve():\n    from caprag.serve import api\n",
            "caprag/strategies/__init__.py": "",
            "caprag/strategies/adaptive.py": "from caprag.serve.progress import report\n",
            "caprag/steps/__init__.py": "",
            "caprag/steps/generate.py": "import caprag.serve.web\n",
            "caprag/llm/__init__.py": "",
            "caprag/llm/client.py": "from caprag.steps import Steps\n",
            "caprag/serve/__init__.py": "",
            "caprag/serve/api.py": "",
            "caprag/serve/web.py": "",
            "caprag/serve/progress.py": "from caprag.strategies import adaptive\n",
            "caprag/config.py": "def check():\n    from caprag.strategies import STRATEGIES\n",
        },
    )
    found = {(v.module, v.imported) for v in layering.against_rooms(layering.graph(root))}
    assert found == {
        ("caprag.retrieval.hybrid", "caprag.strategies"),
        ("caprag.retrieval.store", "caprag.serve.api"),
        ("caprag.strategies.adaptive", "caprag.serve.progress"),
        ("caprag.steps.generate", "caprag.serve.web"),
        ("caprag.llm.client", "caprag.steps"),
        ("caprag.config", "caprag.strategies"),
    }


def test_the_library_top_holds_at_most_twelve_modules() -> None:
    """`caprag/`'s own modules, leaving out its face, `__main__` and shims (≤ 15 lines) that keep
    a documented path (`python -m caprag.api`, `caprag.retrievers` for plug-ins)."""
    top = [
        path.name
        for path in sorted((layering.ROOT / "caprag").glob("*.py"))
        if path.name not in {"__init__.py", "__main__.py"}
        and len(path.read_text(encoding="utf-8").splitlines()) > 15
    ]
    assert len(top) <= 12, top
