"""The structured-call client behind every LLM step, and how to build it for an endpoint."""

from caprag.llm.client import StepFailedError, StructuredClient
from caprag.llm.openai import build_openai_client

__all__ = ["StepFailedError", "StructuredClient", "build_openai_client"]
