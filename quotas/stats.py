"""Kafka's windowed rate (`SampledStat` + `WindowedSum` + `Rate`), Kafka >= 3.8 semantics.

The stat keeps a ring of at most N+1 samples (N = `samples`, W = `window_ms`). Each sample holds
a sum, its start time and the time of its last event:

* record(v, now): the current sample is complete once ``now - start >= W``; then the ring
  advances (appending a new sample while fewer than N+1 exist, otherwise resetting the next
  one). Windows start at the first event after the previous one closed: they are not aligned to
  the wall clock, and idle gaps create no samples.
* purge(now): a sample whose *last event* is ``>= N*W`` old is reset (sum 0, start = last = now).
  An old sample therefore survives while its last event is recent, so the covered span can
  exceed N*W.
* window_size(now): ``now - min(start)``, padded up to N-1 whole windows when fewer have
  elapsed (a fresh sensor divides by (N-1)*W, 10 s with the defaults), never less than 1 ms.
* measure(now) = sum / (window_size / 1000.0), in units per second.

Side effects are Kafka's too: measuring an empty stat creates a sample starting at `now`
(Kafka's `SampledStat.oldest`), and purging resets samples in place.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass

from quotas.errors import QuotaConfigError


@dataclass(frozen=True, slots=True)
class RateConfig:
    """`quota.window.num` (samples, default 11) and `quota.window.size.seconds` (as ms, default 1000)."""

    samples: int = 11
    window_ms: int = 1000

    def __post_init__(self) -> None:
        for name in ("samples", "window_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise QuotaConfigError(name, f"must be an integer, got {value!r}")
            if value < 1:
                raise QuotaConfigError(name, f"must be >= 1, got {value}")

    @property
    def retention_ms(self) -> int:
        """N*W: a sample is purged once its last event is this old."""
        return self.samples * self.window_ms

    @property
    def min_window_ms(self) -> int:
        """(N-1)*W: the smallest window a rate is ever divided by (before the 1 ms floor)."""
        return (self.samples - 1) * self.window_ms


class SampledRate:
    """A rate over a ring of time-windowed sums; see the module docstring for the exact rules.

    Storage is three parallel lists (sum, start, last event), grown lazily to N+1 entries, so a
    sensor that saw one event costs three one-element lists.
    """

    __slots__ = ("_config", "_current", "_expire_age_ms", "_lasts", "_max_slots", "_min_full_windows",
                 "_starts", "_values", "_window_ms")

    def __init__(self, config: RateConfig = RateConfig()) -> None:
        self._config = config
        self._window_ms = config.window_ms
        self._max_slots = config.samples + 1
        self._expire_age_ms = config.samples * config.window_ms
        self._min_full_windows = config.samples - 1
        self._values: list[float] = []
        self._starts: list[int] = []
        self._lasts: list[int] = []
        self._current = 0

    @property
    def config(self) -> RateConfig:
        return self._config

    def record(self, value: float, now_ms: int) -> None:
        """Add `value` at `now_ms`. Negative values are allowed (Kafka's fetch "un-record")."""
        values = self._values
        if not values:
            self._append(now_ms)
        i = self._current
        if now_ms - self._starts[i] >= self._window_ms:
            i = (i + 1) % self._max_slots
            self._current = i
            if i >= len(values):
                self._append(now_ms)
            else:
                values[i] = 0.0
                self._starts[i] = now_ms
        values[i] += value
        self._lasts[i] = now_ms

    def measure(self, now_ms: int) -> float:
        """The rate in units per second at `now_ms` (Kafka's `Rate.measure`)."""
        total, window_ms = self.measure_parts(now_ms)
        return total / (window_ms / 1000.0)

    def window_size_ms(self, now_ms: int) -> int:
        """The window the rate is divided by at `now_ms` (Kafka's `Rate.windowSize`)."""
        return self.measure_parts(now_ms)[1]

    def total(self, now_ms: int) -> float:
        """The sum of the retained samples at `now_ms`, after purging."""
        return self.measure_parts(now_ms)[0]

    def measure_parts(self, now_ms: int) -> tuple[float, int]:
        """Purge, then return ``(total, window_size_ms)`` in one pass over the ring.

        The sum is accumulated in ring order from 0.0, as Kafka's `WindowedSum.combine` does, so
        results are bit-for-bit those of the JVM.
        """
        values = self._values
        if not values:
            self._append(now_ms)  # Kafka's oldest(): an empty stat gains a sample starting now
        starts = self._starts
        lasts = self._lasts
        expire_age = self._expire_age_ms
        total = 0.0
        oldest = now_ms
        for i in range(len(values)):
            if now_ms - lasts[i] >= expire_age:
                values[i] = 0.0
                starts[i] = now_ms
                lasts[i] = now_ms
            total += values[i]
            if i == 0 or starts[i] < oldest:
                oldest = starts[i]
        elapsed = now_ms - oldest
        window_ms = self._window_ms
        # Java's long division truncates toward zero; elapsed < 0 only if the clock went back.
        full_windows = elapsed // window_ms if elapsed >= 0 else -(-elapsed // window_ms)
        if full_windows < self._min_full_windows:
            elapsed += (self._min_full_windows - full_windows) * window_ms
        return total, (elapsed if elapsed > 1 else 1)

    def _append(self, now_ms: int) -> None:
        self._values.append(0.0)
        self._starts.append(now_ms)
        self._lasts.append(now_ms)

    def __repr__(self) -> str:
        samples = ", ".join(f"({v:g} @{s}..{last})" for v, s, last in
                            zip(self._values, self._starts, self._lasts, strict=True))
        return f"SampledRate({self._config}, current={self._current}, samples=[{samples}])"


class RateModel(enum.Enum):
    """How a quota turns recorded values into a throttle.

    * `WINDOWED` (the default, Kafka's byte and request quotas): the sampled `SampledRate` above,
      throttle ``(rate - quota) / quota x window``. A fresh or long-idle client may burst up to
      about ``(samples - 1) x window x quota`` and then sends in a sawtooth.
    * `TOKEN_BUCKET` (Kafka's `TokenBucket`, KIP-599, which Kafka uses only for controller
      mutations): credits refill at the quota up to a burst, a record takes credits (they may go
      negative), the quota is violated while credits < 0 and the throttle is the time to refill to
      zero. A saturating client moves at the quota with no periodic bursts.
    """

    WINDOWED = "windowed"
    TOKEN_BUCKET = "token_bucket"

    __hash__ = object.__hash__


class TokenBucket:
    """Kafka's `TokenBucket` stat (``org.apache.kafka.common.metrics.stats.TokenBucket``).

    The quota (refill rate, units per second) and the burst (the most credits the bucket holds)
    are passed on every call, as Kafka reads them from the sensor's `MetricConfig` each time, so
    a changed bound applies from the next call with the credits kept (clipped to the new burst).

    * refill(now): ``credits = min(burst, credits + quota x (now - last) / 1000)``, ``last = now``;
    * record(v, now): refill, then ``credits = min(burst, credits - v)``: credits may go negative,
      and a negative `v` (Kafka's fetch un-record) gives credits back, never beyond the burst;
    * measure(now): refill, then the credits.

    Kafka starts a bucket at 0 credits updated at epoch 0, so its first refill fills it; here the
    first call fills it explicitly (the same, and also for a clock that starts near 0).
    """

    __slots__ = ("_credits", "_last_ms")

    def __init__(self) -> None:
        self._credits: float | None = None  # None until the first call: then full
        self._last_ms = 0

    def record(self, value: float, quota: float, burst: float, now_ms: int) -> None:
        credits = self._refill(quota, burst, now_ms)
        self._credits = min(burst, credits - value)

    def measure(self, quota: float, burst: float, now_ms: int) -> float:
        """The credits at `now_ms` after refilling (negative: in violation)."""
        return self._refill(quota, burst, now_ms)

    def _refill(self, quota: float, burst: float, now_ms: int) -> float:
        credits = self._credits
        if credits is None:
            credits = burst
        else:
            credits = min(burst, credits + quota * ((now_ms - self._last_ms) / 1000.0))
        self._credits = credits
        self._last_ms = now_ms
        return credits

    def __repr__(self) -> str:
        return f"TokenBucket(credits={self._credits}, last_ms={self._last_ms})"


class RecentSum:
    """What was delivered in the last `span_ms` (a second): the token bucket's guard for whole
    responses larger than its burst.

    A bucket of burst B refilling at Q keeps every second within ``Q + B`` for requests smaller
    than the credits they take. A fetch is charged on its response and admitted whole while the
    credits are not negative, so one response larger than B lands at once: responses of about Q
    bytes at a rate of Q arrive every ``S / Q`` < 1 s, and a second holding two holds 2 x Q. The
    guard answers that second's promise directly: a response is admitted only if the second
    before it plus the response stay within ``Q + B``, or if the second before it is empty (so a
    response larger than ``Q + B`` still goes through, alone in its second).

    `wait_ms` is how long until enough of the second has aged out for `room` more, rounded up to
    a whole ms. Entries older than the span are dropped as time moves on, so it holds at most a
    second of deliveries.
    """

    __slots__ = ("_events", "_span_ms", "_total")

    def __init__(self, span_ms: int = 1000) -> None:
        self._span_ms = span_ms
        self._events: deque[tuple[int, float]] = deque()
        self._total = 0.0

    def add(self, value: float, now_ms: int) -> None:
        self._expire(now_ms)
        self._events.append((now_ms, value))
        self._total += value

    def take_back(self, value: float, now_ms: int) -> None:
        """`value` was not delivered after all: the newest entry of that value goes (else the sum
        is lowered by it, at `now_ms`)."""
        events = self._events
        if events and events[-1][1] == value:
            events.pop()
            self._total -= value
            if not events:
                self._total = 0.0
        else:
            self.add(-value, now_ms)

    def total(self, now_ms: int) -> float:
        """The sum delivered in ``(now - span, now]``."""
        self._expire(now_ms)
        return self._total if self._events else 0.0

    def wait_ms(self, now_ms: int, room: float) -> int:
        """The ms until the sum still inside the span is at most `room` (0: already)."""
        self._expire(now_ms)
        events = self._events
        if not events or self._total <= room:
            return 0
        left = self._total
        last = len(events) - 1
        for i, (at_ms, value) in enumerate(events):
            left -= value
            if left <= room or i == last:  # once all have left, nothing is (no float residue)
                return max(1, at_ms + self._span_ms - now_ms)  # this delivery leaves the span then
        return self._span_ms  # unreachable: the loop returns at the last event

    def _expire(self, now_ms: int) -> None:
        events = self._events
        cutoff = now_ms - self._span_ms
        while events and events[0][0] <= cutoff:
            self._total -= events.popleft()[1]
        if not events:
            self._total = 0.0  # no float drift carried into the next second

    def __repr__(self) -> str:
        return f"RecentSum(span_ms={self._span_ms}, total={self._total:g}, events={len(self._events)})"


@dataclass(frozen=True, slots=True)
class BucketShape:
    """What a token bucket holds, as a duration of quota: ``burst = quota x burst_ms / 1000``.

    Kafka's burst is ``samples x window x quota`` (`RateConfig.retention_ms`); `burst_ms` may only
    make it smaller: a larger one is refused, naming `burst_ms`.
    """

    burst_ms: int

    def __post_init__(self) -> None:
        value = self.burst_ms
        if isinstance(value, bool) or not isinstance(value, int):
            raise QuotaConfigError("burst_ms", f"must be an integer, got {value!r}")
        if value < 1:
            raise QuotaConfigError("burst_ms", f"must be >= 1, got {value}")

    @classmethod
    def of(cls, window: RateConfig, burst_ms: int | None) -> BucketShape:
        """Kafka's burst for `window`, or `burst_ms` when given and not larger than it."""
        if burst_ms is None:
            return cls(window.retention_ms)
        check_burst_ms(window, burst_ms)
        return cls(burst_ms)

    def burst(self, quota: float) -> float:
        return quota * (self.burst_ms / 1000.0)


def check_burst_ms(window: RateConfig, burst_ms: object) -> int:
    """`burst_ms` as a valid int for `window`, or `QuotaConfigError("burst_ms", reason)`."""
    if isinstance(burst_ms, bool) or not isinstance(burst_ms, int):
        raise QuotaConfigError("burst_ms", f"must be a whole number of milliseconds, got {burst_ms!r}")
    if burst_ms < 1:
        raise QuotaConfigError("burst_ms", f"must be >= 1, got {burst_ms}")
    if burst_ms > window.retention_ms:
        raise QuotaConfigError("burst_ms", f"{burst_ms} is larger than the window allows "
                                           f"(samples x size_ms = {window.retention_ms})")
    return burst_ms


#: Kafka's default `MetricConfig` (broker `metrics.num.samples` = 2, `metrics.sample.window.ms` =
#: 30 000): the window of its `throttle-time` sensors, 2 x 30 s.
METRIC_WINDOW = RateConfig(samples=2, window_ms=30_000)


class SampledAvgMax:
    """Kafka's `Avg` and `Max` stats of one sensor over its sampled window (`SampledStat`).

    The ring is `SampledRate`'s (at most N+1 samples, a window starts at the first event after the
    previous one closed, a sample whose last event is ``>= N*W`` old is purged); each sample keeps
    the sum, the count and the largest value of its events. `avg` is ``sum / count`` and `max` the
    largest value over the retained samples, both NaN when the window holds no event (Kafka's
    `Avg.combine` and `Max.combine`). This is the broker's `throttle-time` (an `Avg` over
    `METRIC_WINDOW`), with the client's `throttle-time-max` next to it.
    """

    __slots__ = ("_counts", "_current", "_expire_age_ms", "_lasts", "_max_slots", "_maxes", "_starts",
                 "_sums", "_window_ms")

    def __init__(self, config: RateConfig = METRIC_WINDOW) -> None:
        self._window_ms = config.window_ms
        self._max_slots = config.samples + 1
        self._expire_age_ms = config.samples * config.window_ms
        self._sums: list[float] = []
        self._counts: list[int] = []
        self._maxes: list[float] = []
        self._starts: list[int] = []
        self._lasts: list[int] = []
        self._current = 0

    def record(self, value: float, now_ms: int) -> None:
        if not self._sums:
            self._append(now_ms)
        i = self._current
        if now_ms - self._starts[i] >= self._window_ms:
            i = (i + 1) % self._max_slots
            self._current = i
            if i >= len(self._sums):
                self._append(now_ms)
            else:
                self._reset(i, now_ms)
        self._sums[i] += value
        self._counts[i] += 1
        if value > self._maxes[i]:
            self._maxes[i] = value
        self._lasts[i] = now_ms

    def measure(self, now_ms: int) -> tuple[float, float, int]:
        """Purge, then ``(avg, max, count)`` over the retained samples (NaN, NaN, 0 when empty)."""
        total = 0.0
        count = 0
        largest = -math.inf
        for i in range(len(self._sums)):
            if now_ms - self._lasts[i] >= self._expire_age_ms:
                self._reset(i, now_ms)
            total += self._sums[i]
            count += self._counts[i]
            largest = max(largest, self._maxes[i])
        if count == 0:
            return math.nan, math.nan, 0
        return total / count, largest, count

    def _append(self, now_ms: int) -> None:
        self._sums.append(0.0)
        self._counts.append(0)
        self._maxes.append(-math.inf)
        self._starts.append(now_ms)
        self._lasts.append(now_ms)

    def _reset(self, i: int, now_ms: int) -> None:
        self._sums[i] = 0.0
        self._counts[i] = 0
        self._maxes[i] = -math.inf
        self._starts[i] = now_ms
        self._lasts[i] = now_ms
