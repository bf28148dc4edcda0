"""Parent/child passage index on Chroma: incremental ingest, search children, return parents."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError
from tqdm import tqdm

from caprag.errors import VectorStoreError
from caprag.retrieval.books import Book, Passage
from caprag.retrieval.embeddings import Embedder
from caprag.schemas import Document
from caprag.text import iter_citations

CHILD_CHARS = 420
INGEST_BATCH = 32
"""Passages embedded per call (their children sorted by length across the encoder's threads)."""
SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'])")
PAGE_BOOST = 0.25

log = logging.getLogger(__name__)


class IndexDamageError(Exception):
    """A saved index file that cannot be read or disagrees with the corpus or with the other
    files of its index: the index is rebuilt from the corpus, never used as it is."""

    def __init__(self, file: Path, reason: str) -> None:
        super().__init__(f"{file}: {reason}")
        self.file = file
        self.reason = reason


def report_damage(damage: IndexDamageError) -> None:
    """The one warning line a damaged index file gets (the rebuild follows)."""
    log.warning(
        "index file %s is damaged (%s): rebuilding the index from the corpus",
        damage.file,
        damage.reason,
    )


def read_json_file(file: Path) -> Any:
    """The JSON a saved index file holds; IndexDamageError when it cannot be read."""
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise IndexDamageError(file, "missing") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise IndexDamageError(file, f"unreadable: {type(exc).__name__}: {exc}") from None


def split_children(passage: Passage, child_chars: int = CHILD_CHARS) -> list[str]:
    """Cut a section into child chunks of about child_chars, each prefixed with its heading."""
    pieces: list[str] = []
    for block in re.split(r"\n\s*\n", passage.text):
        block = block.strip()
        if not block:
            continue
        if block.startswith("|"):
            units = block.splitlines()
            joiner = "\n"
        else:
            units = SENTENCE.split(" ".join(block.split()))
            joiner = " "
        current = ""
        for unit in units:
            if current and len(current) + len(unit) > child_chars:
                pieces.append(current)
                current = unit
            else:
                current = f"{current}{joiner}{unit}" if current else unit
        if current:
            pieces.append(current)
    prefix = f"{passage.section} ({passage.book.short}): "
    return [prefix + piece for piece in pieces]


def passage_to_document(passage: Passage, score: float = 0.0) -> Document:
    """Build the Document a search returns for a passage."""
    return Document(
        passage_id=passage.passage_id,
        book_id=passage.book.book_id,
        book_short=passage.book.short,
        book_title=passage.book.title,
        section=passage.section,
        page=passage.page,
        edition=passage.book.edition,
        published=passage.book.published.isoformat(),
        text=passage.text,
        score=score,
    )


@dataclass
class IngestReport:
    """What one ingest did."""

    added: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    passages: int = 0
    children: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        """One line for the terminal."""
        return (
            f"ingested {len(self.added)} book(s) "
            f"({self.passages} passages, {self.children} chunks), "
            f"skipped {len(self.skipped)} unchanged, removed {len(self.removed)} "
            f"in {self.seconds:.2f}s"
        )


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (a reader never sees half a file)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)


@contextlib.contextmanager
def folder_lock(folder: Path, name: str) -> Iterator[None]:
    """One holder at a time per folder and name, across processes (sweep jobs share a store)."""
    with (folder / f".{name}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def manifest_entry(book: Book, children: int) -> dict[str, Any]:
    """What a manifest records of an indexed book: its hash, source, counts and metadata."""
    meta = book.meta
    return {
        "hash": book.content_hash,
        "source": str(book.path),
        "passages": len(book.passages),
        "children": children,
        "meta": {
            "book_id": meta.book_id,
            "short": meta.short,
            "title": meta.title,
            "edition": meta.edition,
            "published": meta.published.isoformat(),
        },
    }


def find_book(books: Mapping[str, Mapping[str, Any]], short: str) -> str | None:
    """Book id for a short name, id or title used in citations ('Combat' → 'combat')."""
    wanted = short.strip().lower()
    for book_id, meta in books.items():
        if wanted in (meta["short"].lower(), book_id.lower(), meta["title"].lower()):
            return book_id
    return None


def split_citation(
    query: str, book_by_short: Callable[[str], str | None]
) -> tuple[str, str | None, int | None]:
    """The query without its first known '(Short, p. N)' citation, that book's id and the page."""
    for short, page, offset in iter_citations(query):
        book_id = book_by_short(short)
        if book_id:
            text = query[:offset].strip(" ,;:-") or query
            return text, book_id, page
    return query, None, None


class ParentCatalog:
    """The manifest of ingested books and their parent passages (whole sections) as JSON files:
    what the dense and the BM25 index share. A subclass says where the files are."""

    _parents: dict[str, Document] | None

    @property
    def _manifest_path(self) -> Path:
        raise NotImplementedError

    def _parents_file(self, book_id: str) -> Path:
        raise NotImplementedError

    def manifest(self) -> dict[str, Any]:
        """Books in the index: id → hash, source path, counts, metadata."""
        if not self._manifest_path.exists():
            return {}
        data: dict[str, Any] = json.loads(self._manifest_path.read_text(encoding="utf-8"))
        return data

    def checked_manifest(self, books: Sequence[Book]) -> dict[str, Any]:
        """The manifest, less every book whose saved files are damaged (so an ingest of `books`
        rebuilds it): an unreadable manifest counts as empty; a book's parents file must read
        and, for a book the corpus holds unchanged, hold exactly the corpus's passage ids (an
        id the corpus lacks is damage). Each damaged file gets one warning line."""
        file = self._manifest_path
        manifest: dict[str, Any] = {}
        if file.exists():
            try:
                manifest = _manifest_shape(file, read_json_file(file))
            except IndexDamageError as damage:
                report_damage(damage)
        corpus = {book.meta.book_id: book for book in books}
        for book_id in list(manifest):
            book = corpus.get(book_id)
            unchanged = book is not None and manifest[book_id]["hash"] == book.content_hash
            expected = {p.passage_id for p in book.passages} if book and unchanged else None
            try:
                self._check_parents(book_id, expected)
            except IndexDamageError as damage:
                report_damage(damage)
                del manifest[book_id]
        self._parents = None
        return manifest

    def _check_parents(self, book_id: str, expected: set[str] | None) -> None:
        file = self._parents_file(book_id)
        rows = read_json_file(file)
        try:
            if not isinstance(rows, list):
                raise TypeError(f"a list of passages expected, found {type(rows).__name__}")
            ids = {Document.model_validate(row).passage_id for row in rows}
        except (TypeError, ValidationError) as exc:
            raise IndexDamageError(file, f"not a list of passages: {exc}") from None
        if expected is not None and ids != expected:
            lacking = sorted(ids - expected)
            if lacking:
                raise IndexDamageError(
                    file, f"{len(lacking)} passage id(s) the corpus lacks, first {lacking[0]}"
                )
            raise IndexDamageError(file, f"{len(expected - ids)} passage(s) of the book missing")

    def parents(self) -> dict[str, Document]:
        """Every indexed passage by id (read once, cached)."""
        if self._parents is None:
            loaded: dict[str, Document] = {}
            for book_id in self.manifest():
                file = self._parents_file(book_id)
                if file.exists():
                    for row in json.loads(file.read_text(encoding="utf-8")):
                        doc = Document.model_validate(row)
                        loaded[doc.passage_id] = doc
            self._parents = loaded
        return self._parents

    def books(self) -> dict[str, dict[str, Any]]:
        """Metadata of each indexed book, keyed by book id."""
        return {book_id: entry["meta"] for book_id, entry in self.manifest().items()}

    def book_by_short(self, short: str) -> str | None:
        """Book id for a short name used in citations ('Combat' → 'combat')."""
        return find_book(self.books(), short)


def _manifest_shape(file: Path, data: Any) -> dict[str, Any]:
    """`data` if it is a manifest (book id -> entry with a hash and metadata), else damage."""
    if not isinstance(data, dict) or not all(
        isinstance(entry, dict)
        and isinstance(entry.get("hash"), str)
        and isinstance(entry.get("meta"), dict)
        for entry in data.values()
    ):
        raise IndexDamageError(file, "not a manifest of books (id -> hash and metadata)")
    return data


class PassageIndex(ParentCatalog):
    """Children (embedded chunks) in a Chroma collection; parents (whole sections) in JSON files."""

    def __init__(
        self, path: Path | str, embedder: Embedder, child_chars: int = CHILD_CHARS
    ) -> None:
        self.path = Path(path)
        self.embedder = embedder
        self.child_chars = child_chars
        self.key = f"{embedder.name}-{child_chars}"
        """Embedding + chunking: each combination is its own collection and manifest."""
        self._client, self._collection = self._open()
        self._parents: dict[str, Document] | None = None

    def _open(self) -> tuple[Any, Any]:
        import chromadb
        from chromadb.config import Settings

        if self.path.exists() and not self.path.is_dir():
            raise VectorStoreError(f"vector store path {self.path} is a file, not a folder")
        try:
            (self.path / "parents" / self.key).mkdir(parents=True, exist_ok=True)
            probe = self.path / f".write-test-{os.getpid()}"  # one per process: openers race
            probe.write_text("ok")
            probe.unlink()
        except OSError as exc:
            raise VectorStoreError(
                f"cannot use vector store folder {self.path}: {exc.strerror or exc}"
                " (set CAPRAG_CHROMA_DIR to a writable folder)"
            ) from None
        try:
            # Creating a store's tables races when parallel jobs open a new store at once.
            with self._lock("open"):
                client = chromadb.PersistentClient(
                    path=str(self.path), settings=Settings(anonymized_telemetry=False)
                )
                collection = client.get_or_create_collection(
                    f"children-{self.key}",
                    embedding_function=None,
                    metadata={"hnsw:space": "cosine"},
                )
        except Exception as exc:  # chromadb raises many types; report them as one
            raise VectorStoreError(f"cannot open Chroma store at {self.path}: {exc}") from exc
        return client, collection

    # ----- manifest and parents -------------------------------------------------------------

    @property
    def _manifest_path(self) -> Path:
        return self.path / f"manifest-{self.key}.json"

    def _parents_file(self, book_id: str) -> Path:
        return self.path / "parents" / self.key / f"{book_id}.json"

    def _write_manifest(self, manifest: dict[str, Any]) -> None:
        write_json(self._manifest_path, manifest)

    def _write_parents(self, book_id: str, rows: list[dict[str, Any]]) -> None:
        write_json(self._parents_file(book_id), rows)

    def _drop_parents(self, book_id: str) -> None:
        self._parents_file(book_id).unlink(missing_ok=True)

    # ----- ingest ---------------------------------------------------------------------------

    def ingest(
        self, books: Sequence[Book], *, prune: bool = False, progress: bool = True
    ) -> IngestReport:
        """Add new or changed books, skip unchanged ones (by content hash), optionally prune."""
        with self._lock(f"ingest-{self.key}"):
            return self._ingest(books, prune=prune, progress=progress)

    def _lock(self, name: str) -> contextlib.AbstractContextManager[None]:
        """One holder at a time per store, across processes (parallel sweep jobs share a store)."""
        return folder_lock(self.path, name)

    def _ingest(self, books: Sequence[Book], *, prune: bool, progress: bool) -> IngestReport:
        start = time.perf_counter()
        report = IngestReport()
        manifest = self.checked_manifest(books)
        todo = [b for b in books if manifest.get(b.meta.book_id, {}).get("hash") != b.content_hash]
        report.skipped = [b.meta.book_id for b in books if b not in todo]
        if prune:
            wanted = {b.meta.book_id for b in books}
            for book_id in sorted(set(manifest) - wanted):
                self._collection.delete(where={"book_id": book_id})
                self._drop_parents(book_id)
                del manifest[book_id]
                report.removed.append(book_id)
            self._write_manifest(manifest)
        total = sum(len(b.passages) for b in todo)
        bar = tqdm(total=total, unit="passage", desc="ingest", disable=not progress or not total)
        for book in todo:
            self._ingest_book(book, manifest, bar, report)
        bar.close()
        self._parents = None
        report.seconds = time.perf_counter() - start
        return report

    def _ingest_book(
        self, book: Book, manifest: dict[str, Any], bar: tqdm[Any], report: IngestReport
    ) -> None:
        book_id = book.meta.book_id
        # 1. Forget the book first: a crash before step 4 leaves it marked as not ingested.
        manifest.pop(book_id, None)
        self._write_manifest(manifest)
        self._collection.delete(where={"book_id": book_id})
        # 2. Embed and add the children, a batch of passages at a time.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="chroma-add") as writer:
            children = self._embed_and_add(book, writer, bar)
        # 3. Store the parents.
        rows = [passage_to_document(p).model_dump() for p in book.passages]
        self._write_parents(book_id, rows)
        # 4. Record the book as done.
        manifest[book_id] = manifest_entry(book, children)
        self._write_manifest(manifest)
        report.added.append(book_id)
        report.passages += len(book.passages)
        report.children += children

    def _embed_and_add(self, book: Book, writer: ThreadPoolExecutor, bar: tqdm[Any]) -> int:
        """Embed the book's children batch by batch; each batch is written to Chroma in the
        writer thread while the next is embedded (the write is serial work the embedder's
        threads would otherwise wait for). Returns the children added, once all are written."""
        children = 0
        writing: Future[None] | None = None
        for start in range(0, len(book.passages), INGEST_BATCH):
            batch = book.passages[start : start + INGEST_BATCH]
            ids: list[str] = []
            texts: list[str] = []
            metas: list[dict[str, str | int | float | bool]] = []
            for passage in batch:
                for number, text in enumerate(split_children(passage, self.child_chars)):
                    ids.append(f"{passage.passage_id}#{number}")
                    texts.append(text)
                    metas.append(
                        {
                            "book_id": book.meta.book_id,
                            "page": passage.page,
                            "parent_id": passage.passage_id,
                        }
                    )
            vectors = self.embedder.embed(texts)
            if writing is not None:
                writing.result()  # one write in flight; its error surfaces here
            writing = writer.submit(
                self._collection.add,
                ids=ids,
                embeddings=vectors.tolist(),
                documents=texts,
                metadatas=metas,
            )
            children += len(ids)
            bar.update(len(batch))
        if writing is not None:
            writing.result()
        return children

    # ----- search ---------------------------------------------------------------------------

    def search(self, query: str, k: int) -> list[Document]:
        """Top-k parent passages; a '(Short, p. N)' citation in the query narrows the search."""
        return self._search(query, k, None)

    def restricted(self, passage_ids: Iterable[str]) -> RestrictedIndex:
        """A retriever over this index that only ever returns the given parent passages."""
        return RestrictedIndex(self, passage_ids)

    def _search(self, query: str, k: int, within: Sequence[str] | None) -> list[Document]:
        text, book_id, page = self._split_citation(query)
        if self._collection.count() == 0 or (within is not None and not within):
            return []
        filters: list[dict[str, Any]] = []
        if book_id:
            filters.append({"book_id": book_id})
        if within is not None:
            filters.append({"parent_id": {"$in": list(within)}})
        where: dict[str, Any] | None = None
        if len(filters) == 1:
            where = filters[0]
        elif filters:
            where = {"$and": filters}
        found = self._collection.query(
            query_embeddings=[self.embedder.embed_query(text or query)],
            n_results=max(k * 4, 20),
            where=where,
            include=["metadatas", "distances"],
        )
        best: dict[str, float] = {}
        for meta, distance in zip(found["metadatas"][0], found["distances"][0], strict=True):
            parent = str(meta["parent_id"])
            score = 1.0 - float(distance)
            if page is not None and meta.get("page") == page:
                score += PAGE_BOOST
            best[parent] = max(best.get(parent, -1.0), score)
        parents = self.parents()
        ranked = sorted(best.items(), key=lambda item: (-item[1], item[0]))[:k]
        return [
            parents[pid].model_copy(update={"score": round(score, 6)})
            for pid, score in ranked
            if pid in parents
        ]

    def _split_citation(self, query: str) -> tuple[str, str | None, int | None]:
        return split_citation(query, self.book_by_short)


class ScopedSearch(Protocol):
    """An index that can search within a set of parent passages (None: all of them)."""

    def _search(self, query: str, k: int, within: Sequence[str] | None) -> list[Document]: ...

    def parents(self) -> dict[str, Document]: ...


class RestrictedIndex:
    """A view of a PassageIndex whose searches only return a fixed set of parent passages.

    The benchmark distractor setting: each question may only search its own paragraphs. The filter
    runs inside Chroma (`parent_id $in ...`), so the top k are the best of those passages, not
    whatever of them survives a global top k.
    """

    def __init__(self, index: ScopedSearch, passage_ids: Iterable[str]) -> None:
        self.index = index
        self.passage_ids = tuple(dict.fromkeys(passage_ids))

    def search(self, query: str, k: int) -> list[Document]:
        """Top-k of the allowed passages; a citation still narrows to its book within them."""
        return self.index._search(query, k, self.passage_ids)

    def parents(self) -> dict[str, Document]:
        """The allowed passages by id."""
        everything = self.index.parents()
        return {pid: everything[pid] for pid in self.passage_ids if pid in everything}
