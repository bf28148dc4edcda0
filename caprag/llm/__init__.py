"""LLM backends behind one interface (`LLM`): `offline` (default) and `openai`."""

from caprag.llm.base import LLM, LLMResult
from caprag.llm.chat import ChatModelLLM
from caprag.llm.offline import OfflineLLM
from caprag.llm.openai import build_openai_llm

__all__ = ["LLM", "ChatModelLLM", "LLMResult", "OfflineLLM", "build_openai_llm"]
