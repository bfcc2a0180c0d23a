"""Waiting in tests: for a condition, with a deadline; never a fixed sleep before an assertion.

Every test and harness helper that waits for something uses these, so how often a condition is
polled is decided in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

#: How often a condition is checked again; short next to any deadline a test uses.
POLL_S = 0.05


def poll(condition: Callable[[], bool], timeout_s: float, interval_s: float = POLL_S) -> bool:
    """True as soon as `condition()` is; False if it still is not after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while not condition():
        if time.monotonic() > deadline:
            return False
        pause.wait(interval_s)
    return True


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str,
               interval_s: float = POLL_S) -> None:
    """`poll`, failing the test with `what` when the deadline passes."""
    if not poll(condition, timeout_s, interval_s):
        raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def eventually(probe: Callable[[], T], ok: Callable[[T], bool], timeout_s: float = 15.0,
               interval_s: float = POLL_S) -> T:
    """The first value of `probe()` that is `ok`, or the last one read when the deadline passes
    (for the test to assert on, with a useful message)."""
    last: list[T] = []

    def check() -> bool:
        last[:] = [probe()]
        return ok(last[0])

    poll(check, timeout_s, interval_s)
    return last[0]


class Sampler(threading.Thread, Generic[T]):
    """Reads `probe()` every `interval_s` while its `with` block runs, for a test to assert on what
    was seen during some load (a value that only exists while the load runs is gone afterwards)."""

    def __init__(self, probe: Callable[[], T], interval_s: float = 0.25) -> None:
        super().__init__(daemon=True)
        self._probe = probe
        self._interval_s = interval_s
        self._stop_sampling = threading.Event()
        self.samples: list[T] = []

    def run(self) -> None:
        while not self._stop_sampling.is_set():
            with contextlib.suppress(OSError):  # a scrape refused while a process restarts: no sample
                self.samples.append(self._probe())
            self._stop_sampling.wait(self._interval_s)

    def __enter__(self) -> Sampler[T]:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop_sampling.set()
        self.join(10)


async def poll_async(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.02) -> bool:
    """`poll` for a test that runs on an event loop: yields to the loop between looks."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval_s)
    return True
