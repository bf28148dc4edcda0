"""The default dense encoder (MiniLM on ONNX Runtime) gives the vectors stored indexes hold.

tests/fixtures/minilm_reference.npz holds 30 texts (empty, short, unicode, markup, two over the
256-token limit, bundled-corpus passages) and the vectors the former numpy forward pass gave
them, one text at a time; that encoder matched sentence-transformers to cosine ≥ 0.9999998.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from caprag.retrieval.embeddings import MiniLMEmbedder, get_embedder, minilm_dir
from caprag.retrieval.onnx_minilm import build_minilm

FIXTURE = Path(__file__).parents[1] / "fixtures" / "minilm_reference.npz"


@pytest.fixture(scope="module")
def reference() -> tuple[list[str], np.ndarray]:
    data = np.load(FIXTURE)
    return [str(t) for t in data["texts"]], data["vectors"]


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    embedder = get_embedder("minilm")
    assert isinstance(embedder, MiniLMEmbedder)
    return embedder


def test_vectors_match_the_reference_for_every_text(minilm, reference) -> None:
    texts, expected = reference
    vectors = minilm.embed(texts)
    assert vectors.shape == (len(texts), 384) and vectors.dtype == np.float32
    cosines = (vectors * expected).sum(axis=1)
    worst = int(cosines.argmin())
    assert cosines.min() >= 0.999, f"{texts[worst][:40]!r}: cosine {cosines[worst]:.6f}"
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_padded_groups_give_the_same_vectors(minilm, reference, monkeypatch) -> None:
    texts, expected = reference
    monkeypatch.setattr(minilm, "batch_size", 8)  # texts of different lengths share a group
    cosines = (minilm.embed(texts) * expected).sum(axis=1)
    assert cosines.min() >= 0.999


def test_a_batch_equals_its_texts_one_by_one(minilm, reference) -> None:
    texts, _ = reference
    together = minilm.embed(texts)
    alone = np.stack([minilm.embed([t])[0] for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-6)
    # Rows come back in input order, whatever order the lengths sort them into.
    np.testing.assert_allclose(minilm.embed(texts[::-1]), together[::-1], atol=1e-6)


def test_query_path_equals_document_path(minilm, reference) -> None:
    texts, expected = reference
    query = minilm.embed_query(texts[4])
    assert isinstance(query, list) and len(query) == 384
    assert all(isinstance(x, float) for x in query)
    np.testing.assert_allclose(query, minilm.embed([texts[4]])[0], atol=1e-6)
    assert float(np.dot(query, expected[4])) >= 0.999


def test_no_texts_give_an_empty_matrix(minilm) -> None:
    assert minilm.embed([]).shape == (0, 384)


def test_name_and_dimension_are_those_of_stored_indexes(minilm) -> None:
    assert (minilm.name, minilm.dimension) == ("minilm", 384)
    assert get_embedder("minilm") is minilm


def test_graph_build_is_valid_and_deterministic() -> None:
    first = build_minilm(minilm_dir())
    onnx.checker.check_model(first)
    assert first.SerializeToString() == build_minilm(minilm_dir()).SerializeToString()
