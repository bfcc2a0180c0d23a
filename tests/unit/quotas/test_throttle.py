"""QuotaUtils.throttleTime: X = (O - T) / T * W, rounded as Java's Math.round (half up)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quotas import MAX_THROTTLE_TIME_MS, bounded_throttle_time_ms, java_round, throttle_time_ms


@pytest.mark.parametrize(("x", "expected"), [
    (2.5, 3),     # ties go up; Python's round(2.5) == 2
    (3.5, 4),
    (-2.5, -2),   # ties toward +inf, not away from zero
    (2.4999, 2),
    (0.49999999999999994, 0),  # largest double < 0.5: floor(x + 0.5) would wrongly give 1
    (1e15 + 0.5, 1_000_000_000_000_001),
    (7.0, 7),
    (math.nan, 0),  # Java: Math.round(NaN) == 0
])
def test_java_round(x: float, expected: int) -> None:
    assert java_round(x) == expected


@given(st.floats(min_value=-1e12, max_value=1e12, allow_nan=False))
def test_java_round_is_exact_floor_of_x_plus_half(x: float) -> None:
    assert java_round(x) == math.floor(Fraction(x) + Fraction(1, 2))


def test_kafka_worked_example() -> None:
    # ClientQuotaManagerTest.testQuotaViolation: O = 6300 B / 10.5 s = 600 B/s, T = 500 B/s,
    # W = 10 500 ms: (600 - 500) / 500 * 10 500 = 2100 ms.
    assert throttle_time_ms(600.0, 500.0, 10_500) == 2100


def test_hundred_megabytes_against_one_megabyte_per_second() -> None:
    # A fresh sensor divides by (N-1)*W = 10 s: O = 100 MB / 10 s = 10 MB/s.
    # X = (10 MB/s - 1 MB/s) / 1 MB/s * 10 000 ms = 90 000 ms, far beyond any cap.
    assert throttle_time_ms(10_000_000.0, 1_000_000.0, 10_000) == 90_000


def test_half_millisecond_rounds_up() -> None:
    # (640 - 512) / 512 = 0.25 exactly; 0.25 * 10 010 = 2502.5 exactly -> 2503 (banker's: 2502).
    assert throttle_time_ms(640.0, 512.0, 10_010) == 2503
    # 0.25 * 10 002 = 2500.5 -> 2501 (banker's rounding would give 2500).
    assert throttle_time_ms(640.0, 512.0, 10_002) == 2501


def test_just_below_half_rounds_down() -> None:
    # (513 - 512) / 512 * 1499 = 2.927734375 -> 3; * 1279 = 2.498046875 -> 2.
    assert throttle_time_ms(513.0, 512.0, 1499) == 3
    assert throttle_time_ms(513.0, 512.0, 1279) == 2


def test_no_excess_no_throttle() -> None:
    assert throttle_time_ms(500.0, 500.0, 10_000) == 0
    assert throttle_time_ms(400.0, 500.0, 10_000) == 0


def test_saturates_at_int32() -> None:
    # 1e12 B/s against 1 B/s over 10 s would be ~1e16 ms; Kafka's (int) cast would wrap.
    assert throttle_time_ms(1e12, 1.0, 10_000) == MAX_THROTTLE_TIME_MS


def test_bounded_caps_at_max() -> None:
    # request_percentage: (300 - 100) / 100 * 10 000 = 20 000 ms, capped at one window.
    assert bounded_throttle_time_ms(300.0, 100.0, 10_000, 1000) == 1000
    # Below the cap the value is unchanged: (101 - 100) / 100 * 10 000 = 100 ms.
    assert bounded_throttle_time_ms(101.0, 100.0, 10_000, 1000) == 100


def test_non_positive_bound_from_a_callback_throttles_fully() -> None:
    assert throttle_time_ms(1.0, 0.0, 10_000) == MAX_THROTTLE_TIME_MS
    assert throttle_time_ms(0.0, 0.0, 10_000) == 0
