"""The scale benchmark's pool and one measurement, at a size a test can afford."""

from __future__ import annotations

from pathlib import Path

from experiments.perf.scale import BOOK_SIZE, percentile, pool, worker


def test_the_pool_has_the_asked_number_of_distinct_passages_in_books() -> None:
    books = pool(2 * BOOK_SIZE + 700)  # more than the sample's 2,478 paragraphs: copies
    passages = [p for book in books for p in book.passages]
    assert [len(b.passages) for b in books] == [BOOK_SIZE, BOOK_SIZE, 700]
    assert len({p.passage_id for p in passages}) == len(passages)
    assert len({(p.section, p.text) for p in passages}) == len(passages)


def test_percentile_interpolates() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 95) == 5.0
    assert percentile(list(map(float, range(101))), 95) == 95.0


def test_a_bm25_measurement_ingests_queries_and_skips_an_unchanged_pool(tmp_path: Path) -> None:
    result = worker("bm25", 300, tmp_path / "store")
    assert result["passages"] == 300
    assert result["queries"] == 200
    assert result["query_p95_ms"] >= result["query_p50_ms"] > 0
    assert result["peak_rss_mib"] > 0
