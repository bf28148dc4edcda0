"""Unit-test fixtures: the fixture books in memory."""

from __future__ import annotations

import pytest

from tests.fakes import MemoryRetriever


@pytest.fixture
def books() -> MemoryRetriever:
    """The three fixture books in memory, searched by term overlap (no encoder, no Chroma)."""
    return MemoryRetriever.from_books()
