"""Deprecated path, kept for plug-ins: the same names are in `caprag.retrieval.embeddings`."""

import warnings
from typing import Any

from caprag.retrieval import embeddings as _moved

warnings.warn(
    "caprag.embeddings moved to caprag.retrieval.embeddings", DeprecationWarning, stacklevel=2
)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)
