"""RAGAS scoring: non-LLM metrics offline; LLM-judge metrics through an OpenAI-compatible client.

`import ragas` 0.4.3 fails without `langchain_community.chat_models.vertexai` (ragas issues #2741,
#2745): an empty stand-in module is registered before the import, here where ragas is wrapped.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Sequence
from typing import Any

from caprag import disable_telemetry
from experiments.scoring.question import Scores

disable_telemetry()


def import_ragas() -> Any:
    name = "langchain_community.chat_models.vertexai"
    if name not in sys.modules:
        shim = types.ModuleType(name)
        shim.ChatVertexAI = type("ChatVertexAI", (), {})  # type: ignore[attr-defined]
        sys.modules[name] = shim
    import logging
    import warnings

    logging.getLogger("absl").setLevel(logging.WARNING)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import ragas
        import ragas.metrics
    return ragas


class OfflineRagas:
    """Non-LLM RAGAS metrics: context recall/precision against the gold passages' text,
    string similarity and ROUGE-L of the answer against the reference answer."""

    names = (
        "ragas_context_recall",
        "ragas_context_precision",
        "ragas_string_similarity",
        "ragas_rouge_l",
    )

    def __init__(self) -> None:
        ragas = import_ragas()
        m = ragas.metrics
        self._sample = ragas.SingleTurnSample
        self._context = [
            ("ragas_context_recall", m.NonLLMContextRecall()),
            ("ragas_context_precision", m.NonLLMContextPrecisionWithReference()),
        ]
        self._answer = [
            ("ragas_string_similarity", m.NonLLMStringSimilarity()),
            ("ragas_rouge_l", m.RougeScore(rouge_type="rougeL")),
        ]

    async def score(
        self,
        question: str,
        answer: str,
        reference: str,
        contexts: Sequence[str],
        reference_contexts: Sequence[str],
    ) -> Scores:
        """Scores that could be computed, and a reason for each that could not."""
        values: dict[str, float | None] = {}
        missing: dict[str, str] = {}
        sample = self._sample(
            user_input=question,
            response=answer,
            reference=reference or None,
            retrieved_contexts=list(contexts),
            reference_contexts=list(reference_contexts) or None,
        )
        for name, metric in self._context:
            if not reference_contexts:
                missing[name] = "no gold passages (unanswerable question)"
            elif not contexts:
                missing[name] = "nothing was retrieved"
            else:
                values[name] = await _safe(metric, sample, name, missing)
        for name, metric in self._answer:
            if not reference:
                missing[name] = "no reference answer"
            else:
                values[name] = await _safe(metric, sample, name, missing)
        return {k: v for k, v in values.items() if v is not None}, missing


async def _safe(metric: Any, sample: Any, name: str, missing: dict[str, str]) -> float | None:
    try:
        return float(await metric.single_turn_ascore(sample))
    except Exception as exc:  # a metric failure is recorded as missing, never as 0
        missing[name] = f"{type(exc).__name__}: {exc}"
        return None
