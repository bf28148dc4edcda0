"""The structured-call client: one chat model behind every LLM step.

It renders nothing and decides nothing: a step hands it the messages (its prompt, filled) and an
output schema; the client sends them, parses the reply (retrying a reply that does not parse),
counts usage from the server's `usage` (the tokenizer where absent), prices it, keeps the
messages and the raw reply for the trace, and answers identical calls from the response cache.
Transport retries (429, 5xx, timeouts) belong to the chat model's own client; a reply that
arrives but cannot be read (a body cut short, no `choices`) is retried here like any reply that
does not parse. One call, its transport retries included, is bounded by `timeout_s`
(LLMTimeoutError). Error texts never carry a secret (caprag.secrets.redact).

How a call reaches the chat model is its `calls` (ChatCalls): LangChain's public runnables,
`with_structured_output(include_raw=True)` and the model itself, for every backend.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol, TypeVar

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from pydantic import BaseModel

from caprag.errors import LLMCallError, LLMTimeoutError, StructuredOutputError
from caprag.llm.budget import model_schema, prompt_values, retry_cap
from caprag.llm.cache import ResponseCache, cache_key
from caprag.llm.prompt import Prompt, as_sent
from caprag.llm.usage import count_tokens, price, total_cost
from caprag.schemas import CallUsage
from caprag.secrets import redact, redact_records

M = TypeVar("M", bound=BaseModel)


class StepFailedError(StructuredOutputError):
    """A reply never parsed; carries the usage of every attempt (tokens were spent)."""

    def __init__(self, schema: str, detail: str, attempts: int, usage: CallUsage) -> None:
        super().__init__(schema, detail, attempts)
        self.usage = usage


class Invocable(Protocol):
    """What a call is sent through: `ainvoke(messages)`."""

    async def ainvoke(self, messages: list[BaseMessage], /) -> Any:
        """A plain call's reply (an AIMessage); a structured call's {raw, parsed, parsing_error}."""
        ...


class ChatCalls(Protocol):
    """How the client reaches its chat model."""

    def structured(self, schema: dict[str, Any], method: str) -> Invocable:
        """Calls whose reply is parsed as JSON fitting `schema`: {raw, parsed, parsing_error}."""
        ...

    def plain(self) -> Invocable:
        """Calls whose reply is the message itself."""
        ...

    def capped(self, max_tokens: int) -> ChatCalls:
        """The same calls with another output cap (a reply cut at the cap is retried so)."""
        ...


class LangChainCalls:
    """Through LangChain's runnables: `with_structured_output(include_raw=True)` and the model."""

    def __init__(self, chat: BaseChatModel) -> None:
        self.chat = chat

    def structured(self, schema: dict[str, Any], method: str) -> Invocable:
        """The structured-output runnable of the schema."""
        runnable: Invocable = self.chat.with_structured_output(
            schema, method=method, include_raw=True
        )
        return runnable

    def plain(self) -> Invocable:
        """The chat model."""
        return self.chat

    def capped(self, max_tokens: int) -> LangChainCalls:
        """Through a copy of the chat model with another output cap."""
        return LangChainCalls(with_cap(self.chat, max_tokens))


def output_cap(chat: BaseChatModel) -> int | None:
    """A chat model's output cap: the `max_tokens` it sends in its request body (how the openai
    backend caps every server), else its `max_tokens` field; None when it has none."""
    extra = getattr(chat, "extra_body", None)
    if isinstance(extra, dict) and isinstance(extra.get("max_tokens"), int):
        return int(extra["max_tokens"])
    cap = getattr(chat, "max_tokens", None)
    return int(cap) if isinstance(cap, int) else None


def with_cap(chat: BaseChatModel, max_tokens: int) -> Any:
    """A copy of `chat` whose output cap is `max_tokens`, set where `output_cap` reads it."""
    extra = getattr(chat, "extra_body", None)
    if isinstance(extra, dict) and "max_tokens" in extra:
        return chat.model_copy(update={"extra_body": {**extra, "max_tokens": max_tokens}})
    return chat.model_copy(update={"max_tokens": max_tokens})


class StructuredClient:
    """Structured replies (JSON fitting a pydantic schema) and plain text from one chat model."""

    def __init__(
        self,
        chat: BaseChatModel,
        model: str,
        *,
        structured_method: str = "function_calling",
        parse_attempts: int = 3,
        backend: str = "chat",
        cache: ResponseCache | None = None,
        timeout_s: float | None = None,
        calls: ChatCalls | None = None,
        max_output_tokens: int | None = None,
    ) -> None:
        if parse_attempts < 1:
            raise ValueError("parse_attempts must be at least 1")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError("timeout_s must be positive (or None for no bound)")
        self.timeout_s = timeout_s
        self.chat = chat
        self.model = model
        self.structured_method = structured_method
        self.parse_attempts = parse_attempts
        self.backend = backend
        self.cache = cache
        self.calls = calls or LangChainCalls(chat)
        self.max_output_tokens = max_output_tokens or output_cap(chat)
        """The output cap every schema is fitted to (caprag.llm.budget); None: unknown, the
        schemas' own bounds."""
        self._runnables: dict[tuple[type[BaseModel], int | None], Invocable] = {}

    def _key(self, prompt: Prompt, messages: list[BaseMessage], **extra: Any) -> str:
        """What shapes a reply: provider and endpoint, model, every message, the chat model's
        parameters (temperature, seed, output cap...), the output schema and the prompt version."""
        return cache_key(
            provider=self.backend,
            endpoint=getattr(self.chat, "openai_api_base", None),
            model=self.model,
            messages=[(m.type, m.content) for m in messages],
            params=getattr(self.chat, "_identifying_params", {}),
            prompt_version=prompt.version,
            **extra,
        )

    def _replay(self, key: str, step: str) -> tuple[Any, CallUsage] | None:
        """A cached reply and its original usage, marked cached (no time spent, no money)."""
        if self.cache is None:
            return None
        hit = self.cache.get(key)
        if hit is None:
            return None
        usage = CallUsage.model_validate(hit["usage"]).model_copy(
            update={"cached": True, "latency_s": 0.0, "started_at": time.time(), "step": step}
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

    def schema(self, schema: type[BaseModel]) -> dict[str, Any]:
        """The JSON schema sent for `schema`: its strings and lists bounded so its longest valid
        reply fits the output cap (caprag.llm.budget)."""
        return model_schema(schema, self.max_output_tokens)

    def lengths(self, prompt: Prompt, schema: type[BaseModel]) -> dict[str, str]:
        """The field lengths `prompt` tells the model (its `{<field>_chars}`/`{<field>_items}`
        placeholders), as the schema sent bounds them."""
        return prompt_values(schema, self.max_output_tokens, prompt.fields)

    def _runnable(self, schema: type[BaseModel], cap: int | None = None) -> Invocable:
        """The structured calls of a schema's fitted JSON schema (parsed as JSON, validated by
        `structured`), at the output cap `cap` (None: the chat model's), built once: building
        them costs more CPU than the rest of a call's work."""
        if (schema, cap) not in self._runnables:
            calls = self.calls if cap is None else self.calls.capped(cap)
            self._runnables[(schema, cap)] = calls.structured(
                self.schema(schema), self.structured_method
            )
        return self._runnables[(schema, cap)]

    def _usage(
        self, step: str, prompt: Prompt, messages: list[BaseMessage], raw: Any, t0: float
    ) -> CallUsage:
        reported = getattr(raw, "usage_metadata", None) if isinstance(raw, AIMessage) else None
        reply = raw_text(raw)  # counted as the model sent it; kept with secrets blanked
        if reported:
            prompt_tokens = int(reported.get("input_tokens", 0))
            completion_tokens = int(reported.get("output_tokens", 0))
            counted = "reported"
        else:
            prompt_tokens = sum(count_tokens(str(m.content)) for m in messages)
            completion_tokens = count_tokens(reply)
            counted = "tokenizer"
        latency_s = time.perf_counter() - t0
        return CallUsage(
            step=step,
            model=self.model,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost_usd=price(self.model, prompt_tokens, completion_tokens),
            latency_s=latency_s,
            started_at=time.time() - latency_s,
            counted=counted,  # type: ignore[arg-type]
            prompt_version=prompt.version,
            messages=redact_records(as_sent(messages)),
            reply=redact(reply),
        )

    async def structured(
        self, step: str, prompt: Prompt, schema: type[M], **values: str
    ) -> tuple[M, CallUsage]:
        """The reply parsed as `schema`, and the usage of every attempt it took.

        Raises StepFailedError (with that usage) when no attempt parsed, LLMCallError when the
        endpoint failed.
        """
        messages = prompt.render(**values)
        key = self._key(prompt, messages, schema=self.schema(schema), method=self.structured_method)
        replayed = self._replay(key, step)
        if replayed is not None:
            return schema.model_validate(replayed[0]), replayed[1]
        runnable = self._runnable(schema)
        detail = ""
        spent: list[CallUsage] = []
        notes: list[str] = []
        larger = retry_cap(schema, self.max_output_tokens)
        attempt = 0
        while attempt < self.parse_attempts:
            attempt += 1
            t0 = time.perf_counter()
            try:
                out = await self._send(step, runnable, messages)
            except _UnreadableReplyError as unreadable:
                # json_schema mode raises on a reply cut by the output cap, and the SDK on a
                # body cut short or without choices: unparseable replies like any other, so
                # they are retried and recorded.
                cut = _cut_at_cap(unreadable.cause)
                out = {"raw": cut, "parsed": None, "parsing_error": CUT_AT_CAP}
                if cut is None:
                    out["parsing_error"] = f"unreadable reply: {unreadable.cause}"
            assert isinstance(out, dict)
            raw = out.get("raw")
            spent.append(self._usage(step, prompt, messages, raw, t0))
            # The runnable parses JSON only; the schema is checked here, so a reply that breaks
            # it (a confidence of -1) is an unparseable reply with its raw text and usage, not
            # an exception from inside the client.
            try:
                if out.get("parsing_error") is not None or not isinstance(out.get("parsed"), dict):
                    raise ValueError(
                        out.get("parsing_error") or f"no {schema.__name__} in the reply"
                    )
                # A reply that repeats a secret (the key) is blanked before anything keeps it.
                value = schema.model_validate(redact_records(out["parsed"]))
            except ValueError as exc:  # pydantic's ValidationError is a ValueError
                detail = _why(exc, raw)
                if detail == CUT_AT_CAP and larger is not None:
                    # Once per call, and on top of the parse attempts: the bounded schema should
                    # have fitted, so a cut reply says the model spent more tokens than counted.
                    notes.append(
                        f"cut at the {self.max_output_tokens}-token output cap: retried with "
                        f"{larger}"
                    )
                    runnable = self._runnable(schema, larger)
                    larger = None
                    attempt -= 1
                continue
            total = _merged(spent).model_copy(update={"notes": notes})
            self._store(key, value.model_dump(mode="json"), total)
            return value, total
        failed = _merged(spent).model_copy(
            update={"error": f"unparseable reply: {detail}", "notes": notes}
        )
        raise StepFailedError(schema.__name__, detail, len(spent), failed)

    async def _send(self, step: str, runnable: Invocable, messages: list[BaseMessage]) -> Any:
        """One request (with the chat model's transport retries) within `timeout_s`.

        Raises LLMTimeoutError past the bound, LLMCallError when the endpoint failed (HTTP
        status, connection), _UnreadableReplyError when a reply came but could not be read."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await runnable.ainvoke(messages)
        except Exception as exc:
            raise _classified(step, exc, self.timeout_s) from exc

    async def text(self, step: str, prompt: Prompt, **values: str) -> tuple[str, CallUsage]:
        """A plain-text reply (stripped of quotes) and its usage."""
        messages = prompt.render(**values)
        key = self._key(prompt, messages)
        replayed = self._replay(key, step)
        if replayed is not None:
            return str(replayed[0]), replayed[1]
        for attempt in range(1, self.parse_attempts + 1):
            t0 = time.perf_counter()
            try:
                raw = await self._send(step, self.calls.plain(), messages)
                break
            except _UnreadableReplyError as unreadable:  # retried like an unparseable reply
                if attempt == self.parse_attempts:
                    raise LLMCallError(
                        redact(
                            f"{step}: no readable reply in {attempt} attempt(s): {unreadable.cause}"
                        )
                    ) from unreadable.cause
        text = redact(raw_text(raw).strip().strip('"').strip())
        usage = self._usage(step, prompt, messages, raw, t0)
        self._store(key, text, usage)
        return text, usage


class _UnreadableReplyError(Exception):
    """A reply arrived but could not be read (cut at the cap, cut short, no choices)."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


ENDPOINT_FAILURES = {"APIStatusError", "APIConnectionError", "HTTPError", "OSError"}
"""Exception classes (by name, in the MRO: the openai SDK's and httpx's) that mean the endpoint
failed rather than that its reply was unreadable."""
TIMEOUTS = {"APITimeoutError", "TimeoutException", "TimeoutError"}


def _classified(step: str, exc: Exception, bound: float | None) -> Exception:
    """The error a failed request becomes: a timeout, an endpoint failure or an unreadable reply
    (every message redacted: providers echo keys in their errors)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & TIMEOUTS:
        limit = (
            f" within {bound:g} s" if bound is not None and isinstance(exc, TimeoutError) else ""
        )
        return LLMTimeoutError(redact(f"{step}: the LLM call did not finish{limit}: {exc}"))
    if names & ENDPOINT_FAILURES:
        return LLMCallError(redact(f"{step}: the LLM endpoint failed: {exc}"))
    return _UnreadableReplyError(exc)


def _merged(spent: list[CallUsage]) -> CallUsage:
    """One usage for all attempts of a call: tokens, cost and time added, the last reply kept."""
    return spent[-1].model_copy(
        update={
            "prompt_tokens": sum(u.prompt_tokens for u in spent),
            "completion_tokens": sum(u.completion_tokens for u in spent),
            "cost_usd": total_cost(u.cost_usd for u in spent),
            "latency_s": sum(u.latency_s for u in spent),
            "started_at": spent[0].started_at,
            "attempts": len(spent),
        }
    )


CUT_AT_CAP = "the reply reached the output cap before its JSON was complete"


def _cut_at_cap(exc: Exception) -> AIMessage | None:
    """The reply of a completion the endpoint stopped at the output cap (the openai SDK's
    LengthFinishReasonError), as a message with its usage; None for any other error."""
    completion = getattr(exc, "completion", None)
    if type(exc).__name__ != "LengthFinishReasonError" or completion is None:
        return None
    usage = getattr(completion, "usage", None)
    content = completion.choices[0].message.content if completion.choices else ""
    return AIMessage(
        content=content or "",
        usage_metadata={
            "input_tokens": int(getattr(usage, "prompt_tokens", 0) or 0),
            "output_tokens": int(getattr(usage, "completion_tokens", 0) or 0),
            "total_tokens": int(getattr(usage, "total_tokens", 0) or 0),
        }
        if usage is not None
        else None,
        response_metadata={"finish_reason": "length"},
    )


def _why(exc: Exception, raw: Any) -> str:
    """Why a reply was unusable, in one line: cut at the output cap, or the parser's words."""
    metadata = getattr(raw, "response_metadata", None) or {}
    if metadata.get("finish_reason") == "length":
        return CUT_AT_CAP
    return redact(" ".join(str(exc).split())[:500])


def raw_text(raw: Any) -> str:
    """A reply as text: its content, then the arguments of any tool call."""
    if isinstance(raw, AIMessage):
        calls = " ".join(str(c.get("args")) for c in [*raw.tool_calls, *raw.invalid_tool_calls])
        return f"{raw.text}{calls}"
    return "" if raw is None else str(raw)
