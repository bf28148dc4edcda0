"""reports/follow-up.md: conversations, with and without rewriting follow-ups."""

from __future__ import annotations

from experiments.cli.reports import Context, Report, register
from experiments.cli.reports.render import Arm, header, significance, strategy_table
from experiments.results.row import QuestionRow


def later_turn(row: QuestionRow) -> bool:
    """A second or later turn of its conversation."""
    return row.turn > 1


def build(context: Context) -> str:
    """The follow_up set asked turn by turn on one thread, multi-hop, rewrite on and off."""
    on = context.run("strategy=multi-hop", "dataset=follow_up")
    off = context.run("strategy=multi-hop", "dataset=follow_up", "pipeline.rewrite=false")
    lines = header(
        "Follow-up questions: rewrite on and off",
        "The follow_up set (25 conversations) asked turn by turn on one thread, multi-hop, dense "
        "MiniLM, k = 8. With `pipeline.rewrite=true` (the default) a follow-up is turned into a "
        "standalone question from the conversation before it is searched (the offline rewrite: "
        "the conversation's named rule replaces the pronoun or completes the ellipsis); with "
        "false it is searched as asked.",
    )
    arms = [Arm("rewrite on", on, later_turn), Arm("rewrite off", off, later_turn)]
    firsts = [Arm(f"{a.label}, first turns", a.result, lambda row: row.turn == 1) for a in arms]
    lines += [
        "## Turns 2 and later",
        "",
        strategy_table(arms),
        "",
        significance(arms[1], arms[0]),
        "",
        "## First turns (the same question either way)",
        "",
        strategy_table(firsts),
        "",
    ]
    return "\n".join(lines)


register(
    Report(
        "follow-up.md",
        build,
        inputs=("datasets/books/*.md", "datasets/questions/follow_up.jsonl"),
        module=__name__,
    )
)
