"""The structured-call client behind every LLM step, and how to build it for an endpoint."""

from typing import TYPE_CHECKING, Any

from caprag.llm.client import StepFailedError, StructuredClient

if TYPE_CHECKING:
    from caprag.llm.openai import build_openai_client

__all__ = ["StepFailedError", "StructuredClient", "build_openai_client"]


def __getattr__(name: str) -> Any:
    """build_openai_client on first use: the openai SDK and langchain-openai (~1.5 CPU-s to
    import) are needed by llm=openai only, not by an offline `ask` or a settings check."""
    if name == "build_openai_client":
        from caprag.llm.openai import build_openai_client

        return build_openai_client
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
