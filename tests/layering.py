"""The project's rooms and the direction imports may go between them, checked from the source.

Every `import` and `from ... import` statement counts, those inside functions too: a lazy import
that closes a circle is still a circle. Rooms and their floors (a room imports only its own room
and lower floors; two rooms on one floor do not import each other):

    5  the command shims at experiments/*.py (`python -m experiments.run`, ...)
    4  experiments.cli, experiments.dashboard, experiments.perf
    3  experiments.harness
    2  experiments.scoring
    1  experiments.results, experiments.support (the stub, servers and fakes the tests and the
       benchmarks share)
    0  caprag (the library: never imports experiments)

Inside the library, the rooms of `caprag/` (DESIGN.md, docs/development.md) keep these rules
(`ROOM_RULES`): the core (settings, registries, errors, schemas, clock, secrets, text,
calibrations, the strategies' option models) imports nothing else of the library (the settings
check names through the registries' catalogue of built-in names); the retrieval room
(`caprag.retrieval`) imports neither the strategies, the steps, the LLM client, the pipeline nor
serving (`caprag.serve`); the strategies, the steps and the LLM client never import serving.

`python -m tests.layering` prints the violations of this checkout (exit 1 when there are any).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOORS: dict[str, int] = {
    "caprag": 0,
    "experiments.results": 1,
    "experiments.support": 1,
    "experiments.scoring": 2,
    "experiments.harness": 3,
    "experiments.cli": 4,
    "experiments.dashboard": 4,
    "experiments.perf": 4,
    "experiments.<shim>": 5,
}
CORE = (
    "caprag.config",
    "caprag.registry",
    "caprag.errors",
    "caprag.schemas",
    "caprag.clock",
    "caprag.secrets",
    "caprag.text",
    "caprag.calibration",
    "caprag.options",
)
"""The library's core: every other room may import it; it imports none of them."""
ABOVE_CORE = (
    "caprag.retrieval",
    "caprag.llm",
    "caprag.steps",
    "caprag.strategies",
    "caprag.trace",
    "caprag.state",
    "caprag.graph",
    "caprag.serve",
)
ROOM_RULES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    *((core, ABOVE_CORE, "the core imports nothing above it") for core in CORE),
    (
        "caprag.retrieval",
        (
            "caprag.strategies",
            "caprag.steps",
            "caprag.llm",
            "caprag.graph",
            "caprag.state",
            "caprag.trace",
            "caprag.serve",
        ),
        "the retrieval room knows nothing of strategies, steps, the pipeline or serving",
    ),
    ("caprag.strategies", ("caprag.serve",), "strategies never import serving"),
    ("caprag.steps", ("caprag.serve", "caprag.strategies"), "steps never import serving"),
    ("caprag.llm", ("caprag.serve", "caprag.strategies", "caprag.steps"), "the client is lower"),
)
"""(room, what it may not import, why) inside the library."""
PACKAGE_FACE = "experiments"
"""experiments/__init__.py: the package's face, below every room (it sets up what Hydra resolves and
composes with, and imports CAPRAG_PLUGINS)."""


@dataclass(frozen=True)
class Violation:
    """One import against the rules: where it is and why it is not allowed."""

    module: str
    line: int
    imported: str
    why: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: imports {self.imported}: {self.why}"


def module_name(path: Path, root: Path) -> str:
    """`experiments/harness/run.py` -> `experiments.harness.run` (a package: its folder's name)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path, packages: tuple[str, ...] = ("caprag", "experiments")) -> dict[str, Path]:
    """Every module of the packages under root, by dotted name."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            found[module_name(path, root)] = path
    return found


def imports_of(name: str, path: Path, known: Mapping[str, Path]) -> Iterator[tuple[int, str]]:
    """(line, module) for every project module the file imports (a name imported from a package
    counts as its submodule when one has that name)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    yield node.lineno, sub
                elif base in known:
                    yield node.lineno, base


def room(name: str) -> str:
    """The room a module is in (its floor is FLOORS[room])."""
    if name == PACKAGE_FACE:
        return PACKAGE_FACE
    if name == "caprag" or name.startswith("caprag."):
        return "caprag"
    parts = name.split(".")
    if len(parts) == 2:  # experiments/<x>.py or a room's own package face
        return name if name in FLOORS else "experiments.<shim>"
    return ".".join(parts[:2])


def floor(name: str) -> int:
    """A module's floor; the package face is below every room."""
    where = room(name)
    return -1 if where == PACKAGE_FACE else FLOORS.get(where, 99)


def graph(root: Path = ROOT) -> dict[str, list[tuple[int, str]]]:
    """Module -> (line, imported project module) for every module of the checkout."""
    known = modules(root)
    return {
        name: [(line, target) for line, target in imports_of(name, path, known) if target != name]
        for name, path in known.items()
    }


def upward(edges: Mapping[str, list[tuple[int, str]]]) -> list[Violation]:
    """Imports that go up a floor, or sideways into another room on the same floor."""
    found = []
    for module, targets in edges.items():
        mine, here = room(module), floor(module)
        for line, target in targets:
            theirs, there = room(target), floor(target)
            if mine == theirs:
                continue
            if module == PACKAGE_FACE and theirs == "caprag":
                continue
            if there > here:
                why = f"{mine} (floor {here}) may not import {theirs} (floor {there})"
                found.append(Violation(module, line, target, why))
            elif there == here:
                why = f"{mine} and {theirs} share floor {here}: neither imports the other"
                found.append(Violation(module, line, target, why))
    return found


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def against_rooms(edges: Mapping[str, list[tuple[int, str]]]) -> list[Violation]:
    """Imports inside the library that break one of `ROOM_RULES`."""
    found = []
    for module, targets in edges.items():
        for owner, forbidden, why in ROOM_RULES:
            if not _within(module, owner):
                continue
            for line, target in targets:
                if any(_within(target, no) for no in forbidden):
                    found.append(Violation(module, line, target, why))
    return found


def circles(edges: Mapping[str, list[tuple[int, str]]]) -> list[list[str]]:
    """Every circle of imports between modules (each as its modules in order), by Tarjan's
    strongly connected components: a component of two or more modules holds a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for _line, target in edges.get(node, []):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for node in sorted(edges):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return found


def main() -> int:
    """Print every upward import and circle of this checkout."""
    edges = graph()
    problems = [str(v) for v in [*upward(edges), *against_rooms(edges)]]
    problems += ["circle: " + " -> ".join(c) for c in circles(edges)]
    clean = f"layering: {len(edges)} modules, no upward import, none against a room, no circle"
    print("\n".join(problems) or clean)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
