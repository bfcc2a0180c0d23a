"""SampledRate against Kafka's SampledStat/Rate (>= 3.8): ring of N+1 samples, purge by last
event, padding to (N-1)*W, 1 ms floor. Defaults N=11, W=1000 ms unless stated."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotas import METRIC_WINDOW, QuotaConfigError, RateConfig, SampledAvgMax, SampledRate


def test_defaults_match_kafka() -> None:
    assert RateConfig() == RateConfig(samples=11, window_ms=1000)
    assert RateConfig().retention_ms == 11_000
    assert RateConfig().min_window_ms == 10_000


@pytest.mark.parametrize("kwargs", [{"samples": 0}, {"window_ms": 0}, {"samples": -1}, {"window_ms": 1.5}])
def test_rate_config_validates(kwargs: dict[str, int]) -> None:
    with pytest.raises(QuotaConfigError):
        RateConfig(**kwargs)


def test_fresh_sensor_is_padded_to_n_minus_one_windows() -> None:
    rate = SampledRate()
    rate.record(1000, 0)
    # elapsed 0 ms, 0 full windows < N-1 = 10: pad by 10 windows -> 10 000 ms.
    assert rate.window_size_ms(0) == 10_000
    assert rate.measure(0) == 100.0  # 1000 B / 10 s
    # 500 ms later: elapsed 500, still 0 full windows -> 500 + 10 000.
    assert rate.window_size_ms(500) == 10_500
    # 3 s later: 3 full windows -> 3000 + 7 * 1000 = 10 000 again.
    assert rate.window_size_ms(3000) == 10_000


def test_empty_rate_measures_zero_over_padded_window() -> None:
    rate = SampledRate()
    assert rate.measure(123) == 0.0
    assert rate.window_size_ms(123) == 10_000


def test_ten_full_windows_are_not_padded() -> None:
    rate = SampledRate()
    for t in range(0, 10_000, 1000):
        rate.record(400, t)
    rate.record(2300, 10_500)
    # 6300 B since t=0; elapsed 10 500 ms = 10 full windows = N-1: no padding.
    assert rate.total(10_500) == 6300
    assert rate.window_size_ms(10_500) == 10_500
    assert rate.measure(10_500) == 600.0


def test_windows_start_at_first_event_not_wall_clock() -> None:
    rate = SampledRate(RateConfig(samples=2, window_ms=1000))
    rate.record(10, 700)
    rate.record(20, 1600)   # 900 ms after the window opened at 700: same sample
    rate.record(40, 1700)   # 1000 ms after 700: a new sample opens at 1700
    # N=2 keeps samples whose last event is < 2000 ms old. At 3650 the first sample (last event
    # 1600, 2050 ms ago) is purged, the second (opened 1700) stays. A wall-clock-aligned window
    # would have put 20 and 40 in the same [1000, 2000) window and kept 60.
    assert rate.total(3650) == 40
    # Oldest start 1700: elapsed 1950 ms, 1 full window = N-1, no padding.
    assert rate.window_size_ms(3650) == 1950


def test_idle_gaps_create_no_samples() -> None:
    rate = SampledRate(RateConfig(samples=5, window_ms=1000))
    rate.record(1, 0)
    rate.record(1, 2500)  # one new sample opened at 2500, none for [1000, 2500)
    rate.record(1, 3400)  # 900 ms into the sample opened at 2500: same sample
    # Samples: (1 @0), (2 @2500). At 3400: elapsed 3400 ms = 3 full windows < N-1 = 4, so one
    # window of padding: 4400 ms.
    assert rate.total(3400) == 3
    assert rate.window_size_ms(3400) == 4400
    # At 7400 the sample opened at 0 is purged (7400 >= 5000 ms) but the one opened at 2500 has
    # its last event at 3400 (4000 ms ago) and stays: 2 over 7400 - 2500 = 4900 ms (4 full).
    # Wall-clock windows would have put the 3400 event in a window of its own.
    assert rate.total(7400) == 2
    assert rate.window_size_ms(7400) == 4900


def test_purge_after_n_windows_since_last_event() -> None:
    rate = SampledRate()
    rate.record(1000, 0)
    # Kept while now - last_event < N*W = 11 000 ms.
    assert rate.total(10_999) == 1000
    assert rate.total(11_000) == 0
    assert rate.measure(11_000) == 0.0


def test_sample_survives_while_its_last_event_is_recent() -> None:
    # Kafka >= 3.8 purges by *last event*, so a sample that started at 0 but saw an event at 999
    # survives until 11 999, and the window can exceed N*W.
    rate = SampledRate()
    rate.record(100, 0)
    rate.record(100, 999)    # same sample (999 - 0 < 1000)
    rate.record(950, 11_500)
    # At 11 500: the old sample's last event is 10 501 ms old (< 11 000), kept. Total 1150,
    # elapsed 11 500 - 0 = 11 500 ms (> N*W = 11 000): 1150 / 11.5 = 100 B/s.
    assert rate.window_size_ms(11_500) == 11_500
    assert rate.measure(11_500) == 100.0
    # At 11 999 it is purged (11 000 ms after 999) and reset to start at 11 999. The oldest start
    # is now 11 500: elapsed 499 ms, 0 full windows, padded by 10: 10 499 ms.
    assert rate.total(11_999) == 950
    assert rate.window_size_ms(11_999) == 10_499


def test_ring_holds_n_plus_one_samples() -> None:
    # N=2, W=1000: records at 0, 1000, 2000 open three samples. With only N slots the 2000 record
    # would overwrite the sample opened at 0 whose event (at 999) is still within N*W = 2000 ms.
    rate = SampledRate(RateConfig(samples=2, window_ms=1000))
    rate.record(1, 0)
    rate.record(2, 999)
    rate.record(4, 1000)
    rate.record(8, 2000)
    # At 2000: first sample (last event 999, 1001 ms ago) kept; total 1+2+4+8 = 15 over
    # 2000 - 0 = 2000 ms.
    assert rate.total(2000) == 15
    assert rate.window_size_ms(2000) == 2000
    # A fourth window wraps the ring onto slot 0 (the sample of 0..999), reset for the event.
    # At 3000 the sample opened at 1000 is purged too (last event 2000 ms ago): 8 + 16 remain.
    rate.record(16, 3000)
    assert rate.total(3000) == 8 + 16


def test_window_floor_is_one_millisecond() -> None:
    # samples=1: no padding at all (N-1 = 0), so elapsed can be 0; Kafka >= 3.4 floors it at 1 ms.
    rate = SampledRate(RateConfig(samples=1, window_ms=1000))
    rate.record(100, 5000)
    assert rate.window_size_ms(5000) == 1
    assert rate.measure(5000) == 100_000.0  # 100 / 0.001 s
    assert rate.window_size_ms(5250) == 250
    assert rate.measure(5250) == 400.0


def test_negative_record_unrecords() -> None:
    rate = SampledRate()
    rate.record(500, 0)
    rate.record(-500, 10)
    assert rate.total(10) == 0


def test_measuring_an_empty_rate_opens_a_sample_like_kafka() -> None:
    # Kafka's SampledStat.oldest() creates a sample at `now` when there is none, so a metrics
    # read at 0 makes the first window [0, 1000) even though the first event comes at 600.
    rate = SampledRate(RateConfig(samples=2, window_ms=1000))
    rate.measure(0)
    rate.record(10, 600)
    rate.record(20, 1000)  # 1000 ms after 0: a new sample
    # Both samples kept at 1000; oldest start 0 -> 1000 ms, 1 full window = N-1.
    assert rate.window_size_ms(1000) == 1000
    fresh = SampledRate(RateConfig(samples=2, window_ms=1000))
    fresh.record(10, 600)
    fresh.record(20, 1000)  # 400 ms after 600: same sample
    assert fresh.window_size_ms(1000) == 400 + 1000  # 0 full windows -> padded by one


# ---- a property test against an independent, object-per-sample model of the spec ----

class _Sample:
    def __init__(self, now: int) -> None:
        self.value = 0.0
        self.start = now
        self.last = now


class _ModelRate:
    """The spec (docs/kafka-quota-semantics.md 1.2) written as plainly as possible."""

    def __init__(self, samples: int, window_ms: int) -> None:
        self.n = samples
        self.w = window_ms
        self.samples: list[_Sample] = []
        self.current = 0

    def record(self, value: float, now: int) -> None:
        if not self.samples:
            self.samples.append(_Sample(now))
        sample = self.samples[self.current]
        if now - sample.start >= self.w:
            self.current = (self.current + 1) % (self.n + 1)
            if self.current == len(self.samples):
                self.samples.append(_Sample(now))
            else:
                self.samples[self.current] = _Sample(now)
            sample = self.samples[self.current]
        sample.value += value
        sample.last = now

    def purge(self, now: int) -> None:
        for i, s in enumerate(self.samples):
            if now - s.last >= self.n * self.w:
                self.samples[i] = _Sample(now)

    def window(self, now: int) -> int:
        self.purge(now)
        if not self.samples:
            self.samples.append(_Sample(now))
        elapsed = now - min(s.start for s in self.samples)
        full = elapsed // self.w
        if full < self.n - 1:
            elapsed += (self.n - 1 - full) * self.w
        return max(elapsed, 1)

    def total(self, now: int) -> float:
        self.purge(now)
        total = 0.0
        for s in self.samples:
            total += s.value
        return total


_steps = st.lists(
    st.tuples(st.integers(min_value=0, max_value=4000),            # ms since previous step
              st.one_of(st.none(), st.integers(min_value=-50, max_value=5000))),  # None = measure
    max_size=60)


@settings(max_examples=150, deadline=None)
@given(samples=st.integers(min_value=1, max_value=5), window_ms=st.integers(min_value=1, max_value=1500),
       steps=_steps)
def test_matches_the_spec_model(samples: int, window_ms: int, steps: list[tuple[int, int | None]]) -> None:
    rate = SampledRate(RateConfig(samples, window_ms))
    model = _ModelRate(samples, window_ms)
    now = 1_000_000
    for gap, value in steps:
        now += gap
        if value is None:
            window = model.window(now)
            total = model.total(now)
            assert rate.window_size_ms(now) == window
            assert rate.total(now) == total
            assert rate.measure(now) == total / (window / 1000.0)
        else:
            rate.record(value, now)
            model.record(value, now)


# ---- SampledAvgMax: Kafka's Avg and Max over the metric window (throttle-time) ----

def test_avg_max_over_the_metric_window_not_the_life() -> None:

    assert (METRIC_WINDOW.samples, METRIC_WINDOW.window_ms) == (2, 30_000)  # Kafka's MetricConfig
    stat = SampledAvgMax()
    nan_avg, nan_max, none = stat.measure(0)
    assert math.isnan(nan_avg) and math.isnan(nan_max) and none == 0
    stat.record(100, 0)
    stat.record(500, 10_000)           # same sample (started at 0, 30 s long)
    stat.record(300, 31_000)           # a new sample
    assert stat.measure(40_000) == (300.0, 500.0, 3)
    # The first sample's last event (10 s) is N x W = 60 s old at 70 s: purged with its 500 ms max.
    assert stat.measure(70_000) == (300.0, 300.0, 1)
    avg, largest, count = stat.measure(91_000)   # everything purged: NaN, as Kafka
    assert math.isnan(avg) and math.isnan(largest) and count == 0
    stat.record(50, 95_000)
    assert stat.measure(95_000) == (50.0, 50.0, 1)


def test_avg_max_ring_reuses_samples() -> None:

    stat = SampledAvgMax(RateConfig(samples=2, window_ms=1000))
    for t in range(0, 10_000, 500):   # one event every 500 ms, values rising
        stat.record(t, t)
    # Three slots (N+1) hold samples starting at 7000, 8000 and 9000; the first one's last event
    # (7500) is N x W = 2 s old at 9500, so it is purged: 8000, 8500, 9000 and 9500 remain.
    assert stat.measure(9_500) == (8750.0, 9500.0, 4)


def test_recent_sum_keeps_one_span_and_says_when_there_is_room() -> None:
    from quotas.stats import RecentSum

    recent = RecentSum(1000)
    recent.add(300, 0)
    recent.add(500, 400)
    assert recent.total(999) == 800
    assert recent.total(1000) == 500          # the one at 0 leaves at 0 + 1000 (the span is (now-1000, now])
    recent.add(200, 1000)
    # 700 in the span; room for 300: the 500 of t=400 must leave, at 1400
    assert recent.wait_ms(1000, 300) == 400
    assert recent.wait_ms(1000, 700) == 0
    # room 0: all of it must leave; the last at 1000 leaves at 2000
    assert recent.wait_ms(1000, 0) == 1000
    recent.take_back(200, 1000)
    assert recent.total(1000) == 500
    assert recent.total(5000) == 0
