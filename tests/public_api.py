"""Libraries through their public API only, checked from the source.

A violation is any of:
- a name of another library's internals (MLflow's SQL store and tables, its tracing client's
  upload, LangChain's request building and runnable internals, the openai SDK's low-level
  `client.post`, LangGraph's InMemorySaver tables, a saver's connection, langchain-openai's client
  cache) used as a name, an attribute or an imported module;
- `from x import _name` where x is a project module other than the importing one (an
  underscored name is its module's own business);
- in the benches (experiments/perf), an assignment to, or `setattr` of, an attribute of an imported
  module or class: a bench injects what it needs instead of patching the project's classes.

`python -m tests.public_api` prints the violations of this checkout (exit 1 when there are any).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("caprag", "experiments", "dashboard")
"""The project's source folders (those that exist are checked)."""
PROJECT = ("caprag", "experiments", "dashboard", "tests")
"""Top-level packages whose underscored names are private to their module."""
FORBIDDEN_NAMES = {
    "SqlAlchemyStore": "MLflow's SQL store class",
    "ManagedSessionMaker": "MLflow's SQL sessions",
    "SqlAssessments": "MLflow's assessments table",
    "sql_trace_rollups": "MLflow's trace rollup tables",
    "_upload_trace_data": "MLflow's tracing client internals",
    "steps__": "LangChain's runnable internals",
    "_get_request_payload": "ChatOpenAI's request building",
    "_create_chat_result": "ChatOpenAI's reply building",
    "_cached_async_httpx_client": "langchain-openai's client cache",
    "_client_utils": "langchain-openai's client internals",
}
"""Names that may not appear as a name, an attribute or in an imported module's path."""
FORBIDDEN_ATTRIBUTES = {
    ("engine", "dispose"): "MLflow's SQL engine",
    ("client", "post"): "the openai SDK's low-level request",  # an httpx client: another name
    (None, "storage"): "InMemorySaver's tables",
    (None, "blobs"): "InMemorySaver's tables",
    (None, "conn"): "a checkpoint saver's connection",
}
"""(owner, attribute): `owner.attribute` (None: any owner) may not appear."""
SAVER_TABLES = {"writes"}
"""InMemorySaver's third table: flagged only beside its siblings' names, `.writes` being common."""
BENCHES = "experiments/perf/"


def _name_of(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _module_of(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolved(module: str, node: ast.ImportFrom) -> str:
    """The absolute module of a `from ... import`."""
    if not node.level:
        return node.module or ""
    base = module.split(".")[: -node.level] if node.level else []
    return ".".join([*base, *([node.module] if node.module else [])])


def violations_in(path: Path, root: Path = ROOT) -> Iterator[str]:
    """Every violation in one source file, as 'path:line: what'."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))
    module = _module_of(path, root)
    where = path.relative_to(root).as_posix()
    bench = where.startswith(BENCHES)
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                imported.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                imported.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import | ast.ImportFrom):
            paths = [a.name for a in node.names]
            if isinstance(node, ast.ImportFrom):
                source_module = _resolved(module, node)
                paths = [source_module, *(f"{source_module}.{a.name}" for a in node.names)]
                private = [a.name for a in node.names if a.name.startswith("_")]
                if private and source_module.split(".")[0] in PROJECT and source_module != module:
                    yield f"{where}:{line}: imports {', '.join(private)} from {source_module}"
            for dotted in paths:
                for part in dotted.split("."):
                    if part in FORBIDDEN_NAMES:
                        yield f"{where}:{line}: imports {dotted} ({FORBIDDEN_NAMES[part]})"
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            yield f"{where}:{line}: uses {node.id} ({FORBIDDEN_NAMES[node.id]})"
        elif isinstance(node, ast.Attribute):
            if node.attr in FORBIDDEN_NAMES:
                yield f"{where}:{line}: uses .{node.attr} ({FORBIDDEN_NAMES[node.attr]})"
            owner = _name_of(node.value)
            for (wanted, attribute), what in FORBIDDEN_ATTRIBUTES.items():
                if node.attr == attribute and (wanted is None or owner == wanted):
                    yield f"{where}:{line}: uses {owner or '…'}.{attribute} ({what})"
            if node.attr in SAVER_TABLES and owner in {"saver", "checkpointer", "memory"}:
                yield f"{where}:{line}: uses {owner}.{node.attr} (InMemorySaver's tables)"
        elif isinstance(node, ast.Constant) and node.value in FORBIDDEN_NAMES:
            yield f"{where}:{line}: names {node.value!r} ({FORBIDDEN_NAMES[node.value]})"
        if bench:
            yield from _patches(node, where, imported)


def _patches(node: ast.AST, where: str, imported: set[str]) -> Iterator[str]:
    """A bench's assignment to, or setattr of, an attribute of an imported module or class."""
    line = getattr(node, "lineno", 0)
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    for target in targets:
        if isinstance(target, ast.Attribute):
            root = target.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in imported:
                yield f"{where}:{line}: patches {root.id}…{target.attr} (inject it instead)"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
        yield f"{where}:{line}: setattr in a bench (inject what it needs instead)"
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "setattr"
    ):
        yield f"{where}:{line}: monkeypatching in a bench (inject what it needs instead)"


def sources(root: Path = ROOT, folders: Iterable[str] = CHECKED) -> Iterator[Path]:
    """The project's Python files."""
    for folder in folders:
        base = root / folder
        if base.is_dir():
            yield from sorted(base.rglob("*.py"))


def violations(root: Path = ROOT, folders: Iterable[str] = CHECKED) -> list[str]:
    """Every violation under the project's source folders."""
    return [found for path in sources(root, folders) for found in violations_in(path, root)]


def main() -> int:
    found = violations()
    for line in found:
        print(line)
    print(f"public api: {len(found)} violation(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
