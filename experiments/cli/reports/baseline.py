"""reports/baseline.json: the regression gate's baseline (`python -m experiments.gate`)."""

from __future__ import annotations

from experiments.cli.reports import Context, Report, register


def build(context: Context) -> str:
    """The gate's own evaluation, in the clean store, as the file `gate --update` writes."""
    from experiments.cli.gate import baseline_text, evaluate

    fixed = [o for o in context.fixed() if not o.startswith(("llm=", "judge="))]
    return baseline_text(evaluate(fixed))


register(
    Report(
        "baseline.json",
        build,
        inputs=("datasets/books/*.md", "datasets/questions/*.jsonl", "experiments/cli/gate.py"),
        module=__name__,
    )
)
