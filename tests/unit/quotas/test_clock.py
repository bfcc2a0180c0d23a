from __future__ import annotations

import pytest

from quotas import Clock, FakeClock, SystemClock


def test_fake_clock_moves_only_when_told() -> None:
    clock = FakeClock(100)
    assert isinstance(clock, Clock)
    assert clock.now_ms() == clock.now_ms() == 100
    assert clock.advance(50) == 150
    clock.set(10)
    assert clock.now_ms() == 10
    with pytest.raises(ValueError):
        clock.advance(-1)
    assert FakeClock().now_ms() == 0


def test_system_clock_is_monotonic_integer_milliseconds() -> None:
    clock = SystemClock()
    assert isinstance(clock, Clock)
    readings = [clock.now_ms() for _ in range(1000)]
    assert all(isinstance(r, int) for r in readings)
    assert readings == sorted(readings)
