"""LLM judges: none by default; RAGAS LLM metrics through an OpenAI-compatible endpoint."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from caprag.llm.openai import DEFAULT_KEY_VARIABLE, resolve_api_key
from caprag.secrets import redact
from experiments.scoring.question import Scores
from experiments.scoring.ragas_metrics import import_ragas


def no_judge() -> None:
    """Judge disabled: no LLM-judge metrics are computed (nor reported as missing)."""
    return None


class RagasJudge:
    """Faithfulness, answer relevancy and LLM context precision (ragas.metrics.collections)."""

    names = ("judge_faithfulness", "judge_answer_relevancy", "judge_context_precision")

    def __init__(
        self,
        model: str,
        base_url: str | None,
        api_key: str | None = None,
        api_key_env: str | None = DEFAULT_KEY_VARIABLE,
        embedding: str = "minilm",
        max_output_tokens: int | None = 1024,
    ) -> None:
        """The key is `api_key` when code passes one, else the variable named by `api_key_env`."""
        key = resolve_api_key(api_key, api_key_env, "judge=openai (use judge=none offline)")
        from openai import AsyncOpenAI

        import_ragas()
        from ragas.llms import llm_factory
        from ragas.metrics.collections import AnswerRelevancy, ContextPrecision, Faithfulness

        self.model = model
        client = AsyncOpenAI(api_key=key, base_url=base_url)
        # An output cap every server honours (a small local model may otherwise never stop).
        caps: dict[str, Any] = {"max_tokens": max_output_tokens} if max_output_tokens else {}
        llm = llm_factory(model, client=client, **caps)
        self.metrics: list[tuple[str, Any, str]] = [
            ("judge_faithfulness", Faithfulness(llm=llm), "contexts"),
            (
                "judge_answer_relevancy",
                AnswerRelevancy(llm=llm, embeddings=_embeddings(embedding)),
                "answer",
            ),
            ("judge_context_precision", ContextPrecision(llm=llm), "reference"),
        ]

    async def score(
        self,
        question: str,
        answer: str,
        reference: str,
        contexts: Sequence[str],
        reference_contexts: Sequence[str],
    ) -> Scores:
        """Each metric's score, or why it is missing (an error is a reason, never a 0)."""
        values: dict[str, float | None] = {}
        missing: dict[str, str] = {}
        for name, metric, needs in self.metrics:
            kwargs: dict[str, Any] = {"user_input": question, "response": answer}
            if needs in ("contexts", "reference"):
                if not contexts:
                    missing[name] = "nothing was retrieved"
                    continue
                kwargs["retrieved_contexts"] = list(contexts)
            if needs == "reference":
                if not reference_contexts:
                    missing[name] = "no gold passages (unanswerable question)"
                    continue
                kwargs = {
                    "user_input": question,
                    "reference": reference,
                    "retrieved_contexts": list(contexts),
                }
            try:
                result = await metric.ascore(**kwargs)
                values[name] = float(result.value)
            except Exception as exc:  # recorded as missing with its reason
                missing[name] = redact(f"{type(exc).__name__}: {str(exc)[:200]}")
        return {k: v for k, v in values.items() if v is not None}, missing


def _embeddings(name: str) -> Any:
    """Our bundled embedder behind RAGAS's embedding interface (no OpenAI embeddings call)."""
    from ragas.embeddings import BaseRagasEmbedding

    from caprag.embeddings import get_embedder

    embedder = get_embedder(name)

    class Bundled(BaseRagasEmbedding):
        def embed_text(self, text: str, **kwargs: Any) -> list[float]:
            return embedder.embed_query(text)

        async def aembed_text(self, text: str, **kwargs: Any) -> list[float]:
            return embedder.embed_query(text)

    return Bundled()
