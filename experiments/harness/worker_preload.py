"""Imported once by the workers' fork server (`experiments.harness.workers`), never by the harness
itself: what a worker imports to build its components, lazily imported modules included (RAGAS
and its metrics alone take ~8 s of CPU, the openai client's resources ~1.7 s), so each worker
forked from the server starts with them loaded. Importing opens nothing: no store, no model."""

from __future__ import annotations

import contextlib

from experiments.scoring.ragas_metrics import OfflineRagas

with contextlib.suppress(ImportError):
    OfflineRagas()  # imports RAGAS and what its metrics import when made (nltk, rouge)

for name in (
    "experiments.harness.build",
    "experiments.scoring.judges",
    "caprag.retrieval.ingest",
    "caprag.retrieval.retrievers",
    "caprag.retrieval.hybrid",
    "caprag.retrieval.lexical",
    "caprag.retrieval.embeddings",
    "caprag.retrieval.onnx_minilm",
    "onnxruntime",
    "tokenizers",
    "wordllama",
    "chromadb",
    "chromadb.api.rust",
    "bm25s",
    "langchain_openai",
    "openai.resources",  # the openai client imports it when first built (~1.7 s of CPU)
    "httpx",
    "httpcore",
    "aiohttp",
):
    with contextlib.suppress(ImportError):
        __import__(name)
