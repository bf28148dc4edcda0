"""Retrieval at benchmark scale: ingest and query a pool of N passages (default 100,000) with each
retriever, each in its own process so its peak memory is its own.

The pool repeats the HotpotQA sample's paragraphs (2,478 distinct ones), each copy made distinct by
a copy number in its title and first words, in books of 1,000 passages (the index's unit of
incremental ingest). Queries are the sample's questions. Per retriever: ingest seconds and
passages/s, peak RSS, query p50/p95 (ms, one query at a time), and a re-ingest of the unchanged
pool (which must skip every book).

`python -m experiments.perf.scale --passages 100000 [--retrievers bm25 dense hybrid]` prints JSON;
`make bench` runs it as section `scale`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from caprag.config import PROJECT_ROOT
from caprag.retrieval.books import Book, BookMeta, Passage

SAMPLE = PROJECT_ROOT / "datasets" / "benchmarks" / "hotpotqa_dev_distractor.jsonl"
BOOK_SIZE = 1000
QUERIES = 200
RETRIEVERS = ("bm25", "dense", "hybrid")


def sample() -> tuple[list[tuple[str, str]], list[str]]:
    """The sample's distinct (title, text) paragraphs and its questions."""
    paragraphs: dict[tuple[str, str], None] = {}
    questions: list[str] = []
    for line in SAMPLE.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        questions.append(record["question"])
        for paragraph in [*record["supporting"], *record["distractors"]]:
            paragraphs[(paragraph["title"], paragraph["text"])] = None
    return list(paragraphs), questions


def pool(passages: int) -> list[Book]:
    """`passages` distinct passages in books of BOOK_SIZE, cycling the sample's paragraphs."""
    paragraphs, _ = sample()
    books: list[Book] = []
    for start in range(0, passages, BOOK_SIZE):
        number = start // BOOK_SIZE
        meta = BookMeta(
            book_id=f"scale-{number:04d}",
            short=f"Scale{number}",
            title=f"Scale pool {number}",
            edition=1,
            published=dt.date(1970, 1, 1),
        )
        book = Book(meta=meta, path=SAMPLE, content_hash=f"scale-{passages}-{number}")
        for i in range(start, min(start + BOOK_SIZE, passages)):
            title, text = paragraphs[i % len(paragraphs)]
            copy = i // len(paragraphs)
            book.passages.append(
                Passage(
                    passage_id=f"{meta.book_id}/p{i:06d}",
                    book=meta,
                    chapter="",
                    section=f"{title} ({copy})" if copy else title,
                    page=i - start + 1,
                    text=text if not copy else f"{text} (copy {copy})",
                    line=i - start + 1,
                )
            )
        books.append(book)
    return books


def open_retriever(kind: str, store: Path, books: Sequence[Book]) -> Any:
    """The retriever `kind` over `books` in `store`, ingested (unchanged books skipped)."""
    from experiments.harness.build import build_index

    return build_index(corpus=store, store=store, kind=kind, progress=False, books=books)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def worker(kind: str, passages: int, store: Path) -> dict[str, Any]:
    """Measure one retriever in this process."""
    books = pool(passages)
    _, questions = sample()
    start = time.perf_counter()
    retriever = open_retriever(kind, store, books)
    ingest_s = time.perf_counter() - start
    latencies = []
    for question in questions[:QUERIES]:
        t0 = time.perf_counter()
        retriever.search(question, 10)
        latencies.append((time.perf_counter() - t0) * 1000)
    start = time.perf_counter()
    open_retriever(kind, store, books)
    reingest_s = time.perf_counter() - start
    return {
        "retriever": kind,
        "passages": passages,
        "ingest_s": round(ingest_s, 1),
        "passages_per_s": round(passages / ingest_s, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "query_p50_ms": round(statistics.median(latencies), 2),
        "query_p95_ms": round(percentile(latencies, 95), 2),
        "queries": len(latencies),
        "reingest_unchanged_s": round(reingest_s, 2),
    }


def measure(passages: int, retrievers: Sequence[str] = RETRIEVERS) -> list[dict[str, Any]]:
    """Each retriever in its own process and store folder."""
    results = []
    with tempfile.TemporaryDirectory(prefix="caprag-scale-") as folder:
        for kind in retrievers:
            store = Path(folder) / kind
            command = [sys.executable, "-m", "experiments.perf.scale", "--worker", kind]
            done = subprocess.run(
                [*command, "--passages", str(passages), "--store", str(store)],
                capture_output=True,
                text=True,
                check=False,
                cwd=PROJECT_ROOT,
            )
            if done.returncode != 0:
                raise RuntimeError(f"scale worker {kind} failed:\n{done.stderr[-3000:]}")
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


def section(passages: int = 100_000) -> dict[str, object]:
    """The `make bench` section: every retriever at `passages`, as a Markdown table."""
    before = os.getloadavg()[0]
    results = measure(passages)
    after = os.getloadavg()[0]
    rows = [
        "| retriever | passages | ingest | passages/s | peak RSS | query p50 | query p95 "
        "| re-ingest unchanged |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows += [
        f"| {r['retriever']} | {r['passages']:,} | {r['ingest_s']} s | {r['passages_per_s']} "
        f"| {r['peak_rss_mib']} MiB | {r['query_p50_ms']} ms | {r['query_p95_ms']} ms "
        f"| {r['reingest_unchanged_s']} s |"
        for r in results
    ]
    note = (
        f"A pool of {passages:,} distinct passages (the HotpotQA sample's 2,478 paragraphs "
        "repeated as numbered copies, books of 1,000), each retriever in its own process and "
        f"fresh store; {QUERIES} sample questions asked one at a time at k=10 after ingest; "
        "re-ingest = opening the same pool again (every book skipped). Targets: peak RSS "
        "≤ 3 GiB, query p95 ≤ 50 ms for bm25 and dense. Load average (1 min) "
        f"{before:.2f} before, {after:.2f} after, on {os.cpu_count()} cores."
    )
    return {"markdown": note + "\n\n" + "\n".join(rows), "results": results}


def main(argv: list[str] | None = None) -> int:
    """Measure, print JSON (one line per retriever)."""
    parser = argparse.ArgumentParser(prog="python -m experiments.perf.scale", description=__doc__)
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--retrievers", nargs="+", choices=RETRIEVERS, default=list(RETRIEVERS))
    parser.add_argument("--worker", choices=RETRIEVERS, help=argparse.SUPPRESS)
    parser.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.passages < 1:
        parser.error("--passages must be at least 1")
    if args.worker:
        print(json.dumps(worker(args.worker, args.passages, args.store)))
        return 0
    for result in measure(args.passages, args.retrievers):
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
