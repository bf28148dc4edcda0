"""Secrets are read from the environment when a client is built and never stored or echoed.

Configs name the *variable* that holds a key (`api_key_env: OPENAI_API_KEY`), not the key, so
nothing that logs or hashes a config can see one. As a second line of defence every text that
leaves the process through an error, a log or a stored row goes through `redact`, which blanks
the value of any secret-named environment variable (and any key registered at run time), and
`redact_config` blanks secret-named entries of a config before it is logged or hashed.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "[redacted]"
SECRET_NAME = re.compile(
    r"(^|[_.-])(api[_-]?key|secret|token|password|passwd|credentials?)($|[_.-])", re.IGNORECASE
)
"""Names of settings and environment variables whose values are secrets."""
MIN_SECRET_CHARS = 6
"""Shorter values (e.g. 'x' for a local server that ignores the key) are not hunted in text."""
_TOKEN_LIKE = re.compile(r"\b(sk|rk|pk)-[A-Za-z0-9_\-]{16,}")
"""Provider key shapes (OpenAI's sk-...), blanked even when no variable holds them."""

_registered: set[str] = set()


def is_secret_name(name: str) -> bool:
    """Whether a setting or variable called `name` holds a secret."""
    return bool(SECRET_NAME.search(name)) and not name.lower().endswith("_env")


def register(value: str | None) -> None:
    """Remember a secret that did not come from a secret-named variable, so `redact` hides it."""
    if value and len(value) >= MIN_SECRET_CHARS:
        _registered.add(value)


def env_secret(variable: str) -> str | None:
    """The value of the environment variable `variable` (None when unset or empty)."""
    return os.environ.get(variable) or None


def _known() -> list[str]:
    values = set(_registered)
    values.update(
        value
        for name, value in os.environ.items()
        if is_secret_name(name) and len(value) >= MIN_SECRET_CHARS
    )
    return sorted(values, key=len, reverse=True)


def redact(text: str) -> str:
    """`text` with every known secret value (and provider-shaped key) replaced by [redacted]."""
    if not text:
        return text
    for value in _known():
        if value in text:
            text = text.replace(value, REDACTED)
    return _TOKEN_LIKE.sub(REDACTED, text)


def redact_records(records: Any) -> Any:
    """JSON-shaped data (rows, responses) with every known secret value blanked."""
    return json.loads(redact(json.dumps(records)))


def redact_config(config: Any, *, scan_text: bool = True) -> Any:
    """A copy of a (nested) config whose secret-named entries hold [redacted] instead of values;
    with `scan_text` its strings also go through `redact`. Without it the result depends on the
    config alone (what a config hash needs: a rotated key must not change it)."""
    if isinstance(config, Mapping):
        return {
            key: (
                REDACTED
                if is_secret_name(str(key)) and value not in (None, "")
                else redact_config(value, scan_text=scan_text)
            )
            for key, value in config.items()
        }
    if isinstance(config, list | tuple):
        return [redact_config(item, scan_text=scan_text) for item in config]
    if isinstance(config, str) and scan_text:
        return redact(config)
    return config


class RedactingFilter(logging.Filter):
    """Blank every known secret in a log record (message, arguments, traceback, stack) before
    any handler writes it. Always lets the record through."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = _FORMATTER.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


_FORMATTER = logging.Formatter()
REDACTION = RedactingFilter()
"""The one filter: on the root's handlers, on every logger below and on their handlers."""
LOGGERS = (
    "caprag",
    "experiments",
    "instructor",
    "openai",
    "httpx",
    "httpcore",
    "ragas",
    "langchain",
    "langchain_core",
    "langchain_openai",
    "langgraph",
    "mlflow",
    "uvicorn",
    "uvicorn.error",
    "uvicorn.access",
    "chromadb",
    "hydra",
    "py.warnings",
)
"""Loggers of the project and the libraries it calls (a child logger's records reach handlers
above it without the parent logger's filters, so the handlers carry the filter too)."""


def install_log_redaction() -> None:
    """Put REDACTION on every handler configured now (the root's, Hydra's run.log, uvicorn's)
    and on the project's and libraries' loggers; call again after logging is (re)configured."""
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in LOGGERS)]
    handlers = [h for logger in loggers for h in logger.handlers]
    if logging.lastResort is not None:
        handlers.append(logging.lastResort)
    for target in (*loggers, *handlers):
        if REDACTION not in target.filters:
            target.addFilter(REDACTION)
