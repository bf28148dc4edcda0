"""A Chroma server as the passage store, shared by jobs on many machines.

`http://HOST:PORT[/NAMESPACE]` in place of a store folder: children, parents and the manifest are
collections on the server (`[NAMESPACE.]children-KEY`, `parents-KEY`, `manifest-KEY`), so every job
that reaches the server sees the same index. Jobs that ingest one corpus at once take turns through
a lease kept in the server itself (a file lock does not cross machines): see `ServerLock`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from caprag.config import SCHEMES, ServerAddress
from caprag.errors import ConfigError, VectorStoreError
from caprag.retrieval.books import Book
from caprag.retrieval.embeddings import Embedder
from caprag.retrieval.store import CHILD_CHARS, IngestReport, PassageIndex
from caprag.schemas import Document

log = logging.getLogger(__name__)

LOCK_TTL_S = 60.0
"""A lease not renewed for this long is stale: its holder died or stalled, and it is taken over."""
LOCK_WAIT_S = 4 * 3600.0
"""A job waits at most this long for a live holder to finish ingesting, then fails."""
LOCK_POLL_S = 1.0
"""How often a waiting job looks at the lease again."""
PAGE = 1000
"""Records read or written per request (Chroma servers cap a request's batch)."""
NO_VECTOR = [0.0]
"""The one-number embedding of a catalog record: Chroma needs one, catalogs are only read by id."""
TIMEOUT_VARIABLE = "CAPRAG_CHROMA_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 120.0
"""How long one request to the server may take (CAPRAG_CHROMA_TIMEOUT_S): chromadb's client
waits for ever, and a server that accepts connections but does not answer would hang every job."""


def request_timeout_s() -> float:
    """CAPRAG_CHROMA_TIMEOUT_S, else 120 s; ConfigError naming the variable when it is not a
    positive number of seconds."""
    raw = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not seconds > 0 or seconds == float("inf"):
        raise ConfigError(
            f"{TIMEOUT_VARIABLE}={raw!r}: expected seconds above 0 (default {DEFAULT_TIMEOUT_S:g})"
        )
    return seconds


def within(seconds: float, what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
    """`call(*args, **kwargs)` in a daemon thread, waited for at most `seconds`: its result, its
    exception, or VectorStoreError naming `what` when it has not returned by then (the thread is
    left to end by itself; a daemon thread never holds up the process's exit)."""
    done = threading.Event()
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append((True, call(*args, **kwargs)))
        except BaseException as exc:  # handed to the caller's thread
            outcome.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=target, name=f"chroma {what}", daemon=True).start()
    if not done.wait(seconds):
        raise VectorStoreError(
            f"{what}: no answer within {seconds:g} s ({TIMEOUT_VARIABLE}); the server is up but "
            "not answering (stopped, overloaded or stuck)"
        )
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


class Bounded:
    """A chromadb client or collection whose every method call waits at most `timeout_s`
    (through `within`), so that a server that stops answering ends a job with one error line
    instead of hanging it. Its methods' results are handed back as they are, but for a
    collection, which is bounded too."""

    def __init__(self, target: Any, timeout_s: float, url: str) -> None:
        self._target = target
        self._timeout_s = timeout_s
        self._url = url

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._target, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            what = f"the Chroma server at {self._url} ({name})"
            result = within(self._timeout_s, what, attribute, *args, **kwargs)
            if name in COLLECTION_GETTERS:
                return Bounded(result, self._timeout_s, self._url)
            return result

        return call


COLLECTION_GETTERS = frozenset({"get_collection", "get_or_create_collection", "create_collection"})


def is_server_url(store: str | Path) -> bool:
    """Whether a store names a Chroma server (http:// or https://) rather than a folder."""
    return isinstance(store, str) and store.split("://", 1)[0].lower() in SCHEMES and "://" in store


def store_child(store: str | Path, name: str) -> str:
    """A store beside `store` for one dataset: a subfolder, or a namespace on the same server."""
    if is_server_url(store):
        return f"{str(store).rstrip('/')}/{name}"
    return str(Path(store) / name)


def connect(address: ServerAddress, timeout_s: float | None = None) -> Any:
    """An HttpClient on the server (telemetry off) whose every request waits at most `timeout_s`
    (default CAPRAG_CHROMA_TIMEOUT_S, see `Bounded`); VectorStoreError naming it if unreachable
    or not answering."""
    import chromadb
    from chromadb.config import Settings

    # httpx logs every request at INFO: keep that out of a root logger a library set to INFO
    # (wordllama calls logging.basicConfig on import), or each search prints a line.
    if logging.getLogger("httpx").level == logging.NOTSET:
        logging.getLogger("httpx").setLevel(logging.WARNING)
    seconds = request_timeout_s() if timeout_s is None else timeout_s
    try:
        client = within(
            seconds,
            f"the Chroma server at {address.url} (connect)",
            chromadb.HttpClient,
            host=address.host,
            port=address.port,
            ssl=address.ssl,
            settings=Settings(anonymized_telemetry=False),
        )
    except VectorStoreError:
        raise  # it answers connections but not requests: starting one would not help
    except Exception as exc:  # chromadb raises ValueError or httpx errors; report them as one
        raise VectorStoreError(
            f"cannot reach the Chroma server at {address.url} ({exc}): {address.start_hint()}"
        ) from None
    return Bounded(client, seconds, address.url)


def open_collection(client: Any, name: str, space: str) -> Any:
    """Get or create a collection; jobs that create the same one at once all get it."""
    from chromadb.errors import ChromaError

    try:
        return client.get_or_create_collection(
            name, embedding_function=None, metadata={"hnsw:space": space}
        )
    except ChromaError:  # another job created it between our get and our create
        return client.get_collection(name, embedding_function=None)


# ----- the ingest lease ---------------------------------------------------------------------


class LeaseClock(Protocol):
    """Wall-clock time that jobs on different machines agree on, and a way to wait."""

    def now(self) -> float:
        """Seconds since the epoch."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait this many seconds."""
        ...


class WallClock:
    """The real clock: `time.time` (comparable across machines whose clocks are synchronised)."""

    def now(self) -> float:
        """Seconds since the epoch."""
        return time.time()

    def sleep(self, seconds: float) -> None:
        """Wait this many seconds."""
        time.sleep(seconds)


def default_owner() -> str:
    """Who holds a lease: host, process and a random tag (unique even within one process)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class ServerLock:
    """A lease on one name in a Chroma server: one holder at a time across machines.

    Each taking of the lease creates the collection `[NAMESPACE.]lock.NAME.GENERATION`, whose
    metadata holds the owner, the time the lease expires and whether it was released. Creating a
    collection is atomic in Chroma (a second create of one name fails), so of the jobs that race for
    the next generation exactly one gets it: the one whose owner the collection then shows. The
    holder renews the expiry every `ttl_s / 3` from a thread. Another job waits while the newest
    generation is live, takes the next one when it is released, and takes it over when it expired
    (the holder died or stalled for `ttl_s`). A holder that finds a newer generation has lost the
    lease: `verify()` raises, so a stalled job never writes over its successor's work. Clocks of the
    machines must agree to well within `ttl_s`.
    """

    def __init__(
        self,
        client: Any,
        address: ServerAddress,
        name: str,
        *,
        ttl_s: float = LOCK_TTL_S,
        wait_s: float = LOCK_WAIT_S,
        poll_s: float = LOCK_POLL_S,
        clock: LeaseClock | None = None,
        owner: str | None = None,
        heartbeat: bool = True,
    ) -> None:
        self.client = client
        self.address = address
        self.name = name
        self.ttl_s = ttl_s
        self.wait_s = wait_s
        self.poll_s = poll_s
        self.clock: LeaseClock = clock or WallClock()
        self.owner = owner or default_owner()
        self.heartbeat = heartbeat
        self.prefix = address.collection(f"lock.{name}.")
        self.generation: int | None = None
        """The generation this object holds (None: not held)."""
        self.taken_over: str | None = None
        """The owner of a stale lease this object took over, if it did."""
        self.waits = 0
        """How many times acquire() waited for another holder."""
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _generation_name(self, generation: int) -> str:
        return f"{self.prefix}{generation:08d}"

    def _lease(self, released: bool = False) -> dict[str, Any]:
        return {"owner": self.owner, "expires": self.clock.now() + self.ttl_s, "released": released}

    def _generations(self) -> list[tuple[int, dict[str, Any]]]:
        """Every generation on the server, oldest first, with its metadata."""
        found = []
        offset = 0
        while True:
            page = self.client.list_collections(limit=PAGE, offset=offset)
            for collection in page:
                name = collection.name
                if name.startswith(self.prefix) and name[len(self.prefix) :].isdigit():
                    found.append((int(name[len(self.prefix) :]), dict(collection.metadata or {})))
            if len(page) < PAGE:
                return sorted(found, key=lambda item: item[0])
            offset += PAGE

    def acquire(self) -> None:
        """Take the lease: wait for a live holder, take over a stale one; VectorStoreError when
        a live holder keeps it longer than `wait_s`."""
        from chromadb.errors import ChromaError

        deadline = self.clock.now() + self.wait_s
        while True:
            generations = self._generations()
            target = 1
            if generations:
                newest, lease = generations[-1]
                now = self.clock.now()
                if not lease.get("released") and float(lease.get("expires", 0.0)) > now:
                    if now >= deadline:
                        raise VectorStoreError(
                            f"waited {self.wait_s:.0f}s for the lock {self.name!r} on the Chroma "
                            f"server at {self.address.url}: {lease.get('owner')} still holds it "
                            "and renews it (it is ingesting; wait for it, or stop that job)"
                        )
                    self.waits += 1
                    self.clock.sleep(min(self.poll_s, max(deadline - now, 0.0)))
                    continue
                stale = None if lease.get("released") else str(lease.get("owner"))
                target = newest + 1
            else:
                stale = None
            name = self._generation_name(target)
            # Of jobs racing here one creates it; the others fail and then see whose it is.
            with contextlib.suppress(ChromaError):
                self.client.create_collection(name, metadata=self._lease(), embedding_function=None)
            try:
                holder = self.client.get_collection(name, embedding_function=None).metadata
            except ChromaError:
                continue  # already superseded and cleaned up: look again
            if (holder or {}).get("owner") == self.owner:
                break
        self.generation = target
        self._lost = None
        if stale is not None:
            self.taken_over = stale
            log.warning(
                "took over the lock %r on %s from %s: its lease expired (not renewed for %.0fs)",
                self.name,
                self.address.url,
                stale,
                self.ttl_s,
            )
        for older, _ in generations:
            if older < target:
                self._delete(self._generation_name(older))
        if self.heartbeat:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._beat, name=f"lease-{self.name}", daemon=True
            )
            self._thread.start()

    def _delete(self, name: str) -> None:
        from chromadb.errors import ChromaError

        with contextlib.suppress(ChromaError):  # another job removed it first
            self.client.delete_collection(name)

    def _mine(self) -> Any:
        """The collection of the held generation; VectorStoreError if the lease was lost."""
        from chromadb.errors import ChromaError

        if self.generation is None:
            raise VectorStoreError(f"the lock {self.name!r} is not held")
        newer = [g for g, _ in self._generations() if g > self.generation]
        if newer:
            self._lost = (
                f"lost the lock {self.name!r} on the Chroma server at {self.address.url}: "
                f"its lease was not renewed for {self.ttl_s:.0f}s and another job took it over "
                "(this job stalled or lost the server); rerun it to read that job's index"
            )
            raise VectorStoreError(self._lost)
        try:
            return self.client.get_collection(
                self._generation_name(self.generation), embedding_function=None
            )
        except ChromaError as exc:
            raise VectorStoreError(
                f"the lock {self.name!r} vanished from the server: {exc}"
            ) from None

    def renew(self) -> None:
        """Push the expiry `ttl_s` ahead; VectorStoreError if another job took the lease."""
        self._mine().modify(metadata=self._lease())

    def verify(self) -> None:
        """Raise VectorStoreError if the lease was lost (checked on the server)."""
        if self._lost is not None:
            raise VectorStoreError(self._lost)
        self._mine()

    def release(self) -> None:
        """Give the lease up (marked released, so a waiting job takes it at once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.generation is None:
            return
        try:
            self._mine().modify(metadata=self._lease(released=True))
        except VectorStoreError:
            pass  # lost already: the successor owns the lock
        finally:
            self.generation = None

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.renew()
            except VectorStoreError as exc:
                self._lost = str(exc)
                return
            except Exception as exc:  # a network hiccup: try again at the next beat
                log.warning("could not renew the lock %r: %s", self.name, exc)

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the lease for the block."""
        self.acquire()
        try:
            yield
        finally:
            self.release()


# ----- the index ----------------------------------------------------------------------------


class ServerPassageIndex(PassageIndex):
    """PassageIndex on a Chroma server: children, parents and manifest all in collections.

    Parents are `parents-KEY` records (id: passage id, document: the Document as JSON), the
    manifest is `manifest-KEY` records (id: book id, document: the entry as JSON, metadata: the
    content hash). Ingest holds the `ingest-KEY` ServerLock, and checks it before each manifest
    write, so that jobs ingesting one corpus at once take turns and the later ones skip what the
    first one added.
    """

    def __init__(
        self,
        url: str,
        embedder: Embedder,
        child_chars: int = CHILD_CHARS,
        *,
        lock_ttl_s: float = LOCK_TTL_S,
        lock_wait_s: float = LOCK_WAIT_S,
        clock: LeaseClock | None = None,
    ) -> None:
        self.address = ServerAddress.parse(url)
        self.url = self.address.url
        self.embedder = embedder
        self.child_chars = child_chars
        self.key = f"{embedder.name}-{child_chars}"
        self.lock_ttl_s = lock_ttl_s
        self.lock_wait_s = lock_wait_s
        self.clock = clock
        self.lease: ServerLock | None = None
        """The lease of the ingest in progress (None outside an ingest)."""
        self._client, self._collection = self._open()
        self._manifest_records = open_collection(
            self._client, self.address.collection(f"manifest-{self.key}"), "l2"
        )
        self._parent_records = open_collection(
            self._client, self.address.collection(f"parents-{self.key}"), "l2"
        )
        self._parents: dict[str, Document] | None = None
        self._stored: dict[str, Any] | None = None
        """The manifest as last read or written (writes send only what changed since)."""

    def _open(self) -> tuple[Any, Any]:
        client = connect(self.address)
        name = self.address.collection(f"children-{self.key}")
        try:
            return client, open_collection(client, name, "cosine")
        except Exception as exc:  # chromadb raises many types; report them as one
            raise VectorStoreError(
                f"cannot open collection {name} on the Chroma server at {self.url}: {exc}"
            ) from exc

    @contextmanager
    def _reaching(self) -> Iterator[None]:
        """Turn a lost connection into a VectorStoreError naming the server and what to start."""
        import httpx

        try:
            yield
        except httpx.TransportError as exc:
            raise VectorStoreError(
                f"lost the Chroma server at {self.url} ({exc}): {self.address.start_hint()}"
            ) from None

    def ingest(
        self, books: Sequence[Book], *, prune: bool = False, progress: bool = True
    ) -> IngestReport:
        """Add new or changed books, skip unchanged ones (by content hash), optionally prune;
        one job at a time per index across machines (the `ingest-KEY` lease)."""
        with self._reaching():
            return super().ingest(books, prune=prune, progress=progress)

    def _search(self, query: str, k: int, within: Sequence[str] | None) -> list[Document]:
        with self._reaching():
            return super()._search(query, k, within)

    def _lock(self, name: str) -> Any:
        self.lease = ServerLock(
            self._client,
            self.address,
            name,
            ttl_s=self.lock_ttl_s,
            wait_s=self.lock_wait_s,
            clock=self.clock,
        )
        return self.lease.held()

    # ----- manifest and parents -------------------------------------------------------------

    def _read_all(self, collection: Any) -> Iterator[tuple[str, str]]:
        offset = 0
        while True:
            page = collection.get(include=["documents"], limit=PAGE, offset=offset)
            yield from zip(page["ids"], page["documents"], strict=True)
            if len(page["ids"]) < PAGE:
                return
            offset += PAGE

    def checked_manifest(self, books: Sequence[Book]) -> dict[str, Any]:
        """The manifest as the server holds it: its records are collections, not the files a
        local store checks for damage."""
        return self.manifest()

    def manifest(self) -> dict[str, Any]:
        """Books in the index: id → hash, source path, counts, metadata."""
        read = {book_id: json.loads(doc) for book_id, doc in self._read_all(self._manifest_records)}
        self._stored = copy.deepcopy(read)
        return read

    def parents(self) -> dict[str, Document]:
        """Every indexed passage by id (read once, cached)."""
        if self._parents is None:
            self._parents = {
                pid: Document.model_validate_json(doc)
                for pid, doc in self._read_all(self._parent_records)
            }
        return self._parents

    def _write_manifest(self, manifest: dict[str, Any]) -> None:
        if self.lease is not None:
            self.lease.verify()  # a job that lost the lease must not record books as done
        stored = self.manifest() if self._stored is None else self._stored
        gone = sorted(set(stored) - set(manifest))
        if gone:
            self._manifest_records.delete(ids=gone)
        ids = sorted(i for i in manifest if stored.get(i) != manifest[i])
        if ids:
            self._manifest_records.upsert(
                ids=ids,
                embeddings=[NO_VECTOR] * len(ids),
                documents=[json.dumps(manifest[i], ensure_ascii=False) for i in ids],
                metadatas=[{"hash": str(manifest[i]["hash"])} for i in ids],
            )
        self._stored = copy.deepcopy(manifest)

    def _write_parents(self, book_id: str, rows: list[dict[str, Any]]) -> None:
        self._drop_parents(book_id)
        for start in range(0, len(rows), PAGE):
            batch = rows[start : start + PAGE]
            self._parent_records.upsert(
                ids=[row["passage_id"] for row in batch],
                embeddings=[NO_VECTOR] * len(batch),
                documents=[json.dumps(row, ensure_ascii=False) for row in batch],
                metadatas=[{"book_id": book_id} for _ in batch],
            )

    def _drop_parents(self, book_id: str) -> None:
        self._parent_records.delete(where={"book_id": book_id})
