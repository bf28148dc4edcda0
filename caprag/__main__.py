"""`python -m caprag ask "question" [--thread ID]`: answer from the shell."""

from __future__ import annotations

import argparse
import asyncio
import sys

from caprag.errors import CapragError
from caprag.services import AskResult, ask_question, default_pipeline

DEMO_QUESTIONS = (
    "What does Arcane Aptitude cost at level 3?",
    "How many actions does a character get in one combat round?",
    "With Trained by a Veteran, what penalty do I take on each blow of the maneuver it improves?",
)


def render(result: AskResult) -> str:
    """The answer, its sources and what the turn cost, for a terminal."""
    answer = result.answer if not result.answer_error else f"(no answer: {result.answer_error})"
    lines = [answer, ""]
    if result.main_question != result.question:
        lines.insert(0, f"(searched as: {result.main_question})")
    lines.append("Sources:")
    lines += [
        f"  - {s.book_title or s.book_id}, p. {s.page} — {s.section} [{s.passage_id}]"
        for s in result.sources
    ] or ["  (none)"]
    lines.append(
        f"Strategy {result.strategy}: {result.hop_count} hop(s), "
        f"{result.prompt_tokens + result.completion_tokens} tokens "
        f"({result.prompt_tokens} prompt + {result.completion_tokens} completion), "
        f"${result.cost_usd:.6f}, {result.latency_s:.2f}s, thread {result.thread_id}"
    )
    for hop in result.hops:
        decision = ""
        if hop.decision is not None:
            decision = (
                " → sufficient"
                if hop.decision.sufficient
                else (" → next: " + "; ".join(hop.decision.new_queries))
            )
        lines.append(
            f"  hop {hop.hop}: {len(hop.queries)} query(ies), {hop.new_documents} new, "
            f"{hop.duplicate_documents} duplicate{decision}"
        )
    for usage in result.usage:
        if usage.error or usage.notes:
            said = "; ".join([*([usage.error] if usage.error else []), *usage.notes])
            lines.append(f"  {usage.step} ({usage.model}): {said}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m caprag`."""
    parser = argparse.ArgumentParser(prog="python -m caprag")
    commands = parser.add_subparsers(dest="command", required=True)
    ask = commands.add_parser("ask", help="answer one question")
    ask.add_argument("question")
    ask.add_argument("--thread", default=None, help="conversation thread id")
    commands.add_parser("demo", help="ingest the corpus and answer a few sample questions")
    args = parser.parse_args(argv)
    questions = DEMO_QUESTIONS if args.command == "demo" else (args.question,)
    try:
        pipeline = default_pipeline() if args.command == "demo" else None
        for question in questions:
            if pipeline is not None:
                print(f"\n### {question}")
                result = asyncio.run(pipeline.ask(question))
            else:
                result = asyncio.run(ask_question(question, args.thread))
            print(render(result))
    except CapragError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
