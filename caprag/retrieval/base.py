"""What a strategy needs of a retriever: the top-k passages for a query."""

from __future__ import annotations

from typing import Protocol

from caprag.schemas import Document


class Retriever(Protocol):
    """Anything that returns the top-k passages for a query (PassageIndex, a test double)."""

    def search(self, query: str, k: int) -> list[Document]:
        """Top-k passages, best first."""
        ...
