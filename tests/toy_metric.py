"""A metric added the way the registry says: one module, one registration (importing it registers).

`toy` counts the words of an answer (fewer is better, a toy): the harness computes it for every
answered question once this module is imported (in a test, or by `+experiment.metric_modules=
[tests.toy_metric]`), and every table, page and comparison shows it with its label and unit.
"""

from __future__ import annotations

from caprag.serve.services import AskResult
from experiments.results import metrics as registry
from experiments.results.metrics import COUNT, Metric, NotScored
from experiments.results.questions import GoldQuestion

UNANSWERABLE = "no gold passages (unanswerable question)"


def answer_words(turn: GoldQuestion, result: AskResult, k: int) -> float | NotScored:
    """Words in the answer; an unanswerable question is not scored (its reason is kept)."""
    if not turn.gold_passages:
        return NotScored(UNANSWERABLE)
    return float(len(result.answer.split()))


TOY = registry.register(
    Metric(
        "toy",
        "toy: answer length",
        unit="words",
        higher_is_better=False,
        format=COUNT,
        group="answer",
        description="Words in the answer (a metric registered by a test module).",
        headline=True,
        sliced=True,
        score=answer_words,
    )
)
