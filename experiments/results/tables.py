"""Terminal tables: one run's metrics with coverage, and several runs side by side."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from experiments.results.aggregate import Aggregate, Failures

SHOWN = (
    ("recall_at_k", "gold-passage recall@k"),
    ("all_gold_at_k", "all gold passages in k"),
    ("mrr", "MRR"),
    ("precision_at_k", "precision@k"),
    ("recall_hop1", "cumulative recall after hop 1"),
    ("recall_hop2", "cumulative recall after hop 2"),
    ("recall_hop3", "cumulative recall after hop 3"),
    ("exact_match", "exact match"),
    ("f1", "token F1"),
    ("correct_refusal", "correct refusal (unanswerable)"),
    ("false_refusal", "false refusal (answerable)"),
    ("ragas_context_recall", "RAGAS context recall (non-LLM)"),
    ("ragas_context_precision", "RAGAS context precision (non-LLM)"),
    ("ragas_string_similarity", "RAGAS string similarity"),
    ("ragas_rouge_l", "RAGAS ROUGE-L"),
    ("judge_faithfulness", "judge: faithfulness"),
    ("judge_answer_relevancy", "judge: answer relevancy"),
    ("judge_context_precision", "judge: context precision"),
    ("hops", "hops (mean)"),
    ("depth", "adaptive: final depth"),
    ("confidence", "adaptive: final confidence"),
    ("reached_threshold", "adaptive: reached its threshold"),
    ("needed_2plus_rounds", "adaptive: needed 2+ rounds"),
    ("classified_as_gold_type", "adaptive: query type = gold type"),
    ("retrieval_calls", "retrieval calls"),
    ("llm_calls", "LLM calls"),
    ("distinct_passages", "distinct passages retrieved"),
    ("prompt_tokens", "prompt tokens"),
    ("completion_tokens", "completion tokens"),
    ("cost_usd", "cost USD / question"),
    ("latency_s", "latency s (mean)"),
)


def fmt(value: float | None, name: str = "") -> str:
    """Numbers as people read them: counts plain, shares to 3 places, cost to 6."""
    if value is None:
        return "—"
    if name == "cost_usd":
        return f"{value:.6f}"
    if name == "failed":
        return f"{value:.0f}"
    if name.endswith("tokens") or name.endswith("calls") or name == "distinct_passages":
        return f"{value:.1f}"
    return f"{value:.3f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table (also readable in a terminal)."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = [
        "| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in rows
    ]
    return "\n".join([line, rule, *body])


def run_table(
    aggregates: Mapping[str, Aggregate],
    summary: Mapping[str, float],
    failed: Failures | None = None,
) -> str:
    """One run: questions answered, then metric, value, coverage (n/total with values); with
    `failed`, a line under the table names the most common error."""
    questions = int(summary.get("questions", 0))
    answered = questions - int(summary.get("failed", 0))
    rows = [["questions answered", str(answered), f"{answered}/{questions}"]]
    for name, label in SHOWN:
        agg = aggregates.get(name)
        if agg is None:
            continue
        rows.append([label, fmt(agg.mean, name), agg.coverage])
    for name in ("later_turns_recall_at_k", "latency_p50_s", "latency_p95_s"):
        if name in summary:
            rows.append([name.replace("_", " "), fmt(summary[name]), ""])
    rows.append(["failed questions", f"{summary.get('failed', 0):.0f}", ""])
    table = markdown_table(["metric", "value", "coverage"], rows)
    if failed is not None and failed.failed:
        table += f"\nmost common error: {failed.most_common()}"
    return table


def compare_table(
    runs: Sequence[tuple[str, Mapping[str, float | None], Mapping[str, str]]],
) -> str:
    """Runs side by side: (label, metric → mean, metric → coverage) per run."""
    header = ["metric", *[label for label, _, _ in runs]]
    rows = []
    for name, label in (
        *SHOWN,
        ("later_turns_recall_at_k", "recall@k of follow-up turns 2+"),
        ("latency_p50_s", "latency p50 s"),
        ("latency_p95_s", "latency p95 s"),
        ("failed", "failed questions"),
    ):
        if not any(name in values for _, values, _ in runs):
            continue
        cells = []
        for _, values, coverage in runs:
            cell = fmt(values.get(name), name)
            if coverage.get(name) and coverage[name] != "1.000":
                cell += f" ({coverage[name]})"
            cells.append(cell)
        rows.append([label, *cells])
    return markdown_table(header, rows)
