"""The `openai` backend: any OpenAI-compatible endpoint, configured through langchain-openai.

Calls go through LangChain's public path: `ChatOpenAI.with_structured_output(include_raw=True)`
for structured replies and the chat model itself for text (caprag.llm.client.LangChainCalls);
the openai SDK underneath does the retries (429 with Retry-After, 5xx), timeouts and errors.
What that costs: LangChain's runnable layer takes ~5 ms of CPU per call (against ~1.5 ms for a
hand-built request), small beside a provider's ~1 s per call (reports/bench.md, `provider`).
"""

from __future__ import annotations

import httpx
from langchain_openai import ChatOpenAI

from caprag.errors import MissingAPIKeyError
from caprag.llm.cache import ResponseCache
from caprag.llm.client import StructuredClient
from caprag.secrets import env_secret, register

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
    )
