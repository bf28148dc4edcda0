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

from caprag.clock import Clock, MonotonicClock
from caprag.config import load_settings
from caprag.errors import CapragError
from caprag.retrieval.books import load_books
from experiments.support.servers import free_port, running

FOLLOW_UPS = (
    "What does it cost?",
    "Who can take it?",
    "What are its limits?",
    "Does it work with anything else?",
    "How do I use it in a fight?",
    "What happens if it fails?",
)
MAX_TURNS = 1 + len(FOLLOW_UPS)


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
    answered: dict[str, int] = field(default_factory=dict)
    """Turns answered per conversation (by topic)."""
    timed_out_s: float | None = None
    """The time limit, when it ran out before every conversation had ended."""
    unfinished: int = 0
    """Requests of the conversations still running when time ran out (in flight or unsent)."""

    @property
    def planned(self) -> int:
        """Requests the test meant to make: every turn of every conversation."""
        return self.conversations * self.turns

    def timeout_line(self) -> str:
        """What a timed-out test finished, in one line ('' when it did not time out)."""
        if self.timed_out_s is None:
            return ""
        return (
            f"timed out after {self.timed_out_s:g} s: {self.requests} of {self.planned} requests "
            f"finished, {self.unfinished} did not finish"
        )

    def quantile(self, q: float) -> float:
        """Latency quantile in seconds."""
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0

    def markdown(self) -> str:
        """A result table."""
        header = [
            "conversations × turns",
            "requests",
            "did not finish",
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
            str(self.unfinished),
            str(len(self.errors)),
            str(len(self.cross_talk)),
            str(len(self.unresolved)),
            f"{self.quantile(0.5):.2f} s",
            f"{self.quantile(0.95):.2f} s",
            f"{max(self.latencies, default=0):.2f} s",
            f"{self.wall_s:.1f} s",
            f"{rate:.1f}",
        ]
        lines = [
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
            "| " + " | ".join(cells) + " |",
        ]
        if self.timed_out_s is not None:
            lines += ["", self.timeout_line()[:1].upper() + self.timeout_line()[1:] + "."]
        return "\n".join(lines)


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
    http: httpx.AsyncClient, topic: str, others: Sequence[str], turns: int, result: LoadResult
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
            response = await http.post("/api/ask", json=body)
        except httpx.HTTPError as exc:
            result.errors.append(f"{topic} turn {number}: {type(exc).__name__}: {exc}")
            return
        result.latencies.append(time.perf_counter() - start)
        result.requests += 1
        result.answered[topic] = number
        if response.status_code != 200:
            result.errors.append(f"{topic} turn {number}: HTTP {response.status_code}")
            return
        try:
            data = response.json()
            answered_thread, searched = str(data["thread_id"]), str(data["main_question"])
        except (ValueError, KeyError, TypeError) as exc:
            result.errors.append(f"{topic} turn {number}: unexpected reply ({exc!r})")
            return
        if thread and answered_thread != thread:
            result.cross_talk.append(f"{topic} turn {number}: thread changed")
        thread = answered_thread
        if number > 1 and topic not in searched:
            result.unresolved.append(f"{topic} turn {number}: searched {searched!r}")
        leaked = [o for o in others if o != topic and o in searched]
        if leaked:
            result.cross_talk.append(f"{topic} turn {number}: mentions {leaked}")


async def drive(
    base_url: str,
    names: Sequence[str],
    turns: int,
    timeout_s: float,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    clock: Clock | None = None,
) -> LoadResult:
    """Run every conversation at once against a running server (or `transport`).

    When `timeout_s` runs out the conversations still running are stopped: the result keeps what
    finished and says how many requests did not (`timed_out_s`, `unfinished`).
    """
    result = LoadResult(conversations=len(names), turns=turns)
    limits = httpx.Limits(max_connections=len(names))
    clock = clock or MonotonicClock()
    start = time.perf_counter()
    # No time limit per request: the one limit is the whole test's, so a request cut by it is
    # counted as not finished, never as an error.
    async with httpx.AsyncClient(
        base_url=base_url, timeout=None, limits=limits, transport=transport
    ) as http:
        tasks = {n: asyncio.create_task(converse(http, n, names, turns, result)) for n in names}
        try:
            await clock.bounded(asyncio.gather(*tasks.values()), timeout_s)
        except TimeoutError:
            for task in tasks.values():
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            result.timed_out_s = timeout_s
            result.unfinished = sum(
                turns - result.answered.get(name, 0)
                for name, task in tasks.items()
                if task.cancelled()
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
    """Run the load test and print its table; exit 1 on errors, cross-talk or a timeout (the
    table then shows what finished), 2 when it cannot start."""
    parser = argparse.ArgumentParser(prog="python -m experiments.loadtest", description=__doc__)
    parser.add_argument("--conversations", type=int, default=50)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="seconds for the whole test (default 900)"
    )
    args = parser.parse_args(argv)
    if args.conversations < 1:
        parser.error(f"--conversations {args.conversations}: expected at least 1")
    if not 1 <= args.turns <= MAX_TURNS:
        parser.error(f"--turns {args.turns}: expected 1 to {MAX_TURNS}")
    if not args.timeout > 0:
        parser.error(f"--timeout {args.timeout:g}: expected a number of seconds above 0")
    try:
        result = run_load(args.conversations, args.turns, timeout_s=args.timeout)
    except (CapragError, ValueError, OSError, RuntimeError, TimeoutError) as exc:
        lines = [line for line in str(exc).splitlines() if line.strip()]
        print(f"error: {lines[-1] if lines else type(exc).__name__}", file=sys.stderr)
        return 2
    print(result.markdown())
    for problem in (result.errors + result.cross_talk + result.unresolved)[:20]:
        print("problem:", problem)
    if result.timed_out_s is not None:
        print(f"error: {result.timeout_line()}", file=sys.stderr)
    return 1 if result.errors or result.cross_talk or result.timed_out_s is not None else 0


if __name__ == "__main__":
    sys.exit(main())
