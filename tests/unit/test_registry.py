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
