"""An LLM backend over any LangChain chat model: ChatOpenAI for real runs, fakes in tests."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from pydantic import BaseModel

from caprag import analyzer
from caprag.errors import LLMCallError, StructuredOutputError
from caprag.llm.base import LLM, History, LLMResult, format_history, format_passages
from caprag.llm.cache import ResponseCache, cache_key
from caprag.llm.usage import count_tokens, price
from caprag.prompts import ANALYZE, ASSESS, CLASSIFY, EXPAND, GENERATE, REWRITE, Prompt
from caprag.schemas import (
    MAX_QUERIES,
    CallUsage,
    ConfidenceAssessment,
    Document,
    GeneratedAnswer,
    QueryClass,
    Questions,
    SufficiencyDecision,
)

M = TypeVar("M", bound=BaseModel)


class ChatModelLLM(LLM):
    """Structured steps through `with_structured_output`; a reply that does not parse is retried,
    then raised as StructuredOutputError. Transport retries (429, 5xx, timeouts) belong to the
    chat model's client. With a `cache`, an identical call is answered from disk."""

    backend = "chat"

    def __init__(
        self,
        chat: BaseChatModel,
        model: str,
        *,
        rewrite_chat: BaseChatModel | None = None,
        rewrite_model: str | None = None,
        structured_method: str = "function_calling",
        parse_attempts: int = 3,
        backend: str = "chat",
        cache: ResponseCache | None = None,
    ) -> None:
        self.chat = chat
        self.model = model
        self.rewrite_chat = rewrite_chat or chat
        self.rewrite_model = rewrite_model or model
        self.structured_method = structured_method
        self.parse_attempts = parse_attempts
        self.backend = backend
        self.cache = cache
        self._runnables: dict[type[BaseModel], Any] = {}

    def _key(
        self,
        chat: BaseChatModel,
        model: str,
        prompt: Prompt,
        messages: list[BaseMessage],
        **extra: Any,
    ) -> str:
        """What shapes a reply: provider and endpoint, model, every message, the chat model's
        parameters (temperature, seed, output cap...), the output schema and the prompt version."""
        return cache_key(
            provider=self.backend,
            endpoint=getattr(chat, "openai_api_base", None),
            model=model,
            messages=[(m.type, m.content) for m in messages],
            params=getattr(chat, "_identifying_params", {}),
            prompt_version=prompt.version,
            **extra,
        )

    def _replay(self, key: str, step: str) -> tuple[dict[str, Any], CallUsage] | None:
        """A cached reply and its original usage, marked cached (no time spent, no money)."""
        if self.cache is None:
            return None
        hit = self.cache.get(key)
        if hit is None:
            return None
        usage = CallUsage.model_validate(hit["usage"]).model_copy(
            update={"cached": True, "latency_s": 0.0, "step": step}
        )
        return hit["value"], usage

    def _store(self, key: str, value: Any, usage: CallUsage) -> None:
        if self.cache is not None:
            self.cache.put(
                key,
                {"value": value, "usage": usage.model_dump()},
                model=usage.model,
                step=usage.step,
            )

    def _runnable(self, schema: type[BaseModel]) -> Any:
        """The structured-output runnable of a schema, built once (building it costs more CPU
        than the rest of a call's client work)."""
        if schema not in self._runnables:
            self._runnables[schema] = self.chat.with_structured_output(
                schema, method=self.structured_method, include_raw=True
            )
        return self._runnables[schema]

    def _usage(
        self,
        step: str,
        prompt: Prompt,
        model: str,
        messages: list[BaseMessage],
        raw: Any,
        t0: float,
    ) -> CallUsage:
        reported = getattr(raw, "usage_metadata", None) if isinstance(raw, AIMessage) else None
        if reported:
            prompt_tokens = int(reported.get("input_tokens", 0))
            completion_tokens = int(reported.get("output_tokens", 0))
            counted = "reported"
        else:
            prompt_tokens = sum(count_tokens(str(m.content)) for m in messages)
            completion_tokens = count_tokens(_raw_text(raw))
            counted = "tokenizer"
        return CallUsage(
            step=step,
            model=model,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost_usd=price(model, prompt_tokens, completion_tokens),
            latency_s=time.perf_counter() - t0,
            counted=counted,  # type: ignore[arg-type]
            prompt_version=prompt.version,
        )

    async def _structured(
        self, step: str, prompt: Prompt, schema: type[M], **values: str
    ) -> LLMResult[M]:
        messages = prompt.render(**values)
        key = self._key(
            self.chat,
            self.model,
            prompt,
            messages,
            schema=_json_schema(schema),
            method=self.structured_method,
        )
        replayed = self._replay(key, step)
        if replayed is not None:
            return LLMResult(value=schema.model_validate(replayed[0]), usage=replayed[1])
        runnable = self._runnable(schema)
        detail = ""
        spent: list[CallUsage] = []
        for _attempt in range(self.parse_attempts):
            t0 = time.perf_counter()
            try:
                out = await runnable.ainvoke(messages)
            except Exception as exc:
                raise LLMCallError(f"{step}: the LLM endpoint failed: {exc}") from exc
            assert isinstance(out, dict)
            usage = self._usage(step, prompt, self.model, messages, out.get("raw"), t0)
            spent.append(usage)
            parsed = out.get("parsed")
            if isinstance(parsed, schema):
                total = usage.model_copy(
                    update={
                        "prompt_tokens": sum(u.prompt_tokens for u in spent),
                        "completion_tokens": sum(u.completion_tokens for u in spent),
                        "cost_usd": sum(u.cost_usd for u in spent),
                        "latency_s": sum(u.latency_s for u in spent),
                    }
                )
                self._store(key, parsed.model_dump(mode="json"), total)
                return LLMResult(value=parsed, usage=total)
            detail = str(out.get("parsing_error") or f"no {schema.__name__} in the reply")
        raise StructuredOutputError(schema.__name__, detail, self.parse_attempts)

    async def expand(self, question: str, n: int) -> LLMResult[list[str]]:
        """Ask for sub-questions as a Questions object."""
        result = await self._structured("expand", EXPAND, Questions, question=question, n=str(n))
        return LLMResult(value=result.value.questions[:n], usage=result.usage)

    async def analyze(
        self, question: str, documents: Sequence[Document], searched: Sequence[str]
    ) -> LLMResult[SufficiencyDecision]:
        """Ask for a SufficiencyDecision."""
        return await self._structured(
            "analyze",
            ANALYZE,
            SufficiencyDecision,
            question=question,
            searched="\n".join(searched) or "(nothing)",
            passages=format_passages(documents),
            max_queries=str(analyzer.MAX_NEW_QUERIES),
        )

    async def generate(
        self, question: str, documents: Sequence[Document], history: History = ()
    ) -> LLMResult[GeneratedAnswer]:
        """Ask for a GeneratedAnswer; ids not among the documents are dropped."""
        result = await self._structured(
            "generate",
            GENERATE,
            GeneratedAnswer,
            question=question,
            passages=format_passages(documents),
            history=format_history(history) + "\n\n" if history else "",
        )
        known = {d.passage_id for d in documents}
        answer = result.value.model_copy(
            update={"source_ids": [i for i in result.value.source_ids if i in known]}
        )
        return LLMResult(value=answer, usage=result.usage)

    async def rewrite(self, question: str, history: History) -> LLMResult[str]:
        """Plain-text rewrite with the (possibly cheaper) rewrite model."""
        messages = REWRITE.render(question=question, history=format_history(history))
        key = self._key(self.rewrite_chat, self.rewrite_model, REWRITE, messages)
        replayed = self._replay(key, "rewrite")
        if replayed is not None:
            return LLMResult(value=str(replayed[0]) or question, usage=replayed[1])
        t0 = time.perf_counter()
        try:
            raw = await self.rewrite_chat.ainvoke(messages)
        except Exception as exc:
            raise LLMCallError(f"rewrite: the LLM endpoint failed: {exc}") from exc
        text = _raw_text(raw).strip().strip('"').strip()
        usage = self._usage("rewrite", REWRITE, self.rewrite_model, messages, raw, t0)
        self._store(key, text, usage)
        return LLMResult(value=text or question, usage=usage)

    async def classify(self, question: str) -> LLMResult[QueryClass]:
        """Ask for a QueryClass."""
        return await self._structured("classify", CLASSIFY, QueryClass, question=question)

    async def assess(
        self, question: str, documents: Sequence[Document]
    ) -> LLMResult[ConfidenceAssessment]:
        """Ask for a ConfidenceAssessment (a confidence outside 0-1 is a parse failure)."""
        return await self._structured(
            "assess",
            ASSESS,
            ConfidenceAssessment,
            question=question,
            passages=format_passages(documents) or "(none)",
            max_missing=str(MAX_QUERIES),
        )


@functools.cache
def _json_schema(schema: type[BaseModel]) -> dict[str, Any]:
    return schema.model_json_schema()


def _raw_text(raw: Any) -> str:
    if isinstance(raw, AIMessage):
        calls = " ".join(str(c.get("args")) for c in raw.tool_calls)
        return f"{raw.text}{calls}"
    return "" if raw is None else str(raw)
