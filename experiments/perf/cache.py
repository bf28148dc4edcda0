"""`make bench` section `cache`: an identical rerun against a model, as a share of the first run.

Three runs of one configuration against the OpenAI-protocol stub (its own process, fixed latency
per call), each with a fresh HTTP client, into one temporary store and cache file:

1. first: fresh LLM cache and row cache; every question is answered and every call sent;
2. LLM cache only: the same run again with row reuse switched off in this process (what a rerun
   cost before rows were reused): no call is sent, but every question is answered again;
3. identical rerun: rows reused (`experiment.cache=true`, the default).

`python -m experiments.perf.cache` prints the section's Markdown.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from experiments.perf.harness_bench import (
    CACHE_TARGET,
    QUIET_ENV,
    STUB_LATENCY_S,
    environment,
    openai_overrides,
    stub_run,
)
from experiments.support.servers import openai_stub


def measure(
    questions: int = 48, concurrency: int = 4, latency_s: float = STUB_LATENCY_S
) -> dict[str, dict[str, Any]]:
    """The three runs' calls and times."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        openai_stub("--latency", str(latency_s)) as (base_url, _),
        environment(OPENAI_API_KEY="bench", OPENAI_BASE_URL=base_url, **QUIET_ENV),
    ):
        folder = Path(tmp)
        common = [*openai_overrides(questions), f"experiment.concurrency={concurrency}"]
        # Warm-up without the caches (imports, ingest), so the cache file is fresh for the runs.
        stub_run(folder, base_url, *common, "experiment.cache=false", "experiment.limit=2")
        assert not (folder / "llm-cache.sqlite").exists(), "the warm-up run wrote the cache"
        first = stub_run(folder, base_url, *common, "experiment.cache=true")
        replay = stub_run(folder, base_url, *common, "experiment.cache=true", reuse_rows=False)
        again = stub_run(folder, base_url, *common, "experiment.cache=true")
    return {"first": first, "llm_cache_only": replay, "rerun": again}


def section(
    questions: int = 48, concurrency: int = 4, latency_s: float = STUB_LATENCY_S
) -> dict[str, object]:
    """The section: the three runs as a table, and the rerun's share of the first run."""
    runs = measure(questions, concurrency, latency_s)
    first, again = runs["first"], runs["rerun"]
    share = again["evaluate_s"] / first["evaluate_s"]
    whole = again["wall_s"] / first["wall_s"]
    met = share <= CACHE_TARGET and again["calls"] == 0
    table = [
        "| run | questions | LLM calls (stub) | calls answered from the LLM cache | cases reused "
        "| evaluation | share of first | whole run() | share of first | load (1 min) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    names = {
        "first": "first (fresh caches)",
        "llm_cache_only": "rerun, LLM cache only (rows not reused)",
        "rerun": "identical rerun (rows reused)",
    }
    for key, row in runs.items():
        table.append(
            f"| {names[key]} | {row['questions']:.0f} | {row['calls']:.0f} | "
            f"{row['cached_calls'] if row['reused_cases'] == 0 else 0:.0f} | "
            f"{row['reused_cases']:.0f} | {row['evaluate_s']:.2f} s | "
            f"{row['evaluate_s'] / first['evaluate_s']:.1%} | {row['wall_s']:.2f} s | "
            f"{row['wall_s'] / first['wall_s']:.1%} | {row['load_1min']:.1f} |"
        )
    parts = ", ".join(
        f"{label} {again[key]:.2f} s"
        for label, key in (
            ("setup (dataset, index, strategy)", "setup_s"),
            ("evaluation", "evaluate_s"),
            ("MLflow results", "mlflow_results_s"),
            ("MLflow traces", "mlflow_traces_s"),
        )
        if key in again
    )
    verdict = "pass" if met else "**miss**"
    markdown = (
        f"`llm=openai` against `experiments.support.openai_stub` in its own process with "
        f"{latency_s * 1e3:.0f} ms per call, `strategy=multi-hop`, `retriever=wordllama`, "
        f"{questions} questions of `dataset=curated`, `experiment.concurrency={concurrency}`, "
        "`experiment.cache=true` with a fresh `paths.cache` file. Evaluation = `Evaluator.run` "
        "(every question answered or reused, and scored); whole run() adds setup and MLflow "
        "logging. The middle row switches row reuse off in-process to show what the LLM cache "
        "alone leaves: the harness answers every question again without calling the model.\n\n"
        + "\n".join(table)
        + f"\n\nIdentical rerun: evaluation {share:.1%} of the first (target ≤ "
        f"{CACHE_TARGET:.0%} with 0 calls): {verdict}; whole run() {whole:.1%} of the first "
        f"({parts})."
    )
    return {"markdown": markdown, "runs": runs, "share": share, "whole_share": whole, "met": met}


def main() -> int:
    """Measure and print the section."""
    result = section()
    print(result["markdown"])
    print(json.dumps({k: v for k, v in result.items() if k != "markdown"}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
