"""Time for the quotas package: integer milliseconds from an injected clock.

Only `SystemClock` reads real time (monotonic, never wall-clock); everything else takes `now_ms`
from a `Clock`, so tests drive time with `FakeClock` and never sleep.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    def now_ms(self) -> int:
        """Current time in integer milliseconds. Must never go backwards."""
        ...


class SystemClock:
    """Monotonic time in milliseconds (`time.monotonic_ns() // 1_000_000`).

    The origin is arbitrary; only differences matter to the quota maths.
    """

    __slots__ = ()

    def now_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000


class FakeClock:
    """A clock that only moves when told to, in the spirit of Kafka's `MockTime`."""

    __slots__ = ("_now_ms",)

    def __init__(self, now_ms: int = 0) -> None:
        self._now_ms = now_ms

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, ms: int) -> int:
        """Move forward by `ms` (>= 0) and return the new time."""
        if ms < 0:
            raise ValueError(f"a clock cannot go backwards (advance by {ms} ms)")
        self._now_ms += ms
        return self._now_ms

    def set(self, ms: int) -> None:
        """Jump to an absolute time. Going backwards is allowed here, to test clock anomalies."""
        self._now_ms = ms

    def __repr__(self) -> str:
        return f"FakeClock(now_ms={self._now_ms})"
