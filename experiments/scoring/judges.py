"""LLM judges: none by default; RAGAS LLM metrics through an OpenAI-compatible endpoint.

The judge's calls go through `BoundedJudgeLLM`, a RAGAS LLM (`InstructorBaseRagasLLM`, what the
`ragas.metrics.collections` metrics take) that asks in the structured-output mode the server
honours: `json_schema` (OpenAI, llama.cpp, vLLM, Ollama: the server constrains the reply to the
schema, which is fitted to the output cap as the pipeline's are, caprag.llm.budget) or
`json_object` (servers that know only JSON mode: RAGAS's prompt carries the schema). A reply cut
at the cap is retried once with a larger cap (`caprag.llm.budget.retry_cap`); a reply that still
does not fit is a missing score with its reason, never a 0.

`repeats` judges each answer that many times, each repeat with its own seed (servers that honour
`seed` sample reproducibly). A metric's value is the mean over the repeats that scored, and
`<metric>_spread` (max - min over them) says how far repeats disagree: the judge noise a
difference between two runs has to exceed. Context recall and precision are also set beside their
non-LLM counterparts (RAGAS NonLLMContextRecall / NonLLMContextPrecisionWithReference against the
gold passages' text): `<metric>_gap` is the absolute difference per question.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from caprag.llm.budget import model_schema, retry_cap
from caprag.llm.openai import DEFAULT_KEY_VARIABLE, resolve_api_key
from caprag.secrets import redact
from experiments.results.metrics import Format, Metric, known, register
from experiments.scoring.question import Scores
from experiments.scoring.ragas_metrics import import_ragas

M = TypeVar("M", bound=BaseModel)
METHODS = ("json_schema", "json_object")
LLM_METRICS = (
    "judge_faithfulness",
    "judge_answer_relevancy",
    "judge_context_precision",
    "judge_context_recall",
)
COUNTERPARTS = {
    "judge_context_recall": "ragas_context_recall",
    "judge_context_precision": "ragas_context_precision",
}
"""An LLM metric → the non-LLM metric that measures the same against the gold passages."""


class JudgeReplyError(ValueError):
    """The judge's reply could not be used (cut at the cap twice, or not fitting the schema)."""


def no_judge() -> None:
    """Judge disabled: no LLM-judge metrics are computed (nor reported as missing)."""
    return None


def _register() -> None:
    """The judge's own metrics beside those registered with the harness's built-ins."""
    if not known("judge_context_recall"):
        register(
            Metric(
                "judge_context_recall",
                "judge: context recall",
                group="judge",
                higher_is_better=True,
                failed_counts_as=0.0,
                description="RAGAS ContextRecall by the LLM judge: the share of the reference "
                "answer's claims the retrieved passages back.",
            )
        )
    for name in LLM_METRICS:
        if not known(f"{name}_spread"):
            register(
                Metric(
                    f"{name}_spread",
                    f"{name.removeprefix('judge_').replace('_', ' ')}: spread over repeats",
                    group="judge",
                    higher_is_better=False,
                    format=Format(3),
                    description="Max - min of the judge's scores over judge.repeats on one "
                    "answer: judge noise (0 when the repeats agree).",
                )
            )
    for name, other in COUNTERPARTS.items():
        if not known(f"{name}_gap"):
            register(
                Metric(
                    f"{name}_gap",
                    f"{name.removeprefix('judge_').replace('_', ' ')}: LLM vs {other}",
                    group="judge",
                    higher_is_better=False,
                    format=Format(3),
                    description=f"|{name} - {other}| on one answer: how far the LLM judge is "
                    "from its non-LLM counterpart on the gold passages.",
                )
            )


_register()


def seed_for(base: int, repeat: int, prompt: str, occurrence: int) -> int:
    """The seed of one judge call: fixed by the run's seed, the repeat, the prompt and how many
    times this repeat sent that prompt before (a metric that asks the same prompt several times,
    as answer relevancy does, gets different samples) — not by the order questions run in."""
    digest = hashlib.sha256(f"{base}\x00{repeat}\x00{occurrence}\x00{prompt}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def binary_verdicts(schema: Any) -> Any:
    """The schema with every integer field held to 0 or 1: RAGAS's verdicts (`verdict`,
    `attributed`, `noncommittal`) are 1 or 0 by its prompts, but typed as any integer, and a
    small model's 2 made a context recall of 2.0 (seen with SmolLM2)."""
    if isinstance(schema, dict):
        out: dict[str, Any] = {k: binary_verdicts(v) for k, v in schema.items()}
        if out.get("type") == "integer":
            out.update(minimum=0, maximum=1)
        return out
    if isinstance(schema, list):
        return [binary_verdicts(v) for v in schema]
    return schema


class JudgeCalls:
    """The judge's calls to an OpenAI-compatible client: structured replies in the mode the
    server honours, fitted to the output cap, retried once with a larger cap when cut. RAGAS
    reaches it through `ragas_llm` (its LLM interface)."""

    def __init__(
        self,
        client: Any,
        model: str,
        *,
        max_output_tokens: int | None = 512,
        structured_method: str = "json_schema",
        temperature: float = 0.0,
        seed: int = 0,
        repeat: int = 0,
    ) -> None:
        if structured_method not in METHODS:
            raise ValueError(
                f"judge.structured_method={structured_method!r}: use one of {', '.join(METHODS)}"
            )
        self.client = client
        self.model = model
        self.max_output_tokens = max_output_tokens
        self.structured_method = structured_method
        self.temperature = temperature
        self.seed = seed
        self.repeat = repeat
        self.sent: dict[str, int] = {}

    def _format(self, response_model: type[BaseModel]) -> dict[str, Any]:
        if self.structured_method == "json_object":
            return {"type": "json_object"}
        return {
            "type": "json_schema",
            "json_schema": {
                "name": response_model.__name__,
                "schema": binary_verdicts(model_schema(response_model, self.max_output_tokens)),
            },
        }

    async def agenerate(self, prompt: str, response_model: type[M]) -> M:
        """The reply parsed as `response_model`; JudgeReplyError when it cannot be."""
        occurrence = self.sent.get(prompt, 0)
        self.sent[prompt] = occurrence + 1
        caps: list[int | None] = [self.max_output_tokens]
        if self.max_output_tokens is not None:
            caps.append(retry_cap(response_model, self.max_output_tokens))
        for cap in caps:
            extra: dict[str, Any] = {"max_tokens": cap} if cap is not None else {}
            completion = await self.client.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": prompt}],
                response_format=self._format(response_model),
                temperature=self.temperature,
                seed=seed_for(self.seed, self.repeat, prompt, occurrence),
                **extra,
            )
            choice = completion.choices[0] if completion.choices else None
            if choice is None:
                raise JudgeReplyError("the judge's reply had no choices")
            if choice.finish_reason == "length":
                continue
            try:
                return response_model.model_validate_json(choice.message.content or "")
            except ValidationError as exc:
                raise JudgeReplyError(
                    f"the judge's reply does not fit {response_model.__name__}: "
                    + " ".join(str(exc).split())[:160]
                ) from exc
        raise JudgeReplyError(
            f"the judge's reply was cut at the output cap ({self.max_output_tokens} tokens, "
            f"then {caps[-1]}) before its JSON was complete"
        )


@functools.cache
def _ragas_llm_class() -> type[Any]:
    """RAGAS's LLM interface (what its collections metrics take) over JudgeCalls; built on first
    use, since importing ragas takes seconds and a run without a judge never needs it."""
    import_ragas()
    from ragas.llms.base import InstructorBaseRagasLLM

    class BoundedJudgeLLM(InstructorBaseRagasLLM):
        def __init__(self, calls: JudgeCalls) -> None:
            self.calls = calls

        def generate(self, prompt: str, response_model: type[M]) -> M:
            raise NotImplementedError("the judge is async only: RAGAS's metrics call agenerate")

        async def agenerate(self, prompt: str, response_model: type[M]) -> M:
            return await self.calls.agenerate(prompt, response_model)

    return BoundedJudgeLLM


def ragas_llm(calls: JudgeCalls) -> Any:
    """`calls` as an LLM RAGAS's metrics accept."""
    return _ragas_llm_class()(calls)


class RagasJudge:
    """Faithfulness, answer relevancy, context precision and context recall by an LLM
    (ragas.metrics.collections), each judged `repeats` times."""

    names = LLM_METRICS

    def __init__(
        self,
        model: str,
        base_url: str | None,
        api_key: str | None = None,
        api_key_env: str | None = DEFAULT_KEY_VARIABLE,
        embedding: str = "minilm",
        max_output_tokens: int | None = 1024,
        structured_method: str = "json_schema",
        repeats: int = 1,
        temperature: float = 0.0,
        seed: int = 0,
    ) -> None:
        """The key is `api_key` when code passes one, else the variable named by `api_key_env`."""
        if repeats < 1:
            raise ValueError("judge.repeats must be at least 1")
        key = resolve_api_key(api_key, api_key_env, "judge=openai (use judge=none offline)")
        from openai import AsyncOpenAI

        ragas = import_ragas()
        from ragas.metrics.collections import (
            AnswerRelevancy,
            ContextPrecision,
            ContextRecall,
            Faithfulness,
        )

        self.model = model
        self.repeats = repeats
        client = AsyncOpenAI(api_key=key, base_url=base_url)
        embeddings = _embeddings(embedding)
        self.judges: list[list[tuple[str, Any, str]]] = []
        for repeat in range(repeats):
            llm = ragas_llm(
                JudgeCalls(
                    client,
                    model,
                    max_output_tokens=max_output_tokens,
                    structured_method=structured_method,
                    temperature=temperature,
                    seed=seed,
                    repeat=repeat,
                )
            )
            self.judges.append(
                [
                    ("judge_faithfulness", Faithfulness(llm=llm), "contexts"),
                    (
                        "judge_answer_relevancy",
                        AnswerRelevancy(llm=llm, embeddings=embeddings),
                        "answer",
                    ),
                    ("judge_context_precision", ContextPrecision(llm=llm), "reference"),
                    ("judge_context_recall", ContextRecall(llm=llm), "reference"),
                ]
            )
        m = ragas.metrics
        self._sample = ragas.SingleTurnSample
        self._counterparts = {
            "judge_context_recall": m.NonLLMContextRecall(),
            "judge_context_precision": m.NonLLMContextPrecisionWithReference(),
        }

    async def score(
        self,
        question: str,
        answer: str,
        reference: str,
        contexts: Sequence[str],
        reference_contexts: Sequence[str],
    ) -> Scores:
        """Each metric's mean over the repeats that scored, its spread and (context recall and
        precision) its gap to the non-LLM counterpart; or why it is missing (never a 0)."""
        values: dict[str, float] = {}
        missing: dict[str, str] = {}
        for name in LLM_METRICS:
            why = _not_applicable(name, answer, reference, contexts, reference_contexts)
            if why:
                missing[name] = why
                continue
            scored: list[float] = []
            reasons: list[str] = []
            for metrics in self.judges:
                metric = next(m for n, m, _needs in metrics if n == name)
                try:
                    result = await metric.ascore(
                        **_arguments(name, question, answer, reference, contexts)
                    )
                    value = float(result.value)
                    if math.isnan(value):
                        reasons.append("the judge gave no verdict to score")
                    elif not 0.0 <= value <= 1.0:
                        reasons.append(f"the judge's verdicts gave {value:g}, outside 0-1")
                    else:
                        scored.append(value)
                except Exception as exc:  # recorded as missing with its reason
                    reasons.append(redact(f"{type(exc).__name__}: {str(exc)[:200]}"))
            if not scored:
                missing[name] = reasons[0]
                continue
            values[name] = sum(scored) / len(scored)
            if self.repeats > 1:
                if len(scored) > 1:
                    values[f"{name}_spread"] = max(scored) - min(scored)
                else:
                    missing[f"{name}_spread"] = f"scored in 1 of {self.repeats} repeats"
            if name in self._counterparts:
                other = await self._counterpart(name, reference, contexts, reference_contexts)
                if other is not None:
                    values[f"{name}_gap"] = abs(values[name] - other)
        return values, missing

    async def _counterpart(
        self,
        name: str,
        reference: str,
        contexts: Sequence[str],
        reference_contexts: Sequence[str],
    ) -> float | None:
        sample = self._sample(
            reference=reference or None,
            retrieved_contexts=list(contexts),
            reference_contexts=list(reference_contexts),
        )
        try:
            return float(await self._counterparts[name].single_turn_ascore(sample))
        except Exception:  # the non-LLM scorer records its own reason in its metric
            return None


def _not_applicable(
    name: str,
    answer: str,
    reference: str,
    contexts: Sequence[str],
    reference_contexts: Sequence[str],
) -> str:
    """Why a metric cannot be judged on this answer ('' when it can)."""
    needs_context = name != "judge_answer_relevancy"
    needs_reference = name in ("judge_context_precision", "judge_context_recall")
    if name in ("judge_faithfulness", "judge_answer_relevancy") and not answer:
        return "no answer was generated"
    if needs_context and not contexts:
        return "nothing was retrieved"
    if needs_reference and not (reference_contexts and reference):
        return "no gold passages (unanswerable question)"
    return ""


def _arguments(
    name: str, question: str, answer: str, reference: str, contexts: Sequence[str]
) -> dict[str, Any]:
    if name == "judge_faithfulness":
        return {"user_input": question, "response": answer, "retrieved_contexts": list(contexts)}
    if name == "judge_answer_relevancy":
        return {"user_input": question, "response": answer}
    return {"user_input": question, "reference": reference, "retrieved_contexts": list(contexts)}


def agreement(rows: Sequence[Any]) -> dict[str, dict[str, float | int | None]]:
    """Per LLM metric over answered rows (anything with `values`): how many were scored, the mean
    spread over repeats, and, where there is a non-LLM counterpart, the mean gap to it and the
    Pearson correlation with it (None below 3 pairs or without variance)."""
    out: dict[str, dict[str, float | int | None]] = {}
    for name in LLM_METRICS:
        scored = [r.values[name] for r in rows if name in r.values]
        spreads = [r.values[f"{name}_spread"] for r in rows if f"{name}_spread" in r.values]
        entry: dict[str, float | int | None] = {
            "scored": len(scored),
            "spread": sum(spreads) / len(spreads) if spreads else None,
            "spread_n": len(spreads),
        }
        other = COUNTERPARTS.get(name)
        if other is not None:
            pairs = [
                (r.values[name], r.values[other])
                for r in rows
                if name in r.values and other in r.values
            ]
            entry["pairs"] = len(pairs)
            entry["gap"] = sum(abs(a - b) for a, b in pairs) / len(pairs) if pairs else None
            entry["correlation"] = _pearson(pairs)
        out[name] = entry
    return out


def _pearson(pairs: Sequence[tuple[float, float]]) -> float | None:
    if len(pairs) < 3:
        return None
    xs, ys = [a for a, _ in pairs], [b for _, b in pairs]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    if sx == 0 or sy == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / (sx * sy)


def _embeddings(name: str) -> Any:
    """Our bundled embedder behind RAGAS's embedding interface (no OpenAI embeddings call)."""
    from ragas.embeddings import BaseRagasEmbedding

    from caprag.retrieval.embeddings import get_embedder

    embedder = get_embedder(name)

    class Bundled(BaseRagasEmbedding):
        def embed_text(self, text: str, **kwargs: Any) -> list[float]:
            return embedder.embed_query(text)

        async def aembed_text(self, text: str, **kwargs: Any) -> list[float]:
            return embedder.embed_query(text)

    return Bundled()
