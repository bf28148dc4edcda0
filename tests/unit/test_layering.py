"""Rooms import downward only and nothing imports a circle (tests/layering.py), on this checkout
and on planted trees that break each rule."""

from __future__ import annotations

from pathlib import Path

from tests import layering


def test_this_checkout_imports_downward_only_and_has_no_circle() -> None:
    edges = layering.graph()
    assert [str(v) for v in layering.upward(edges)] == []
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
            "caprag/api.py": "import experiments.results.row\n",
            "experiments/results/__init__.py": "",
            "experiments/results/row.py": "from experiments.scoring import metrics\n",
            "experiments/scoring/__init__.py": "",
            "experiments/scoring/metrics.py": "from experiments.results.row import Row\n",
            "experiments/cli/__init__.py": "",
            "experiments/cli/gate.py": "from experiments.perf import bench\n",
            "experiments/perf/__init__.py": "",
            "experiments/perf/bench.py": "",
        },
    )
    found = {(v.module, v.imported) for v in layering.upward(layering.graph(root))}
    assert found == {
        ("caprag.api", "experiments.results.row"),
        ("experiments.results.row", "experiments.scoring.metrics"),
        ("experiments.cli.gate", "experiments.perf.bench"),
    }
