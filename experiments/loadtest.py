"""A bounded load test of the chat API on loopback: concurrent conversations, cross-talk checks.

`python -m experiments.loadtest --conversations 50 --turns 5` starts the server itself (on
127.0.0.1, a free port), runs the conversations, stops the server, and prints the result.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from caprag.books import load_books
from caprag.config import load_settings
from experiments.servers import free_port, running

FOLLOW_UPS = (
    "What does it cost?",
    "Who can take it?",
    "What are its limits?",
    "Does it work with anything else?",
    "How do I use it in a fight?",
    "What happens if it fails?",
)


@dataclass
class LoadResult:
    """What the load test saw."""

    conversations: int
    turns: int
    requests: int = 0
    errors: list[str] = field(default_factory=list)
    cross_talk: list[str] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    def quantile(self, q: float) -> float:
        """Latency quantile in seconds."""
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0

    def markdown(self) -> str:
        """A result table."""
        header = [
            "conversations × turns",
            "requests",
            "errors",
            "cross-talk",
            "follow-ups not resolved to the topic",
            "p50",
            "p95",
            "max",
            "wall time",
            "requests/s",
        ]
        rate = self.requests / self.wall_s if self.wall_s else 0.0
        cells = [
            f"{self.conversations} × {self.turns}",
            str(self.requests),
            str(len(self.errors)),
            str(len(self.cross_talk)),
            str(len(self.unresolved)),
            f"{self.quantile(0.5):.2f} s",
            f"{self.quantile(0.95):.2f} s",
            f"{max(self.latencies, default=0):.2f} s",
            f"{self.wall_s:.1f} s",
            f"{rate:.1f}",
        ]
        return "\n".join(
            [
                "| " + " | ".join(header) + " |",
                "|" + "---|" * len(header),
                "| " + " | ".join(cells) + " |",
            ]
        )


def topics(corpus: Path, count: int) -> list[str]:
    """Distinct multi-word rule names from the corpus, one per conversation."""
    names = [
        p.section
        for b in load_books(corpus)
        for p in b.passages
        if " " in p.section and ":" not in p.section and len(p.section) < 30
    ]
    unique = list(dict.fromkeys(names))
    if len(unique) < count:
        raise ValueError(f"the corpus has only {len(unique)} usable rule names")
    step = len(unique) // count
    return [unique[i * step] for i in range(count)]


async def converse(
    client: httpx.AsyncClient, topic: str, others: Sequence[str], turns: int, result: LoadResult
) -> None:
    """One conversation: name the topic, then follow-ups that only make sense on this thread."""
    thread: str | None = None
    questions = [f"What does {topic} do?", *FOLLOW_UPS][:turns]
    for number, question in enumerate(questions, start=1):
        body: dict[str, str] = {"question": question}
        if thread:
            body["thread_id"] = thread
        start = time.perf_counter()
        try:
            response = await client.post("/api/ask", json=body)
        except httpx.HTTPError as exc:
            result.errors.append(f"{topic} turn {number}: {type(exc).__name__}: {exc}")
            return
        result.latencies.append(time.perf_counter() - start)
        result.requests += 1
        if response.status_code != 200:
            result.errors.append(f"{topic} turn {number}: HTTP {response.status_code}")
            return
        data = response.json()
        if thread and data["thread_id"] != thread:
            result.cross_talk.append(f"{topic} turn {number}: thread changed")
        thread = data["thread_id"]
        searched = data["main_question"]
        if number > 1 and topic not in searched:
            result.unresolved.append(f"{topic} turn {number}: searched {searched!r}")
        leaked = [o for o in others if o != topic and o in searched]
        if leaked:
            result.cross_talk.append(f"{topic} turn {number}: mentions {leaked}")


async def drive(base_url: str, names: Sequence[str], turns: int, timeout_s: float) -> LoadResult:
    """Run every conversation at once against a running server."""
    result = LoadResult(conversations=len(names), turns=turns)
    limits = httpx.Limits(max_connections=len(names))
    start = time.perf_counter()
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s, limits=limits) as client:
        await asyncio.wait_for(
            asyncio.gather(*(converse(client, n, names, turns, result) for n in names)),
            timeout=timeout_s,
        )
    result.wall_s = time.perf_counter() - start
    return result


@contextlib.contextmanager
def serve(env: dict[str, str] | None = None, ready_timeout_s: float = 300.0) -> Iterator[str]:
    """Start `python -m caprag.api` on a free loopback port; always stop it."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = Path(tempfile.gettempdir()) / f"caprag-api-{port}.log"
    command = [sys.executable, "-m", "caprag.api", "--port", str(port)]
    with running(command, f"{base}/health", {**os.environ, **(env or {})}, log, ready_timeout_s):
        yield base


def run_load(
    conversations: int, turns: int, env: dict[str, str] | None = None, timeout_s: float = 900.0
) -> LoadResult:
    """Start a server, run the conversations, stop the server."""
    corpus = Path((env or {}).get("CAPRAG_CORPUS") or load_settings().corpus)
    names = topics(corpus, conversations)
    with serve(env) as base:
        return asyncio.run(drive(base, names, turns, timeout_s))


def main(argv: list[str] | None = None) -> int:
    """Run the load test and print its table; exit 1 on errors or cross-talk."""
    parser = argparse.ArgumentParser(prog="python -m experiments.loadtest", description=__doc__)
    parser.add_argument("--conversations", type=int, default=50)
    parser.add_argument("--turns", type=int, default=5)
    args = parser.parse_args(argv)
    result = run_load(args.conversations, args.turns)
    print(result.markdown())
    for problem in (result.errors + result.cross_talk + result.unresolved)[:20]:
        print("problem:", problem)
    return 1 if result.errors or result.cross_talk else 0


if __name__ == "__main__":
    sys.exit(main())
