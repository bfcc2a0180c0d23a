"""Kafka's throttle-time formula (`QuotaUtils.throttleTime` / `boundedThrottleTime`).

If O is the observed rate and T the bound over a window of W ms, the client must wait X ms so
that ``O * W / (W + X) = T``, i.e. ``X = (O - T) / T * W``, rounded as Java's `Math.round`
(half-up: ``floor(x + 0.5)`` computed exactly, never Python's banker's rounding).
"""

from __future__ import annotations

import math

#: throttle_time_ms is an int32 on the wire.
MAX_THROTTLE_TIME_MS = 2**31 - 1


def java_round(x: float) -> int:
    """Java's `Math.round(double)`: the closest integer, ties toward positive infinity.

    Computed as ``floor(x)`` plus one when the exact fractional part is >= 0.5, so it avoids
    the ``x + 0.5`` representation error (``java_round(0.49999999999999994) == 0``). NaN gives
    0, as in Java; infinities raise `OverflowError`, callers clamp before.
    """
    if math.isnan(x):
        return 0
    floor = math.floor(x)
    return floor + 1 if x - floor >= 0.5 else floor


def throttle_time_ms(observed: float, bound: float, window_ms: int) -> int:
    """``round_half_up((observed - bound) / bound * window_ms)``, clamped to ``[0, 2**31-1]``.

    Kafka computes ``(difference / bound) * windowSize`` in that order; so does this, so the
    results match the JVM's to the bit. Kafka casts the long to int (wrapping on overflow); here
    it saturates at the int32 maximum instead. Byte-rate throttles have no other cap.

    A bound <= 0 (only a custom callback can produce one) throttles any positive excess for the
    maximum, where Kafka would divide by zero.
    """
    if not bound > 0:
        return MAX_THROTTLE_TIME_MS if observed > bound else 0
    x = (observed - bound) / bound * window_ms
    if not x > 0:  # also NaN
        return 0
    if x >= MAX_THROTTLE_TIME_MS:
        return MAX_THROTTLE_TIME_MS
    return java_round(x)


def bounded_throttle_time_ms(observed: float, bound: float, window_ms: int, max_ms: int) -> int:
    """`throttle_time_ms` capped at `max_ms`: request quotas cap at one window (default 1000 ms)."""
    return min(throttle_time_ms(observed, bound, window_ms), max_ms)


def bucket_throttle_time_ms(credits: float, quota: float) -> int:
    """A token bucket's throttle: the time to refill from `credits` (< 0: violated) to zero,
    ``round_half_up(-credits / quota x 1000)`` as Kafka's controller mutation quota computes it,
    clamped to ``[0, 2**31-1]``. 0 while credits >= 0; the maximum for a quota <= 0 (a storage
    factor of 0), which callers cap."""
    if not credits < 0:
        return 0
    if not quota > 0:
        return MAX_THROTTLE_TIME_MS
    x = -credits / quota * 1000.0
    if x >= MAX_THROTTLE_TIME_MS:
        return MAX_THROTTLE_TIME_MS
    return java_round(x)
