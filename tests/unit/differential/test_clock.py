"""The compiled clock (quotas._speedups.SystemClock) against its pure-Python reference.

Both must give the same integer milliseconds from the same origin: every compiled reading lies
between a pure reading taken just before it and one taken just after it. A clock with another
origin (CLOCK_REALTIME, boot time) or unit (microseconds, seconds) fails that at once, as the skewed
twins below show.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from quotas import fastpath
from quotas.clock import Clock, SystemClock
from tests.unit.differential.test_quota_stats import compiled


def sandwiched(fast: Callable[[], int], pure: Callable[[], int], rounds: int = 2000) -> list[str]:
    """Where `fast` disagrees with `pure`: a reading not between the pure ones around it, or not an int."""
    problems = []
    for i in range(rounds):
        before = pure()
        got = fast()
        after = pure()
        if type(got) is not int or not before <= got <= after:
            problems.append(f"round {i}: {before} <= {got!r} <= {after} does not hold")
    return problems


def test_the_compiled_clock_reads_the_references_milliseconds() -> None:
    fast = compiled().SystemClock()
    assert isinstance(fast, Clock)
    assert sandwiched(fast.now_ms, SystemClock().now_ms) == []


class _Skewed:
    def __init__(self, read: Callable[[], int]) -> None:
        self.now_ms = read


@pytest.mark.parametrize("skewed", [
    _Skewed(lambda: time.time_ns() // 1_000_000),           # another origin: wall-clock time
    _Skewed(lambda: time.monotonic_ns() // 1_000),           # another unit: microseconds
    _Skewed(lambda: time.monotonic_ns() // 1_000_000 + 1),   # one millisecond ahead
], ids=["realtime", "microseconds", "one-ms-ahead"])
def test_a_skewed_clock_fails_the_comparison(skewed: Any) -> None:
    assert sandwiched(skewed.now_ms, SystemClock().now_ms, rounds=50) != []


def test_the_selector_uses_the_compiled_clock_unless_told_otherwise() -> None:
    impl = compiled()
    if os.environ.get("SLUICE_PURE_PYTHON") or not sys.platform.startswith("linux"):
        assert fastpath.SystemClockImpl is SystemClock
    else:
        assert fastpath.SystemClockImpl is impl.SystemClock
