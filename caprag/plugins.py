"""Your own modules, imported at start-up: CAPRAG_PLUGINS=mypkg.retriever,mypkg.strategy.

A plugin module registers what it adds when imported (`register_retriever(...)`,
`register_strategy(...)`); then CAPRAG_RETRIEVER / RETRIEVAL_STRATEGY, the harness's
`retriever=NAME` / `strategy=NAME` and the dashboard offer it like a built-in one. The settings
(API, CLI, ingest) import the plugins before they validate; the harness and the dashboard when
`experiments` is imported, before Hydra composes a config.
"""

from __future__ import annotations

import importlib
import os

from caprag.errors import ConfigError

PLUGINS_ENV = "CAPRAG_PLUGINS"
"""Comma-separated module names to import at start-up."""


def plugin_modules(spec: str | None = None) -> list[str]:
    """The module names of `spec` (default: CAPRAG_PLUGINS), blanks dropped."""
    text = os.environ.get(PLUGINS_ENV, "") if spec is None else spec
    return [name.strip() for name in text.split(",") if name.strip()]


def load_plugins(spec: str | None = None) -> list[str]:
    """Import every plugin module (each once per process: Python keeps imported modules) and
    return their names; a module that cannot be imported is a ConfigError naming it."""
    names = plugin_modules(spec)
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"{PLUGINS_ENV}={name!r}: cannot import it: {exc}") from exc
    return names
