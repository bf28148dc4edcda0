"""BM25 over the parent passages (bm25s + PyStemmer), persisted beside the vector store.

The index is rebuilt whenever the set of books (their content hashes) changes and loaded as saved
otherwise: bm25s has no incremental add, and rebuilding takes seconds even for 100k passages.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from caprag.errors import VectorStoreError
from caprag.retrieval.books import Book
from caprag.retrieval.store import (
    PAGE_BOOST,
    IndexDamageError,
    IngestReport,
    ParentCatalog,
    RestrictedIndex,
    folder_lock,
    manifest_entry,
    passage_to_document,
    read_json_file,
    report_damage,
    split_citation,
    write_json,
)
from caprag.schemas import Document

CURRENT = "current.json"
"""Names the folder of the index in use and the corpus signature it was built from."""


def corpus_signature(manifest: dict[str, Any]) -> str:
    """sha256 (16 hex) over the indexed books and their content hashes."""
    pairs = sorted((book_id, entry["hash"]) for book_id, entry in manifest.items())
    return hashlib.sha256(json.dumps(pairs).encode()).hexdigest()[:16]


def _tokenizer(language: str) -> Any:
    import bm25s
    import Stemmer

    return bm25s.tokenization.Tokenizer(stemmer=Stemmer.Stemmer(language), stopwords="en")


@dataclass
class _Loaded:
    """A built or loaded BM25 index and what each of its rows is."""

    retriever: Any
    tokenizer: Any
    passage_ids: list[str]
    books: np.ndarray
    pages: np.ndarray
    lock: threading.Lock

    def rows_of(self, passage_ids: Iterable[str]) -> np.ndarray:
        """A mask of the rows holding the given passages."""
        mask = np.zeros(len(self.passage_ids), dtype=bool)
        mask[[self.position[pid] for pid in passage_ids if pid in self.position]] = True
        return mask

    @property
    def position(self) -> dict[str, int]:
        """Row of each passage id."""
        if not hasattr(self, "_position"):
            self._position = {pid: row for row, pid in enumerate(self.passage_ids)}
        return self._position

    def query_ids(self, text: str) -> list[int]:
        """Token ids of the query in the index's own vocabulary (unknown terms dropped)."""
        with self.lock:  # the tokenizer caches stems in dicts it shares between threads
            ids: list[list[int]] = self.tokenizer.tokenize(
                [text], update_vocab=False, return_as="ids", show_progress=False, allow_empty=False
            )
        return ids[0]


def _check_consistent(folder: Path, retriever: Any, tokenizer: Any, passages: int) -> None:
    """The saved files of one index describe the same passages and vocabulary."""
    scores = retriever.scores
    data, indices, indptr = scores["data"], scores["indices"], scores["indptr"]
    if int(scores["num_docs"]) != passages:
        raise IndexDamageError(
            folder / "params.index.json",
            f"{scores['num_docs']} documents for {passages} listed passages",
        )
    if len(indptr) != len(retriever.vocab_dict) + 1 or len(data) != len(indices):
        raise IndexDamageError(
            folder / "indptr.csc.index.npy", "the score arrays and vocabulary disagree"
        )
    if len(indices) and int(np.max(indices)) >= passages:
        raise IndexDamageError(folder / "indices.csc.index.npy", "a document number out of range")
    if len(tokenizer.get_vocab_dict()) != len(retriever.vocab_dict):
        raise IndexDamageError(
            folder / "vocab.tokenizer.json", "the tokenizer's vocabulary is not the index's"
        )


class BM25Index(ParentCatalog):
    """Okapi BM25 over whole sections, with the same search interface as PassageIndex."""

    def __init__(self, store: Path | str, language: str = "english") -> None:
        self.store = Path(store)
        self.language = language
        self.key = f"bm25-{language}"
        """Tokenisation: each language is its own folder, manifest and index."""
        self.path = self.store / "bm25" / language
        if self.store.exists() and not self.store.is_dir():
            raise VectorStoreError(f"vector store path {self.store} is a file, not a folder")
        try:
            (self.path / "parents").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise VectorStoreError(
                f"cannot use store folder {self.path}: {exc.strerror or exc}"
                " (set CAPRAG_CHROMA_DIR to a writable folder)"
            ) from None
        self._parents: dict[str, Document] | None = None
        self._loaded: _Loaded | None = None
        self.tokenised = 0
        """Passages this object tokenised to build an index (0 while it only loaded saved ones)."""
        self.build_seconds = 0.0
        """Time this object spent building (tokenising + indexing + saving)."""

    # ----- manifest and parents -------------------------------------------------------------

    @property
    def _manifest_path(self) -> Path:
        return self.path / "manifest.json"

    def _parents_file(self, book_id: str) -> Path:
        return self.path / "parents" / f"{book_id}.json"

    # ----- ingest ---------------------------------------------------------------------------

    def ingest(
        self, books: Sequence[Book], *, prune: bool = False, progress: bool = True
    ) -> IngestReport:
        """Store new or changed books' passages (by content hash), then rebuild BM25 if the
        corpus changed; `progress` is accepted for PassageIndex's signature (BM25 is quick)."""
        start = time.perf_counter()
        report = IngestReport()
        with folder_lock(self.path, "ingest"):
            manifest = self.checked_manifest(books)
            todo = [
                b for b in books if manifest.get(b.meta.book_id, {}).get("hash") != b.content_hash
            ]
            report.skipped = [b.meta.book_id for b in books if b not in todo]
            if prune:
                wanted = {b.meta.book_id for b in books}
                for book_id in sorted(set(manifest) - wanted):
                    self._parents_file(book_id).unlink(missing_ok=True)
                    del manifest[book_id]
                    report.removed.append(book_id)
            for book in todo:
                rows = [passage_to_document(p).model_dump() for p in book.passages]
                write_json(self._parents_file(book.meta.book_id), rows)
                manifest[book.meta.book_id] = manifest_entry(book, 0)
                report.added.append(book.meta.book_id)
                report.passages += len(book.passages)
            write_json(self._manifest_path, manifest)
            self._parents = None
            self._loaded = self._open(manifest)
        report.seconds = time.perf_counter() - start
        return report

    def _current(self) -> dict[str, Any]:
        """Which folder holds the index in use, and for which corpus ({} when none, or when the
        file is damaged: the index is then rebuilt)."""
        file = self.path / CURRENT
        if not file.exists():
            return {}
        try:
            data = read_json_file(file)
            if not isinstance(data, dict) or not all(
                isinstance(data.get(key), str) and data.get(key) for key in ("folder", "signature")
            ):
                raise IndexDamageError(file, "no index folder and corpus signature in it")
        except IndexDamageError as damage:
            report_damage(damage)
            return {}
        return data

    def _open(self, manifest: dict[str, Any]) -> _Loaded | None:
        """The saved index if it fits the manifest and every file of it reads and agrees with
        the others and the corpus; else a fresh build (caller holds the lock)."""
        signature = corpus_signature(manifest)
        current = self._current()
        if current.get("signature") == signature:
            try:
                return self._load(self.path / current["folder"])
            except IndexDamageError as damage:
                report_damage(damage)
        return self._build(signature)

    def _build(self, signature: str) -> _Loaded | None:
        import bm25s

        start = time.perf_counter()
        parents = self.parents()
        ids = sorted(parents)
        folder = self.path / f"index-{signature}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        if ids:
            tokenizer = _tokenizer(self.language)
            corpus = [f"{parents[pid].section}\n{parents[pid].text}" for pid in ids]
            tokens = tokenizer.tokenize(
                corpus, update_vocab=True, return_as="tuple", show_progress=False
            )
            retriever = bm25s.BM25()
            retriever.index(tokens, show_progress=False)
            retriever.save(str(folder))
            tokenizer.save_vocab(str(folder))
            tokenizer.save_stopwords(str(folder))
            self.tokenised += len(ids)
        write_json(folder / "passages.json", ids)
        write_json(self.path / CURRENT, {"signature": signature, "folder": folder.name})
        for old in self.path.glob("index-*"):  # earlier builds (even one a damaged file hid)
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
        self.build_seconds += time.perf_counter() - start
        return self._load(folder)

    def _load(self, folder: Path) -> _Loaded | None:
        """The index saved in `folder`; IndexDamageError naming the first file that cannot be
        read or disagrees (a passage id the corpus lacks, counts that do not match)."""
        import bm25s

        listing = folder / "passages.json"
        ids = read_json_file(listing)
        if not isinstance(ids, list) or not all(isinstance(pid, str) for pid in ids):
            raise IndexDamageError(listing, "not a list of passage ids")
        parents = self.parents()
        lacking = [pid for pid in ids if pid not in parents]
        if lacking:
            raise IndexDamageError(
                listing, f"{len(lacking)} passage id(s) the corpus lacks, first {lacking[0]}"
            )
        if len(set(ids)) != len(parents):
            raise IndexDamageError(
                listing, f"{len(parents) - len(set(ids))} passage(s) of the corpus missing"
            )
        if not ids:
            return None
        for file in sorted(folder.iterdir()):  # each saved file must read, to be named if not
            if file.suffix == ".json":
                read_json_file(file)
            elif file.suffix == ".npy":
                try:
                    np.load(file, mmap_mode="r", allow_pickle=False)
                except (OSError, ValueError) as exc:
                    raise IndexDamageError(file, f"unreadable: {exc}") from None
        try:
            retriever = bm25s.BM25.load(str(folder), mmap=True, show_progress=False)
            tokenizer = _tokenizer(self.language)
            tokenizer.load_vocab(str(folder))
            tokenizer.load_stopwords(str(folder))
        except Exception as exc:  # bm25s raises many kinds on a bad file; all mean damage
            raise IndexDamageError(folder, f"{type(exc).__name__}: {exc}") from None
        _check_consistent(folder, retriever, tokenizer, len(ids))
        return _Loaded(
            retriever,
            tokenizer,
            ids,
            np.array([parents[pid].book_id for pid in ids], dtype=object),
            np.array([parents[pid].page for pid in ids]),
            threading.Lock(),
        )

    def _index(self) -> _Loaded | None:
        """The index for the current manifest, loaded on first use (built if missing or stale)."""
        if self._loaded is None:
            with folder_lock(self.path, "ingest"):
                self._loaded = self._open(self.manifest())
        return self._loaded

    # ----- search ---------------------------------------------------------------------------

    def search(self, query: str, k: int) -> list[Document]:
        """Top-k parent passages; a '(Short, p. N)' citation in the query narrows the search."""
        return self._search(query, k, None)

    def restricted(self, passage_ids: Iterable[str]) -> RestrictedIndex:
        """A retriever over this index that only ever returns the given parent passages."""
        return RestrictedIndex(self, passage_ids)

    def _search(self, query: str, k: int, within: Sequence[str] | None) -> list[Document]:
        """Scores are BM25 divided by the best allowed passage's (so 1.0 is the top match), plus
        PAGE_BOOST on the cited page; only passages sharing a term with the query are returned."""
        text, book_id, page = split_citation(query, self.book_by_short)
        loaded = self._index()
        if loaded is None or k < 1 or (within is not None and not within):
            return []
        token_ids = loaded.query_ids(text or query)
        if not token_ids:
            return []
        scores = np.asarray(loaded.retriever.get_scores_from_ids(token_ids), dtype=float)
        allowed = scores > 0
        if book_id:
            allowed &= loaded.books == book_id
        if within is not None:
            allowed &= loaded.rows_of(within)
        rows = np.flatnonzero(allowed)
        if not rows.size:
            return []
        final = scores[rows] / scores[rows].max()
        if page is not None:
            final = final + PAGE_BOOST * (loaded.pages[rows] == page)
        # Rows are in passage-id order, so ties go to the smaller id (as in the dense index).
        order = np.lexsort((rows, -final))[:k]
        parents = self.parents()
        return [
            parents[loaded.passage_ids[rows[i]]].model_copy(
                update={"score": round(float(final[i]), 6)}
            )
            for i in order
        ]
