"""The `openai` backend: any OpenAI-compatible endpoint, configured through langchain-openai.

A call goes out as LangChain would send it (the same request body, built by ChatOpenAI) through
the openai SDK's client (its retries, timeouts and errors), and its reply becomes the message
LangChain would make; only LangChain's runnable layer (callbacks, config merging, a thread hop per
reply) is left out: it cost more CPU than the rest of a call (5 ms against 1.5 ms), and at many
questions in flight the harness waited on that CPU instead of on the model. Requests go through
the SDK's aiohttp transport, one per event loop: httpx's connection pool scans every connection on
every request, which cost ~3 ms of CPU per call at 64 in flight.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from typing import Any, Literal, cast

import httpx
import openai
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.output_parsers import BaseOutputParser, JsonOutputParser
from langchain_core.output_parsers.openai_tools import JsonOutputKeyToolsParser
from langchain_core.outputs import ChatGeneration
from langchain_openai import ChatOpenAI
from openai.types.chat import ChatCompletion

from caprag.errors import MissingAPIKeyError
from caprag.llm.cache import ResponseCache
from caprag.llm.client import Invocable, StructuredClient, with_cap
from caprag.secrets import env_secret, register

REQUEST_OPTIONS = {"extra_body": "extra_json", "extra_headers": "headers", "extra_query": "params"}
"""Payload keys the SDK's `create` takes as request options, and the option each becomes."""
BINDING_ONLY = ("ls_structured_output_format",)
"""Bound arguments LangChain keeps for tracing and never sends."""


class OpenAICalls:
    """Chat completions of a ChatOpenAI sent without LangChain's runnable layer."""

    def __init__(self, chat: ChatOpenAI) -> None:
        self.chat = chat
        self._clients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[openai.AsyncOpenAI, AsyncIterator[None]]
        ] = weakref.WeakKeyDictionary()

    async def client(self) -> openai.AsyncOpenAI:
        """The chat model's SDK client over aiohttp, one per event loop (a connection belongs to
        the loop that opened it); closed when its loop shuts down."""
        loop = asyncio.get_running_loop()
        if loop not in self._clients:
            root: openai.AsyncOpenAI = self.chat.root_async_client
            client = root.copy(http_client=openai.DefaultAioHttpClient(timeout=root.timeout))
            closer = _closed_at_shutdown(client)
            await anext(closer)  # the loop closes it (shutdown_asyncgens) when it ends
            self._clients[loop] = (client, closer)
        return self._clients[loop][0]

    def structured(self, schema: dict[str, Any], method: str) -> Invocable:
        """Calls with the arguments `with_structured_output(schema, method)` binds, parsed by
        the parser it uses; a parser error is returned as `parsing_error`, as with include_raw."""
        how = cast(Literal["function_calling", "json_mode", "json_schema"], method)
        runnable: Any = self.chat.with_structured_output(schema, method=how, include_raw=True)
        bound = dict(runnable.first.steps__["raw"].kwargs)  # RunnableMap(raw=model.bind(...))
        parser: BaseOutputParser[Any] = JsonOutputParser()
        if method == "function_calling":
            name = bound["tool_choice"]["function"]["name"]
            parser = JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
        return _Structured(self, {k: v for k, v in bound.items() if k not in BINDING_ONLY}, parser)

    def plain(self) -> Invocable:
        """Calls with the model's own parameters only."""
        return _Plain(self)

    def capped(self, max_tokens: int) -> OpenAICalls:
        """The same calls through a copy of the chat model with another output cap."""
        return OpenAICalls(with_cap(self.chat, max_tokens))

    async def complete(self, messages: list[BaseMessage], **bound: Any) -> AIMessage:
        """One chat completion: the reply as LangChain's message, usage and finish reason in it.

        A request with a response format is read as the SDK's `parse` reads it (LangChain sends
        those through it): a reply stopped at the output cap raises LengthFinishReasonError, one
        stopped by the content filter ContentFilterFinishReasonError."""
        payload = self.chat._get_request_payload(messages, **bound)
        options: dict[str, Any] = {
            option: payload.pop(key) for key, option in REQUEST_OPTIONS.items() if key in payload
        }
        if "timeout" in payload:
            options["timeout"] = payload.pop("timeout")
        client = await self.client()
        response = await client.post(
            "/chat/completions",
            body=payload,
            cast_to=httpx.Response,
            options=cast(Any, options),
        )
        data = response.json()
        if "response_format" in payload:
            _check_finish(data)
        result = self.chat._create_chat_result(data)
        generation = result.generations[0]
        message = generation.message
        assert isinstance(message, AIMessage)
        # BaseChatModel adds the generation's info (finish_reason) to the message's metadata.
        message.response_metadata = {
            **(generation.generation_info or {}),
            **message.response_metadata,
        }
        return message


async def _closed_at_shutdown(client: openai.AsyncOpenAI) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await client.close()


def _check_finish(data: dict[str, Any]) -> None:
    """Raise what the SDK's `parse` raises for a reply cut at the cap or by the content filter."""
    for choice in data.get("choices") or []:
        reason = choice.get("finish_reason") if isinstance(choice, dict) else None
        if reason == "length":
            raise openai.LengthFinishReasonError(completion=ChatCompletion.model_validate(data))
        if reason == "content_filter":
            raise openai.ContentFilterFinishReasonError()


class _Plain:
    def __init__(self, calls: OpenAICalls) -> None:
        self.calls = calls

    async def ainvoke(self, messages: list[BaseMessage]) -> AIMessage:
        return await self.calls.complete(messages)


class _Structured:
    def __init__(
        self, calls: OpenAICalls, bound: dict[str, Any], parser: BaseOutputParser[Any]
    ) -> None:
        self.calls = calls
        self.bound = bound
        self.parser = parser

    async def ainvoke(self, messages: list[BaseMessage]) -> dict[str, Any]:
        raw = await self.calls.complete(messages, **self.bound)
        try:
            parsed = self.parser.parse_result([ChatGeneration(message=raw)])
        except Exception as exc:  # include_raw's fallback: any parser error is returned
            return {"raw": raw, "parsed": None, "parsing_error": exc}
        return {"raw": raw, "parsed": parsed, "parsing_error": None}


DEFAULT_KEY_VARIABLE = "OPENAI_API_KEY"


def resolve_api_key(api_key: str | None, api_key_env: str | None, who: str) -> str:
    """The key given in code, else the value of the variable `api_key_env` (read now, never from
    a config file, so no config that is logged or hashed holds it)."""
    key = api_key or (env_secret(api_key_env) if api_key_env else None)
    if not key:
        variable = api_key_env or DEFAULT_KEY_VARIABLE
        raise MissingAPIKeyError(
            f"{who} needs an API key: set {variable} (any value for a local server that ignores "
            "it) and OPENAI_BASE_URL for a non-OpenAI endpoint"
        )
    register(key)
    return key


def openai_chat(
    model: str,
    *,
    api_key: str | None,
    base_url: str | None = None,
    max_output_tokens: int = 512,
    timeout_s: float = 30.0,
    max_retries: int = 3,
    temperature: float = 0.0,
    seed: int | None = None,
) -> ChatOpenAI:
    """A ChatOpenAI whose output cap every server honours and whose client retries with backoff."""
    if not api_key:
        raise MissingAPIKeyError(
            "the openai backend needs an API key: set OPENAI_API_KEY (any value for a local "
            "server that ignores it)"
        )
    return ChatOpenAI(
        model=model,
        # Its own connection pool: langchain-openai otherwise shares one per base URL across the
        # process, and connections opened in one event loop (one run) fail in the next, which
        # resends requests (billed twice).
        http_async_client=httpx.AsyncClient(timeout=timeout_s),
        api_key=api_key,  # type: ignore[arg-type]
        base_url=base_url,
        temperature=temperature,
        seed=seed,
        timeout=timeout_s,
        max_retries=max_retries,  # the openai client backs off on 408/409/429/5xx and timeouts
        extra_body={"max_tokens": max_output_tokens},
    )


def build_openai_client(
    model: str = "gpt-4o-mini",
    *,
    api_key: str | None = None,
    api_key_env: str | None = DEFAULT_KEY_VARIABLE,
    base_url: str | None = None,
    structured_method: str = "function_calling",
    max_output_tokens: int = 512,
    timeout_s: float = 30.0,
    max_retries: int = 3,
    parse_attempts: int = 3,
    temperature: float = 0.0,
    seed: int | None = None,
    cache: ResponseCache | None = None,
) -> StructuredClient:
    """The structured-call client of an OpenAI-compatible endpoint; fails at once without a key.

    The key is `api_key` when code passes one, else read from the environment variable named by
    `api_key_env` (configs name the variable, never the key).

    `timeout_s` bounds one call, the SDK's retries of 429/5xx included (LLMTimeoutError past it).
    `seed` is sent with every request (servers that support it sample reproducibly) and is part
    of the cache key, so repeats with different seeds are different calls.
    """
    chat = openai_chat(
        model,
        api_key=resolve_api_key(api_key, api_key_env, "the openai backend"),
        base_url=base_url,
        max_output_tokens=max_output_tokens,
        timeout_s=timeout_s,
        max_retries=max_retries,
        temperature=temperature,
        seed=seed,
    )
    return StructuredClient(
        chat,
        model,
        structured_method=structured_method,
        parse_attempts=parse_attempts,
        backend="openai",
        cache=cache,
        timeout_s=timeout_s,
        calls=OpenAICalls(chat),
    )
