"""What a caller (a benchmark) may observe or switch in a run, handed to `run` instead of patched.

`run(cfg, hooks=...)` times its phases through `hooks.phase(name)`: `setup` (building the
components), `evaluate` (answering and scoring every question), `mlflow_results` (logging the
results) and `mlflow_traces` (waiting for the trace writer). `reuse_rows=False` asks every
question again while the LLM response cache stays on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class RunHooks:
    """The default: nothing observed, rows reused as the config says."""

    reuse_rows: bool = True

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Around one phase of the run (a subclass times it)."""
        yield


NO_HOOKS = RunHooks()
