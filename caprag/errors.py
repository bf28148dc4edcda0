"""Named errors: every failure a user can cause says what was wrong and where."""

from __future__ import annotations

from pathlib import Path


class CapragError(Exception):
    """Base class of every error caprag raises on purpose."""


class ConfigError(CapragError):
    """A setting is missing or has a value outside what is allowed."""


class OptionError(ConfigError, ValueError):
    """A strategy's option has a value outside what it allows (a ValueError too: what the
    strategies' constructors raised before their options had a model)."""


class MissingAPIKeyError(ConfigError):
    """The OpenAI-compatible backend was chosen but no API key is set."""


class BookFormatError(CapragError):
    """A rulebook file does not follow the corpus format."""

    def __init__(self, path: Path | str, line: int, message: str) -> None:
        self.path = Path(path)
        self.line = line
        self.message = message
        super().__init__(f"{self.path}:{line}: {message}")


class VectorStoreError(CapragError):
    """The vector store cannot be opened or written."""


class EmptyQuestionError(CapragError, ValueError):
    """The question is empty or only whitespace."""


class StructuredOutputError(CapragError):
    """The LLM's reply could not be parsed into the expected structure."""

    def __init__(self, schema: str, detail: str, attempts: int) -> None:
        self.schema = schema
        self.detail = detail
        self.attempts = attempts
        super().__init__(
            f"could not parse the LLM reply as {schema} after {attempts} attempt(s): {detail}"
        )


class LLMCallError(CapragError):
    """The LLM endpoint failed (after its retries) for a reason other than parsing."""


class NoAnswerError(CapragError):
    """The generator's reply could not be used, so the turn has no answer."""


class LLMTimeoutError(LLMCallError):
    """An LLM call did not finish within its time limit (the API answers 504)."""


class ThreadBusyError(CapragError):
    """Another turn of the same conversation is still being answered (the API answers 409)."""
