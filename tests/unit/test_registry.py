"""A registry keeps one entry per name, refuses a second one under a taken name, and tells its
listeners of every entry, registered before or after they listen."""

from __future__ import annotations

import pytest

from caprag.errors import ConfigError
from caprag.registry import Registry


def test_a_taken_name_is_refused_unless_replaced() -> None:
    colours: Registry[str] = Registry("colour")
    colours.register("red", "#f00")
    colours.register("red", "#f00")  # the same entry again (a module imported twice): no change
    with pytest.raises(ConfigError, match="colour 'red' is registered already"):
        colours.register("red", "#e00")
    colours.register("red", "#e00", replace=True)
    assert dict(colours) == {"red": "#e00"}
    with pytest.raises(ConfigError, match="a colour name needs to be a word"):
        colours.register("red, green", "#ff0")


def test_messages_list_the_registered_names() -> None:
    colours: Registry[str] = Registry("colour")
    for name in ("red", "blue", "green"):
        colours.register(name, name)
    assert colours.check("blue") == "blue"
    with pytest.raises(ValueError, match=r"^Input should be 'blue', 'green' or 'red'$"):
        colours.check("pink")
    with pytest.raises(ConfigError, match=r"^unknown colour 'pink'; allowed: blue, green, red$"):
        colours.choose("pink")
    assert colours.unregister("green") == "green" and list(colours) == ["red", "blue"]


def test_a_listener_hears_of_earlier_and_later_entries() -> None:
    colours: Registry[str] = Registry("colour")
    colours.register("red", "#f00")
    heard: list[tuple[str, str]] = []
    colours.on_register(lambda name, entry: heard.append((name, entry)))
    colours.register("blue", "#00f")
    assert heard == [("red", "#f00"), ("blue", "#00f")]


def test_the_catalogue_of_built_in_names_is_what_the_registries_hold() -> None:
    """The settings check names against `BUILT_IN` without importing the registering modules:
    it names exactly the built-in entries of each registry."""
    from caprag import config, registry
    from caprag.retrieval.embeddings import EMBEDDERS
    from caprag.retrieval.retrievers import RETRIEVERS
    from caprag.serve.checkpoint import CHECKPOINTERS
    from caprag.strategies import STRATEGIES

    for held in (STRATEGIES, RETRIEVERS, EMBEDDERS):
        assert list(registry.BUILT_IN[held.kind]) == list(held), held.kind
    assert tuple(CHECKPOINTERS) == config.CHECKPOINTER_KINDS


def test_a_plugin_name_is_known_once_registered() -> None:
    from caprag import registry

    # (a kind no Hydra group watches: its entries need not be models)
    gadgets: Registry[str] = Registry("embedding model")
    assert "gadget" not in registry.known("embedding model")
    with pytest.raises(ValueError, match=r"^Input should be 'minilm' or 'wordllama'$"):
        registry.check_known("embedding model", "gadget")
    gadgets.register("gadget", "an embedding model of a plug-in")
    assert registry.check_known("embedding model", "gadget") == "gadget"
    assert registry.known("embedding model")[-1] == "gadget"
    gadgets.unregister("gadget")
