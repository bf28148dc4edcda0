"""reports/baselines.md: the published baselines (IRCoT, Self-Ask, Iter-RetGen) beside the four
strategies, at one passage budget, with each compared to multi-hop question by question."""

from __future__ import annotations

from collections.abc import Callable

from experiments.cli.reports import Context, Report, register
from experiments.cli.reports.render import Arm, fmt, header, significance, strategy_table
from experiments.results.row import QuestionRow

OURS = ("single", "multi-question", "multi-hop", "adaptive")
BASELINES = ("ircot", "self-ask", "iter-retgen")
STRATEGIES = (*OURS, *BASELINES)
K = 10
SETS = ("single_book", "cross_book", "follow_up", "unanswerable")
BENCHMARKS = {"hotpotqa": "HotpotQA pooled", "squad": "SQuAD pooled"}
BENCHMARK_RETRIEVER = "bm25"


def in_set(name: str) -> Callable[[QuestionRow], bool]:
    """Keep the rows of one question set."""
    return lambda row: row.set == name


def compared(arms: list[Arm]) -> list[str]:
    """The table, then each other strategy against multi-hop over the questions both answered."""
    base = arms[STRATEGIES.index("multi-hop")]
    lines = [strategy_table(arms), ""]
    for arm in arms:
        if arm is not base:
            lines += [significance(base, arm), ""]
    return lines


def build(context: Context) -> str:
    """Every strategy on the curated sets and on both public samples, at k = K."""
    curated = {
        s: context.run(f"strategy={s}", "dataset=all", f"retriever.k={K}") for s in STRATEGIES
    }
    public = {
        (d, s): context.run(
            f"strategy={s}", f"dataset={d}", f"retriever={BENCHMARK_RETRIEVER}", f"retriever.k={K}"
        )
        for d in BENCHMARKS
        for s in STRATEGIES
    }
    lines = header(
        "The published baselines at an equal budget",
        "IRCoT (Trivedi et al., 2023), Self-Ask (Press et al., 2023) and Iter-RetGen (Shao et "
        "al., 2023) as caprag strategies (`strategy=ircot|self-ask|iter-retgen`; what each is "
        "and how faithful: `docs/baselines.md`), beside single, multi-question, multi-hop and "
        f"adaptive. Every strategy hands generation at most k = {K} passages (adaptive: its "
        "depth ladder, see the passages column); recall@k counts only those, cumulative "
        "recall every passage the strategy retrieved; tokens, calls and cost count every step "
        "(a rule step is costed as if its prompt had been sent). Every step here is its "
        "deterministic rule, so these rows compare the strategies' retrieval loops with rule "
        "reasoning (the baselines' papers use a language model at every step): read them as "
        "the offline floor of each loop, not as the papers' numbers. Below each table, each "
        "strategy against multi-hop, paired over the questions both answered (95 % bootstrap "
        "CI, permutation p). Curated sets: the bundled corpus, dense MiniLM retrieval "
        f"(`dataset=all retriever.k={K}`); HotpotQA (252 questions over 2,478 passages) and "
        f"SQuAD (300 over 726), each pooled, BM25 (`dataset=hotpotqa|squad "
        f"retriever={BENCHMARK_RETRIEVER} retriever.k={K}`).",
    )
    lines += ["## Summary: recall@k per strategy", ""]
    summary = [
        ("curated: cross_book", {s: Arm(s, curated[s], in_set("cross_book")) for s in STRATEGIES}),
        *(
            (label, {s: Arm(s, public[d, s]) for s in STRATEGIES})
            for d, label in BENCHMARKS.items()
        ),
    ]
    head = "| | " + " | ".join(STRATEGIES) + " |"
    lines += [head, "|" + "---|" * (len(STRATEGIES) + 1)]
    for label, by_name in summary:
        cells = [fmt(by_name[s].mean("recall_at_k")) for s in STRATEGIES]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += ["## Curated sets", ""]
    for set_name in SETS:
        arms = [Arm(s, curated[s], in_set(set_name)) for s in STRATEGIES]
        lines += [f"### {set_name}", ""]
        lines += compared(arms) if set_name != "unanswerable" else [strategy_table(arms), ""]
    for dataset, label in BENCHMARKS.items():
        arms = [Arm(s, public[dataset, s]) for s in STRATEGIES]
        lines += [f"## {label} ({BENCHMARK_RETRIEVER})", "", *compared(arms)]
    return "\n".join(lines)


register(
    Report(
        "baselines.md",
        build,
        inputs=(
            "datasets/books/*.md",
            "datasets/questions/*.jsonl",
            "datasets/benchmarks/hotpotqa_dev_distractor.jsonl",
            "datasets/benchmarks/squad_v1.1_dev_single.jsonl",
        ),
        module=__name__,
    )
)
