"""The retriever registry: each kind of retriever (dense, bm25, hybrid, yours) registered once,
with how to open it and what it supports.

Everything that offers or opens a retriever reads it here: CAPRAG_RETRIEVER's validation, the
API's and the harness's index (`make_index`), Hydra's `retriever=NAME` group, run names and the
dashboard's Ask page. A retriever of your own is one module with one call:

    register_retriever(RetrieverKind("toy", open_toy, short="keywords", description="..."))

where `open_toy(options: IndexOptions) -> Index` returns anything with `search`, `ingest`,
`restricted` and `parents` (see `Index`); import that module with CAPRAG_PLUGINS.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from caprag.errors import ConfigError
from caprag.registry import Registry
from caprag.retrieval.base import Retriever
from caprag.retrieval.books import Book
from caprag.retrieval.chroma_server import ServerPassageIndex, is_server_url
from caprag.retrieval.embeddings import Embedder, get_embedder
from caprag.retrieval.hybrid import RRF_K, HybridIndex
from caprag.retrieval.lexical import BM25Index
from caprag.retrieval.store import CHILD_CHARS, IngestReport, PassageIndex
from caprag.schemas import Document


class Index(Retriever, Protocol):
    """What a retriever kind opens: a search, brought up to date by `ingest`, narrowed to a
    case's passages by `restricted`, and listing its passages (`parents`: the harness checks gold
    ids against them and shows their sections)."""

    def ingest(
        self, books: Sequence[Book], *, prune: bool = False, progress: bool = True
    ) -> IngestReport:
        """Add new or changed books (unchanged ones skipped); `prune` drops books not given."""
        ...

    def restricted(self, passage_ids: Iterable[str]) -> Retriever:
        """A retriever that only ever returns the given passages."""
        ...

    def parents(self) -> dict[str, Document]:
        """Every indexed passage by id."""
        ...


@dataclass(frozen=True)
class IndexOptions:
    """Where and how to open an index: the API's settings or the harness's `retriever.index`."""

    store: Path | str
    """A folder, or a Chroma server http://HOST:PORT[/NAMESPACE] (CAPRAG_CHROMA_DIR / _URL)."""
    embedding: str = "minilm"
    """The embedding model (CAPRAG_EMBEDDING), for kinds that embed."""
    child_chars: int = CHILD_CHARS
    """Size of the embedded chunks (the harness's `chunk_chars`)."""
    rrf_k: int = RRF_K
    """Reciprocal-rank fusion constant, for kinds that fuse rankings."""


@dataclass(frozen=True)
class RetrieverKind:
    """One kind of retriever: its name, how to open it, what it supports."""

    name: str
    open: Callable[[IndexOptions], Index]
    short: str
    """A word or two shown beside the name ('dense (embeddings)')."""
    description: str
    """What it searches, for help texts ('embedded chunks')."""
    embeds: bool = False
    """It uses the embedding model (run names then say which: dense-minilm)."""
    folder_only: str | None = None
    """What it keeps in a store folder, where a Chroma server store cannot hold it ('its BM25
    index'); None: it opens on a server store as well."""

    def label(self, embedding: str) -> str:
        """How runs name the retriever: bm25, or dense-<embedding> for a kind that embeds."""
        return f"{self.name}-{embedding}" if self.embeds else self.name


RETRIEVERS: Registry[RetrieverKind] = Registry("retriever")
"""Every retriever kind by its name (CAPRAG_RETRIEVER, the harness's `retriever.index.kind`)."""


def register_retriever(kind: RetrieverKind) -> RetrieverKind:
    """Register a retriever kind under its name (what CAPRAG_RETRIEVER and `retriever=` take)."""
    return RETRIEVERS.register(kind.name, kind)


def dense_index(
    store: Path | str, embedder: Embedder, child_chars: int = CHILD_CHARS
) -> PassageIndex:
    """The dense index in a store folder (embedded Chroma) or on a Chroma server (http://...)."""
    if is_server_url(store):
        return ServerPassageIndex(str(store), embedder, child_chars=child_chars)
    return PassageIndex(store, embedder, child_chars=child_chars)


def _dense(options: IndexOptions) -> PassageIndex:
    return dense_index(options.store, get_embedder(options.embedding), options.child_chars)


def _bm25(options: IndexOptions) -> BM25Index:
    return BM25Index(options.store)


def _hybrid(options: IndexOptions) -> HybridIndex:
    return HybridIndex(_dense(options), _bm25(options), rrf_k=options.rrf_k)


register_retriever(RetrieverKind("dense", _dense, "embeddings", "embedded chunks", embeds=True))
register_retriever(
    RetrieverKind("bm25", _bm25, "lexical", "word matches (stemmed)", folder_only="its BM25 index")
)
register_retriever(
    RetrieverKind(
        "hybrid",
        _hybrid,
        "RRF",
        "both, fused by reciprocal rank",
        embeds=True,
        folder_only="its BM25 index",
    )
)


def make_index(
    kind: str,
    store: Path | str,
    embedding: str = "minilm",
    *,
    child_chars: int = CHILD_CHARS,
    rrf_k: int = RRF_K,
) -> Index:
    """The retriever of `kind` over a store: the API and the harness both open their index here.
    A store `http://HOST:PORT[/NAMESPACE]` is a Chroma server, which only kinds without
    `folder_only` accept."""
    chosen = RETRIEVERS.choose(kind)
    if chosen.folder_only is not None and is_server_url(store):
        served = " or ".join(name for name, k in RETRIEVERS.items() if k.folder_only is None)
        raise ConfigError(
            f"retriever kind={kind} keeps {chosen.folder_only} in a store folder, not on the "
            f"Chroma server {store}: use a folder store, or the {served} retriever with the server"
        )
    return chosen.open(IndexOptions(store, embedding, child_chars, rrf_k))
