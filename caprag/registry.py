"""What the library's choices are named by: registries, the step roles and plug-ins.

- A `Registry`: the names of one kind of thing (retrievers, strategies, embeddings) and what each
  is, kept in one place that every list of choices reads (settings validation, Hydra groups, the
  dashboard). Adding one is a module and a `register` call.
- `ROLES`: the name a user picks rule or LLM by for each LLM step, read everywhere a role is
  named: `caprag.steps` (which implementation runs each step), the settings (a CAPRAG_<ROLE>
  variable per role), the harness (a top-level `<role>=` key per role) and the dashboard's Ask
  page. It is here, free of the steps' imports, so the settings can derive their fields from it
  without loading any model client.
- Plug-ins: your own modules, imported at start-up (CAPRAG_PLUGINS=mypkg.retriever,mypkg.strategy).
  A plug-in module registers what it adds when imported (`register_retriever(...)`,
  `register_strategy(...)`); then CAPRAG_RETRIEVER / RETRIEVAL_STRATEGY, the harness's
  `retriever=NAME` / `strategy=NAME` and the dashboard offer it like a built-in one. The settings
  (API, CLI, ingest) import the plug-ins before they validate; the harness and the dashboard when
  `experiments` is imported, before Hydra composes a config.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TypeVar

from caprag.errors import ConfigError

ROLES: dict[str, str] = {
    "expander": "expand",
    "analyzer": "analyze",
    "generator": "generate",
    "rewriter": "rewrite",
    "classifier": "classify",
    "confidence": "assess",
    "reasoner": "reason",
    "asker": "ask",
}
"""The name a user chooses an implementation by (Hydra key, CAPRAG_<NAME> variable) → its step."""

BUILT_IN: dict[str, tuple[str, ...]] = {
    "strategy": (
        "single",
        "multi-question",
        "multi-hop",
        "adaptive",
        "ircot",
        "self-ask",
        "iter-retgen",
    ),
    "retriever": ("dense", "bm25", "hybrid"),
    "embedding model": ("minilm", "wordllama"),
}
"""The built-in names of each registry, for the settings to check a name against without
importing the modules that register them (the strategies load LangGraph and the LLM client).
`tests/unit/test_registry.py` holds it against the registries themselves."""

PLUGINS_ENV = "CAPRAG_PLUGINS"
"""Comma-separated module names to import at start-up."""

T = TypeVar("T")

Listener = Callable[[str, T], None]

_REGISTRIES: list[Registry[object]] = []
_WATCHERS: list[tuple[str, Listener[object]]] = []


def watch(kind: str, listener: Listener[object]) -> None:
    """Call `listener(name, entry)` for every entry of the registry of `kind` (created now or
    later) and for each one registered later: a caller that must see registrations (Hydra's
    groups) need not import the module that holds the registry and its heavy dependencies."""
    _WATCHERS.append((kind, listener))
    for registry in list(_REGISTRIES):
        if registry.kind == kind:
            registry.on_register(listener)


class Registry(Mapping[str, T]):
    """Name → entry, in registration order; read it like a dict (`REG[name]`, `name in REG`)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        """What the entries are ('retriever', 'strategy'), for error messages."""
        self._entries: dict[str, T] = {}
        self._listeners: list[Listener[T]] = []
        _REGISTRIES.append(self)  # type: ignore[arg-type]  # watchers see entries as objects
        for watched, listener in _WATCHERS:
            if watched == kind:
                self.on_register(listener)

    def register(self, name: str, entry: T, *, replace: bool = False) -> T:
        """Add an entry under `name` (registering the same entry again changes nothing; another
        entry under a taken name needs `replace=True`) and tell every listener."""
        if not name or name != name.strip() or "," in name:
            raise ConfigError(f"a {self.kind} name needs to be a word, not {name!r}")
        known = self._entries.get(name)
        if known is not None and known != entry and not replace:
            raise ConfigError(
                f"{self.kind} {name!r} is registered already ({known!r}); pass replace=True to "
                "register another under that name"
            )
        self._entries[name] = entry
        for listener in list(self._listeners):
            listener(name, entry)
        return entry

    def unregister(self, name: str) -> T:
        """Remove an entry and return it (a plugin unloaded; listeners are not told)."""
        try:
            return self._entries.pop(name)
        except KeyError:
            raise ConfigError(f"{self.kind} {name!r} is not registered") from None

    def on_register(self, listener: Listener[T]) -> None:
        """Call `listener(name, entry)` for every entry now and for each one registered later."""
        self._listeners.append(listener)
        for name, entry in list(self._entries.items()):
            listener(name, entry)

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def allowed(self) -> str:
        """The registered names as a message lists them: 'a', 'b' or 'c' (sorted)."""
        return listed(self._entries)

    def check(self, name: str) -> str:
        """`name` when it is registered, else ValueError naming the allowed values (what a
        pydantic validator raises: the settings report it beside the variable)."""
        if name not in self._entries:
            raise ValueError(f"Input should be {self.allowed()}")
        return name

    def choose(self, name: str) -> T:
        """The entry of `name`; ConfigError naming the allowed values when there is none."""
        try:
            return self._entries[name]
        except KeyError:
            raise ConfigError(
                f"unknown {self.kind} {name!r}; allowed: {', '.join(sorted(self._entries))}"
            ) from None

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"


def known(kind: str) -> list[str]:
    """Every name of a kind: the built-in ones and what any registry of that kind holds now
    (plug-ins register when imported), in that order."""
    names = list(BUILT_IN.get(kind, ()))
    for registry in _REGISTRIES:
        if registry.kind == kind:
            names += [name for name in registry if name not in names]
    return names


def check_known(kind: str, name: str) -> str:
    """`name` when it is a known name of `kind` (`known`), else ValueError naming the allowed
    ones (what a pydantic validator raises: the settings report it beside the variable)."""
    names = known(kind)
    if name not in names:
        raise ValueError(f"Input should be {listed(names)}")
    return name


def listed(names: Iterable[str]) -> str:
    """Names as a message lists them: 'a', 'b' or 'c' (sorted)."""
    quoted = [repr(name) for name in sorted(names)]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


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
