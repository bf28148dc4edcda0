"""`python -m caprag ask "question" [--thread ID] [--power auto|1|2|3]`: answer from the shell.

Each `ask` is its own process, so its conversations live on disk: in CLI_STORE unless
CAPRAG_CHECKPOINTER says otherwise, and `--thread ID` continues one across calls. For the adaptive
strategy it prints each round's depth, chunks, confidence, threshold and decision; every turn's
decision record goes to the decision log (CAPRAG_DECISION_LOG) like a served one.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

from caprag.config import PowerChoice, Settings, load_settings, parse_power, power_label
from caprag.errors import CapragError
from caprag.serve.decision_log import PowerSource
from caprag.serve.services import AskResult, Pipeline, build_pipeline, validate_question

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
        f"{result.cost_text}, {result.latency_s:.2f}s, thread {result.thread_id}"
    )
    record = result.decision_log
    if record is not None and record.ladder is not None:
        ladder = " / ".join(str(n) for n in record.ladder)
        lines.append(
            f"  power {power_label(record.power)} ({record.power_source}), "
            f"{record.query_type or '?'} question, ladder {ladder} chunks, "
            f"stopped: {record.stop_reason}"
        )
        for r in record.rounds:
            confidence = "-" if r.confidence is None else f"{r.confidence:.2f}"
            threshold = "-" if r.threshold is None else f"{r.threshold:.2f}"
            lines.append(
                f"  round {r.round}: depth {r.depth}/{record.max_depth}, {r.chunks} chunks, "
                f"confidence {confidence}, threshold {threshold} → {r.decision}"
            )
        for note in (result.hops[-1].warning, result.hops[-1].hint) if result.hops else ():
            if note:
                lines.append(f"  note: {note}")
    for hop in result.hops if record is None or record.ladder is None else ():
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
    if result.limit_note:
        lines.append(f"  {result.limit_note}")
    if result.request_id:
        lines.append(f"  request {result.request_id}")
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


async def run(
    pipeline: Pipeline,
    questions: Sequence[str],
    thread: str | None,
    demo: bool,
    power: PowerChoice | None = None,
) -> None:
    """Answer the questions in one event loop, and always close the conversation store in it
    (an open SQLite connection would keep the process from exiting). `power`: the adaptive depth
    (None: the default, CAPRAG_POWER)."""
    forced, _choice = pipeline.resolve_power(power)
    source: PowerSource = "default" if power is None else "request"
    try:
        await pipeline.open()
        for question in questions:
            if demo:
                print(f"\n### {question}")
                print(render(await pipeline.ask(question, None, forced, power_source=source)))
                continue
            current = thread or str(uuid.uuid4())
            new = not await pipeline.history(current)
            print(render(await pipeline.ask(question, current, forced, power_source=source)))
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
    ask.add_argument(
        "--power",
        choices=["auto", "1", "2", "3"],
        default=None,
        help="adaptive strategy: auto, or force depth 1 (quick), 2 (balanced) or 3 (deep) "
        "(default: CAPRAG_POWER, depth 2)",
    )
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
        power = parse_power(getattr(args, "power", None))
        asyncio.run(run(pipeline, questions, None if demo else args.thread, demo, power))
    except CapragError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
