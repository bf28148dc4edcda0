"""Deprecated path, kept for plug-ins: the same names are in `caprag.retrieval.retrievers`."""

import warnings
from typing import Any

from caprag.retrieval import retrievers as _moved

warnings.warn(
    "caprag.retrievers moved to caprag.retrieval.retrievers", DeprecationWarning, stacklevel=2
)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)
