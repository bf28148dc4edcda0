"""A benchmark indexed in its own store: scoped search stays in scope, pooled search does not."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from caprag.config import PROJECT_ROOT
from caprag.retrieval.store import PAGE_BOOST, PassageIndex, split_children
from experiments.harness.benchmarks import load_benchmark
from experiments.harness.build import build_index
from experiments.harness.data import Dataset

HOTPOTQA = PROJECT_ROOT / "datasets" / "benchmarks" / "hotpotqa_dev_distractor.jsonl"
QUESTIONS = 10
K = 4


@dataclass
class Indexed:
    dataset: Dataset
    index: PassageIndex
    store: Path


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> Indexed:
    """The first 10 HotpotQA questions (about 100 paragraphs), distractor mode, WordLlama."""
    tmp = tmp_path_factory.mktemp("bench")
    sample = tmp / "hotpotqa10.jsonl"
    lines = HOTPOTQA.read_text(encoding="utf-8").splitlines(keepends=True)[:QUESTIONS]
    sample.write_text("".join(lines), encoding="utf-8")
    dataset = load_benchmark("hotpotqa", sample, mode="distractor")
    store = tmp / "store"
    index = build_index(
        tmp / "no-rulebooks-here",  # never read: the benchmark brings its own books
        embedding="wordllama",
        progress=False,
        **dataset.index_overrides(store),
    )
    return Indexed(dataset, index, store)


def test_build_index_uses_the_benchmark_books_and_its_own_store(indexed: Indexed) -> None:
    assert indexed.dataset.books is not None
    book = indexed.dataset.books[0]
    assert indexed.index.path == indexed.store / "bench-hotpotqa"
    assert set(indexed.index.books()) == {"hotpotqa"}
    assert len(indexed.index.parents()) == len(book.passages) >= 9 * QUESTIONS
    assert not list(indexed.store.glob("manifest-*.json"))  # nothing in the rulebook store
    again = indexed.index.ingest(indexed.dataset.books, progress=False)
    assert again.skipped == ["hotpotqa"] and not again.added


def test_restricted_search_never_leaves_the_scope(indexed: Indexed) -> None:
    cases = indexed.dataset.cases
    for case in cases:
        assert case.scope is not None
        view = indexed.index.restricted(case.scope)
        # Its own question, and every other question (whose best passages lie elsewhere).
        for other in cases:
            found = view.search(other.turns[0].question, K)
            assert {d.passage_id for d in found} <= set(case.scope)
            assert len(found) == min(K, len(case.scope))


def test_restricted_search_ranks_the_scope_like_brute_force(indexed: Indexed) -> None:
    passages = {p.passage_id: p for book in indexed.dataset.books or [] for p in book.passages}
    embedder = indexed.index.embedder
    for case in indexed.dataset.cases:
        assert case.scope is not None
        query = case.turns[0].question
        vector = np.array(embedder.embed_query(query))
        best = {
            pid: float(
                (
                    embedder.embed(split_children(passages[pid], indexed.index.child_chars))
                    @ vector
                ).max()
            )
            for pid in case.scope
        }
        expected = sorted(best, key=lambda pid: (-best[pid], pid))[:K]
        found = indexed.index.restricted(case.scope).search(query, K)
        assert [d.passage_id for d in found] == expected


def test_pooled_search_reaches_other_questions_paragraphs(indexed: Indexed) -> None:
    outside = 0
    for case in indexed.dataset.cases:
        assert case.scope is not None
        found = indexed.index.search(case.turns[0].question, 10)
        assert len(found) == 10
        outside += any(d.passage_id not in case.scope for d in found)
    assert outside > 0


def test_restricted_search_with_a_citation_stays_in_scope(indexed: Indexed) -> None:
    case = indexed.dataset.cases[1]
    assert case.scope is not None
    view = indexed.index.restricted(case.scope)
    question = case.turns[0].question
    # "(Hotpotqa, p. 2)" narrows to the book ($and with the scope) and boosts line 2's paragraphs.
    cited = view.search(f"{question} (Hotpotqa, p. 2)", K)
    plain = {d.passage_id: d.score for d in view.search(question, len(case.scope))}
    assert cited and {d.passage_id for d in cited} <= set(case.scope)
    for doc in cited:
        boost = PAGE_BOOST if doc.page == 2 else 0.0
        assert doc.score == pytest.approx(plain[doc.passage_id] + boost, abs=1e-5)
    assert any(doc.page == 2 for doc in cited)
    assert indexed.index.restricted([]).search(question, K) == []
