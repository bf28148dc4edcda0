"""reports/strategies.md: the four strategies on the curated question sets (offline, k = 8)."""

from __future__ import annotations

from collections.abc import Callable

from experiments.cli.reports import Context, Report, register
from experiments.cli.reports.render import (
    Arm,
    difference,
    fmt,
    header,
    significance,
    strategy_table,
    target,
)
from experiments.results.row import QuestionRow

STRATEGIES = ("single", "multi-question", "multi-hop", "adaptive")
SETS = ("single_book", "cross_book", "follow_up", "unanswerable")
CROSS_BOOK_RECALL = 0.95
UNANSWERABLE_HOPS = 1.5


def in_set(name: str) -> Callable[[QuestionRow], bool]:
    """Keep the rows of one question set."""
    return lambda row: row.set == name


def build(context: Context) -> str:
    """Every strategy over every curated set, per set, with multi-hop as the reference."""
    results = {s: context.run(f"strategy={s}", "dataset=all") for s in STRATEGIES}
    names = context.run("strategy=multi-hop", "dataset=cross_book", "dataset.links=names")
    lines = header(
        "Strategies on the curated sets",
        "The bundled Cinderwake corpus and its four curated question sets (`dataset=all`: "
        "single_book, cross_book, follow_up turn by turn, unanswerable), dense MiniLM retrieval, "
        "k = 8 passages handed to generation (adaptive hands on its depth ladder, 5 / 15 / 30: "
        "see the passages column). Rows: `python -m experiments.run strategy=S dataset=all`. "
        "Recall@k counts only the first k passages handed on; cumulative recall counts every "
        "passage the strategy retrieved.",
    )
    hop = results["multi-hop"]
    cross = Arm("multi-hop", hop, lambda r: r.set == "cross_book")
    unanswerable = Arm("multi-hop", hop, lambda r: r.set == "unanswerable")
    recall = cross.mean("recall_at_k")
    hops = unanswerable.mean("hops")
    lines += [
        "## Targets",
        "",
        target(
            recall is not None and recall >= CROSS_BOOK_RECALL,
            f"cross-book recall@8 of multi-hop {fmt(recall)} (target ≥ {CROSS_BOOK_RECALL}); "
            f"its cumulative recall {fmt(cross.mean('cumulative_recall'))}, MRR "
            f"{fmt(cross.mean('mrr'))}.",
        ),
        target(
            hops is not None and hops <= UNANSWERABLE_HOPS,
            f"unanswerable questions take {fmt(hops, '.2f')} hops on average with multi-hop "
            f"(target ≤ {UNANSWERABLE_HOPS}): it stops after the first hop when nothing "
            "retrieved is about the question or nothing is left to follow.",
        ),
        "",
    ]
    for set_name in SETS:
        arms = [Arm(s, results[s], in_set(set_name)) for s in STRATEGIES]
        lines += [f"## {set_name}", "", strategy_table(arms), ""]
        base = arms[STRATEGIES.index("multi-hop")]
        if set_name != "unanswerable":
            for arm in arms:
                if arm is not base:
                    lines += [significance(base, arm), ""]
    both = {
        "citations": Arm("links=citations", hop, in_set("cross_book")),
        "names": Arm("links=names", names, in_set("cross_book")),
    }
    gain = difference(both["names"], both["citations"], "recall_at_k")
    lines += [
        "## Each corpus follows its own links",
        "",
        "`dataset.links` says how a corpus links its passages, and the rule analyzer follows "
        "those links: `citations` (the rulebooks' '(Combat, p. 41)') or `names` (a name that "
        "is another passage's title, as in encyclopaedic text; tuned on HotpotQA). On the "
        "cross-book set, multi-hop with each:",
        "",
        strategy_table(list(both.values())),
        "",
        f"Following citations instead of names adds {fmt(gain, '+.3f')} recall@8 here; on "
        "HotpotQA and SQuAD the names rule is the one that applies (`reports/benchmarks.md`).",
        "",
    ]
    return "\n".join(lines)


register(
    Report(
        "strategies.md",
        build,
        inputs=("datasets/books/*.md", "datasets/questions/*.jsonl"),
        module=__name__,
    )
)
