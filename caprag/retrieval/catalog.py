"""The titles an index holds: which names in a passage lead to another passage of the corpus.

A bridge between two passages is a name the first mentions and the corpus has a passage about
(a Wikipedia article's title, a rulebook section's heading). Linking a name to that catalog is
what keeps multi-hop from searching for every capitalised word it reads ('Promotional', a date,
a cast list): a name the corpus has no passage about leads nowhere, whatever the corpus is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

from caprag.schemas import Document


@runtime_checkable
class Cataloged(Protocol):
    """A retriever that can list every passage it searches (PassageIndex, BM25Index, ...)."""

    def parents(self) -> Mapping[str, Document]:
        """Every passage by id."""
        ...


def title_key(text: str) -> str:
    """A title as names are matched against it: lower case, its disambiguation dropped
    ('Wale (rapper)' -> 'wale'), blanks folded."""
    return " ".join(text.split(" (")[0].lower().split())


class Catalog:
    """Passage ids by the title of their section."""

    def __init__(self, passages: Iterable[Document]) -> None:
        self._by_title: dict[str, list[str]] = {}
        self._documents: dict[str, Document] = {}
        for doc in passages:
            self._documents[doc.passage_id] = doc
            key = title_key(doc.section)
            if key:
                self._by_title.setdefault(key, []).append(doc.passage_id)
        self._read: frozenset[str] = frozenset()

    def unread(self, read: Iterable[str]) -> Catalog:
        """The same catalog with the passages already read left out: a name whose passages were
        all read leads to nothing new."""
        view = Catalog(())
        view._by_title = self._by_title
        view._documents = self._documents
        view._read = self._read | frozenset(read)
        return view

    @classmethod
    def of(cls, retriever: object) -> Catalog | None:
        """The catalog of a retriever that lists its passages, else None (nothing to link to)."""
        if isinstance(retriever, Cataloged):
            return cls(retriever.parents().values())
        return None

    def __len__(self) -> int:
        return len(self._by_title)

    def passages(self, name: str) -> list[str]:
        """Ids of the passages titled `name` not read yet (empty when the corpus has none)."""
        return [pid for pid in self._by_title.get(title_key(name), ()) if pid not in self._read]

    def read_documents(self) -> list[Document]:
        """The passages read so far (see `unread`), in id order."""
        return [self._documents[pid] for pid in sorted(self._read) if pid in self._documents]

    def knows(self, name: str) -> bool:
        """Whether some passage of the corpus not read yet is titled `name`."""
        return bool(self.passages(name))
