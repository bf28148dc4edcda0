"""Starting the harness's helper processes (the trace writer, the answering workers) cleanly."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def main_not_imported() -> Iterator[None]:
    """Start a process without `__main__`: multiprocessing would import the main module again in
    a spawned (or forkserver) process, and a script that calls run(cfg) without an `if __name__ ==
    "__main__":` guard would start a second run there. The helpers need nothing from it (their
    targets and arguments come from their own modules)."""
    main = sys.modules["__main__"]
    saved: dict[str, Any] = {
        key: main.__dict__[key] for key in ("__spec__", "__file__") if key in main.__dict__
    }
    main.__dict__["__spec__"] = None
    main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)
