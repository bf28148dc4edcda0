"""`python -m experiments.perf.e2e_provider` (`make e2e-provider`): a provider, end to end.

The project's OpenAI-protocol stub plays a hosted provider: replies drawn from a latency profile
(p50 80 ms, p95 250 ms, 50 ms to the first byte: a hosted model's ~1 s / 3 s scaled down so the
run takes minutes), a 429 with `Retry-After` every 9th request, a burst of two 500s every 13th,
and `usage` in every reply.

1. The API (`/api/ask`, every registered strategy, a three-turn conversation each) against it:
   every turn answers with a generated answer within its served limits (retrieval + generation
   allowance); its tokens are the stub's reported `usage` and its cost is priced from them.
2. A harness run per strategy (`llm=openai judge=openai`, a few questions) against it: every
   question of the offline run of the same config exactly once, every call's tokens from `usage`.
3. Over both: every request refused with 429 was retried (the same body again), no sooner than
   its `Retry-After`.

Exit 1 (each problem on one line) when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from caprag.config import load_settings
from caprag.llm.usage import price
from caprag.serve.api import create_app
from caprag.serve.services import build_pipeline, served_limits
from caprag.strategies import STRATEGIES
from experiments.support.openai_stub import Faults, LatencyProfile, StubServer

PROFILE = LatencyProfile(p50_s=0.08, p95_s=0.25, first_byte_s=0.05, seed=0)
FAULTS = Faults(rate_limit_every=9, retry_after_s=0.3, burst_every=13, burst_length=2)
MODEL = "gpt-4o-mini"
KEY_VARIABLE = "CAPRAG_E2E_PROVIDER_KEY"
"""The stub ignores the key; its own variable keeps a real OPENAI_API_KEY away from it."""
CONVERSATION = (
    "How long does a torch burn?",
    "And what does it cost?",
    "Can I light it in the rain?",
)
HARNESS_QUESTIONS = 3


def served_env(stub: StubServer, strategy: str, folder: Path) -> dict[str, str]:
    """The API's settings: the openai backend pointed at the stub, BM25 (no embedding)."""
    return {
        "CAPRAG_LLM": "openai",
        "CAPRAG_MODEL": MODEL,
        "OPENAI_API_KEY": "stub",
        "OPENAI_BASE_URL": stub.base_url,
        "RETRIEVAL_STRATEGY": strategy,
        "CAPRAG_RETRIEVER": "bm25",
        "CAPRAG_CHROMA_DIR": str(folder / "store"),
        "CAPRAG_DECISION_LOG": "off",
    }


async def served(stub: StubServer, strategy: str, folder: Path) -> list[str]:
    """Ask the three-turn conversation through /api/ask; what went wrong (empty: nothing)."""
    os.environ.update(served_env(stub, strategy, folder))
    settings = load_settings()
    pipeline = build_pipeline(settings)
    retrieval_s, generation_s = served_limits(pipeline.strategy, settings)
    limit_s = (retrieval_s or 0.0) + (generation_s or 0.0)
    problems: list[str] = []
    transport = httpx.ASGITransport(app=create_app(pipeline))
    # addressed to a host the API serves (others answer 421)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as api:
        thread = None
        for turn, question in enumerate(CONVERSATION, 1):
            body: dict[str, Any] = {"question": question}
            if thread:
                body["thread_id"] = thread
            start = time.monotonic()
            response = await api.post("/api/ask", json=body, timeout=600)
            took = time.monotonic() - start
            where = f"API {strategy} turn {turn}"
            data = response.json()
            if response.status_code != 200:
                problems.append(f"{where}: HTTP {response.status_code} {data}")
                continue
            thread = data["thread_id"]
            if data["answer_status"] != "generated" or data["timed_out"]:
                problems.append(f"{where}: {data['answer_status']} ({data['stop_reason']})")
            if took > limit_s:
                problems.append(f"{where}: {took:.2f} s > its limit {limit_s:g} s")
            calls = [u for u in data["usage"] if u.get("messages")]
            if not calls:
                problems.append(f"{where}: no LLM call")
            for call in calls:
                if call["counted"] != "reported":
                    problems.append(f"{where} {call['step']}: tokens not from usage")
                expected = price(MODEL, call["prompt_tokens"], call["completion_tokens"])
                if abs(call["cost_usd"] - expected) > 1e-12:
                    problems.append(f"{where} {call['step']}: cost not priced from usage")
    await pipeline.aclose()
    return problems


def harness(stub: StubServer, strategy: str, folder: Path) -> tuple[list[str], int]:
    """One `llm=openai judge=openai` run; what went wrong, and the tokens its rows report."""
    from experiments.harness.run import run
    from experiments.perf.e2e_local import compose_cfg

    common = [
        "dataset=curated",
        f"experiment.limit={HARNESS_QUESTIONS}",
        f"strategy={strategy}",
        "retriever=bm25",
        "tracking.traces=false",
        f"tracking.experiment_name=e2e-provider-{strategy}",
    ]
    expected = sorted(row.question_id for row in run(compose_cfg(folder, *common)).rows)
    result = run(
        compose_cfg(
            folder,
            *common,
            "llm=openai",
            f"llm.client.model={MODEL}",
            f"llm.client.base_url={stub.base_url}",
            f"llm.client.api_key_env={KEY_VARIABLE}",
            "judge=openai",
            f"judge.model={MODEL}",
            f"judge.base_url={stub.base_url}",
            f"judge.api_key_env={KEY_VARIABLE}",
        )
    )
    problems: list[str] = []
    ids = sorted(row.question_id for row in result.rows)
    if ids != expected:
        problems.append(f"harness {strategy}: questions {ids} != {expected} (lost or doubled)")
    tokens = 0
    for row in result.rows:
        if row.status != "ok":
            problems.append(f"harness {strategy} {row.question_id}: {row.error}")
        for call in row.calls or []:
            if call.messages is None:
                continue  # a rule step
            tokens += call.prompt_tokens + call.completion_tokens
            if call.counted != "reported":
                problems.append(f"harness {strategy} {row.question_id} {call.step}: not usage")
    return problems, tokens


def retry_after_problems(stub: StubServer) -> list[str]:
    """Every 429 was retried (the next request with the same body) no sooner than its
    Retry-After, and a 429 on a request's first attempt was retried at all (a 429 on a later
    attempt may end the client's retry budget: after two 500s, say, which the stub also sends)."""
    problems = []
    log = sorted(stub.log, key=lambda entry: entry["arrived"])
    for index, entry in enumerate(log):
        if entry["status"] != 429:
            continue
        retry = next((e for e in log[index + 1 :] if e["body"] == entry["body"]), None)
        if retry is None:
            first = not any(e["body"] == entry["body"] for e in log[:index])
            if first:
                problems.append("a request refused with 429 on its first attempt was never retried")
            continue
        waited = retry["arrived"] - entry["arrived"]
        if waited < float(entry["retry_after"]):
            problems.append(f"a 429 asked {entry['retry_after']} s; retried after {waited:.3f}")
    return problems


def main(argv: list[str] | None = None) -> int:
    """Run the API and harness passes against the provider-like stub; exit 1 on a problem."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.perf.e2e_provider", description=__doc__
    )
    parser.add_argument("--no-harness", action="store_true", help="the API pass only")
    args = parser.parse_args(argv)
    os.environ.setdefault(KEY_VARIABLE, "stub")
    start = time.monotonic()
    problems: list[str] = []
    with (
        tempfile.TemporaryDirectory(prefix="caprag-provider-") as tmp,
        StubServer(profile=PROFILE, faults=FAULTS) as stub,
    ):
        folder = Path(tmp)
        for strategy in list(STRATEGIES):
            found = asyncio.run(served(stub, strategy, folder))
            print(f"API {strategy}: {found or 'ok'}", flush=True)
            problems += found
        served_requests = stub.requests
        if not args.no_harness:
            for strategy in list(STRATEGIES):
                found, _ = harness(stub, strategy, folder)
                print(f"harness {strategy}: {found or 'ok'}", flush=True)
                problems += found
        problems += retry_after_problems(stub)
        statuses = [entry["status"] for entry in stub.log]
        print(
            f"{stub.requests} requests ({served_requests} from the API): "
            f"{statuses.count(200)} answered, {statuses.count(429)} 429, "
            f"{statuses.count(500)} 500; {time.monotonic() - start:.0f} s",
            flush=True,
        )
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
