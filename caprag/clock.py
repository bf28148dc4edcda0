"""Time as budgets see it: the real monotonic clock, or one a test moves by hand."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Protocol, TypeVar, runtime_checkable

T = TypeVar("T")


@runtime_checkable
class Clock(Protocol):
    """What a time budget reads: the time now, and a wait bounded by a number of seconds."""

    def now(self) -> float:
        """Seconds on a monotonic scale."""
        ...

    async def bounded(self, awaitable: Awaitable[T], seconds: float) -> T:
        """Await `awaitable`; raise TimeoutError when it takes more than `seconds`."""
        ...


class MonotonicClock:
    """The real clock: `time.monotonic` and `asyncio.wait_for`."""

    def now(self) -> float:
        """Seconds since an arbitrary point, never going back."""
        return time.monotonic()

    async def bounded(self, awaitable: Awaitable[T], seconds: float) -> T:
        """Cancel the wait after `seconds` (at once when none are left)."""
        return await asyncio.wait_for(awaitable, max(seconds, 0.0))
