"""`python -m caprag ask "question" [--thread ID]`: answer from the shell.

Each `ask` is its own process, so its conversations live on disk: in CLI_STORE unless
CAPRAG_CHECKPOINTER says otherwise, and `--thread ID` continues one across calls.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

from caprag.config import Settings, load_settings
from caprag.errors import CapragError
from caprag.services import AskResult, Pipeline, build_pipeline, validate_question

CLI_STORE = Path(".caprag") / "cli-chat.db"
"""Where `ask` keeps conversations when CAPRAG_CHECKPOINTER is not set (relative to the
working directory, like the vector store)."""

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


def cli_settings(command: str) -> Settings:
    """The settings, with `ask`'s conversations on disk unless CAPRAG_CHECKPOINTER is set."""
    settings = load_settings()
    if command == "ask" and "checkpointer" not in settings.model_fields_set:
        CLI_STORE.parent.mkdir(parents=True, exist_ok=True)
        settings = settings.model_copy(update={"checkpointer": f"sqlite:{CLI_STORE}"})
    return settings


async def run(pipeline: Pipeline, questions: Sequence[str], thread: str | None, demo: bool) -> None:
    """Answer the questions in one event loop, and always close the conversation store in it
    (an open SQLite connection would keep the process from exiting)."""
    try:
        await pipeline.open()
        for question in questions:
            if demo:
                print(f"\n### {question}")
                print(render(await pipeline.ask(question)))
                continue
            current = thread or str(uuid.uuid4())
            new = not await pipeline.history(current)
            print(render(await pipeline.ask(question, current)))
            if new:
                print(f"(new conversation: continue it with --thread {current})")
    finally:
        await pipeline.aclose()


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m caprag`: bad input or settings are one `error:` line, exit 2."""
    parser = argparse.ArgumentParser(prog="python -m caprag")
    commands = parser.add_subparsers(dest="command", required=True)
    ask = commands.add_parser("ask", help="answer one question")
    ask.add_argument("question")
    ask.add_argument("--thread", default=None, help="conversation thread id to continue")
    commands.add_parser("demo", help="ingest the corpus and answer a few sample questions")
    args = parser.parse_args(argv)
    demo = args.command == "demo"
    try:
        questions = DEMO_QUESTIONS if demo else (validate_question(args.question),)
        if not demo and args.thread is not None and not args.thread.strip():
            raise CapragError("--thread needs a thread id (omit it to start a new conversation)")
        settings = cli_settings(args.command)
        try:
            pipeline = build_pipeline(settings)
        except OSError as exc:  # a corpus or store path that cannot be used
            raise CapragError(str(exc)) from exc
        asyncio.run(run(pipeline, questions, None if demo else args.thread, demo))
    except CapragError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
