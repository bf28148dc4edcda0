"""reports/benchmarks.md: the strategies on public data (HotpotQA and SQuAD samples, pooled)."""

from __future__ import annotations

from collections.abc import Callable

from experiments.cli.reports import Context, Report, register
from experiments.cli.reports.render import (
    Arm,
    difference,
    fmt,
    header,
    ratio,
    significance,
    strategy_table,
    target,
)
from experiments.results.row import QuestionRow

RETRIEVERS = ("bm25", "minilm", "hybrid")
STRATEGIES = ("single", "multi-question", "multi-hop", "adaptive")
K = 10
HOTPOT_RECALL = 0.93
MRR_SLACK = 0.02
TOKEN_RATIO = 2.0
SQUAD_POINTS = 0.005
SQUAD_HOPS = 1.3


def of_type(kind: str) -> Callable[[QuestionRow], bool]:
    """Keep the questions of one benchmark type (the set `hotpotqa:<type>`)."""
    return lambda row: row.set.endswith(f":{kind}")


def build(context: Context) -> str:
    """HotpotQA pooled: every strategy with every retriever; SQuAD pooled: single vs multi-hop."""
    hotpot = {
        (r, s): context.run(
            f"strategy={s}", "dataset=hotpotqa", f"retriever={r}", f"retriever.k={K}"
        )
        for r in RETRIEVERS
        for s in STRATEGIES
    }
    squad = {
        (r, s): context.run(f"strategy={s}", "dataset=squad", f"retriever={r}", f"retriever.k={K}")
        for r in ("bm25", "minilm")
        for s in ("single", "multi-hop")
    }
    lines = header(
        "Strategies on public benchmarks",
        "The HotpotQA dev-distractor sample (252 questions: 173 bridge, 79 comparison) and the "
        "SQuAD 1.1 dev sample (300 single-paragraph questions), each pooled: every paragraph of "
        "the file in one index (2,478 and 726 passages), searched by every question. k = 10 "
        "passages handed to generation (adaptive: its depth ladder, see the passages column). "
        "Multi-hop follows the names a passage gives that the corpus has a passage about "
        "(`dataset.links=names`), each as the question with the name; its follow-up results "
        "take the place of the first hop's lowest-ranked passages, never of its best. Sample "
        "scores are not comparable with published full-split numbers.",
    )
    best = max(RETRIEVERS, key=lambda r: Arm("", hotpot[r, "multi-hop"]).mean("recall_at_k") or 0)
    hop = Arm(f"multi-hop ({best})", hotpot[best, "multi-hop"])
    one = Arm(f"single ({best})", hotpot[best, "single"])
    recall, mrr_gap = hop.mean("recall_at_k"), difference(one, hop, "mrr")
    tokens = ratio(hop.mean("prompt_tokens"), one.mean("prompt_tokens"))
    lines += [
        "## Targets",
        "",
        target(
            recall is not None and recall >= HOTPOT_RECALL,
            f"HotpotQA pooled, best multi-hop ({best}): recall@{K} {fmt(recall)} (target ≥ "
            f"{HOTPOT_RECALL}); all-gold@{K} {fmt(hop.mean('all_gold_at_k'))}, cumulative "
            f"recall {fmt(hop.mean('cumulative_recall'))}.",
        ),
        target(
            mrr_gap is not None and mrr_gap >= -MRR_SLACK,
            f"its MRR {fmt(hop.mean('mrr'))} against a single query's {fmt(one.mean('mrr'))} "
            f"({fmt(mrr_gap, '+.3f')}; target within {MRR_SLACK}).",
        ),
        target(
            tokens is not None and tokens <= TOKEN_RATIO,
            f"its prompt tokens {fmt(hop.mean('prompt_tokens'), ',.0f')} per question, "
            f"{fmt(tokens, '.2f')}× a single query's (target ≤ {TOKEN_RATIO}×).",
        ),
    ]
    for retriever in ("bm25", "minilm"):
        s, m = (
            Arm("single", squad[retriever, "single"]),
            Arm("multi-hop", squad[retriever, "multi-hop"]),
        )
        gap, hops = difference(s, m, "recall_at_k"), m.mean("hops")
        lines.append(
            target(
                gap is not None and gap >= -SQUAD_POINTS and (hops or 0) <= SQUAD_HOPS,
                f"SQuAD pooled ({retriever}): multi-hop recall@{K} {fmt(m.mean('recall_at_k'))} "
                f"against single {fmt(s.mean('recall_at_k'))} ({fmt(gap, '+.3f')}; target within "
                f"{SQUAD_POINTS}) at {fmt(hops, '.2f')} hops (target ≤ {SQUAD_HOPS}).",
            )
        )
    lines += ["", "## HotpotQA pooled, every strategy and retriever", ""]
    for retriever in RETRIEVERS:
        arms = [Arm(s, hotpot[retriever, s]) for s in STRATEGIES]
        lines += [f"### {retriever}", "", strategy_table(arms), ""]
        lines += [significance(arms[0], arms[2]), ""]
    lines += ["## HotpotQA by question type (multi-hop against single)", ""]
    for kind in ("bridge", "comparison"):
        arms = [
            Arm(f"{s} ({r})", hotpot[r, s], of_type(kind))
            for r in RETRIEVERS
            for s in ("single", "multi-hop")
        ]
        lines += [f"### {kind}", "", strategy_table(arms), ""]
    lines += ["## SQuAD pooled: a single-hop set, where following adds nothing", ""]
    for retriever in ("bm25", "minilm"):
        arms = [Arm(s, squad[retriever, s]) for s in ("single", "multi-hop")]
        lines += [
            f"### {retriever}",
            "",
            strategy_table(arms),
            "",
            significance(arms[0], arms[1]),
            "",
        ]
    return "\n".join(lines)


register(
    Report(
        "benchmarks.md",
        build,
        inputs=(
            "datasets/benchmarks/hotpotqa_dev_distractor.jsonl",
            "datasets/benchmarks/squad_v1.1_dev_single.jsonl",
        ),
        module=__name__,
    )
)
