"""A registry: the names of one kind of thing (retrievers, strategies, embeddings) and what each
is, kept in one place that every list of choices reads (settings validation, Hydra groups, the
dashboard). Adding one is a module and a `register` call."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

from caprag.errors import ConfigError

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
        names = [repr(name) for name in sorted(self._entries)]
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"

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
