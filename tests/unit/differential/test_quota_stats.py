"""The compiled quota stats (quotas._speedups) against their pure-Python reference, float for float.

Hypothesis drives the same random sequences of record / measure calls, with random clocks (forward
steps, idle gaps longer than the retention, and a clock that steps back) and random window configs,
through (a) the stats themselves and (b) a whole `QuotaManager` built once on each implementation
(windowed and token-bucket rate models, shadow entries, quota changes, fleet shares, fetch
admission and un-record). Every result must be identical: floats compared bit for bit
(`float.hex`), throttle times, recorded totals and the rendered state.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotas import fastpath, manager, stats
from quotas.clock import FakeClock
from quotas.config import QuotaConfig
from quotas.entity import ClientIdentity, QuotaKind
from quotas.stats import RateConfig
from tests.unit.differential.impls import built

SETTINGS = settings(max_examples=150, deadline=None)


def compiled() -> Any:
    """quotas._speedups."""
    return built(fastpath.COMPILED_MODULE, "quotas._speedups")


def exact(value: Any) -> Any:
    """A value with every float replaced by its hex form, so -0.0 != 0.0 and NaN == NaN."""
    if isinstance(value, float):
        return value.hex()
    if isinstance(value, tuple):
        return tuple(exact(v) for v in value)
    return value


def test_the_selector_uses_the_compiled_twins_unless_told_otherwise() -> None:
    impl = compiled()
    if os.environ.get("SLUICE_PURE_PYTHON"):
        assert fastpath.IMPLEMENTATION == "pure"
        assert fastpath.SampledRateImpl is stats.SampledRate
        assert fastpath.TokenBucketImpl is stats.TokenBucket
    else:
        assert fastpath.IMPLEMENTATION == "compiled"
        assert fastpath.SampledRateImpl is impl.SampledRate
        assert fastpath.TokenBucketImpl is impl.TokenBucket
        assert manager.SampledRateImpl is impl.SampledRate


@pytest.mark.both_twins
@pytest.mark.parametrize(("pure_env", "expected"), [("1", "pure"), ("yes", "pure"), ("", "compiled")])
def test_sluice_pure_python_picks_the_reference_stats(pure_env: str, expected: str) -> None:
    compiled()
    env = {**os.environ, "SLUICE_PURE_PYTHON": pure_env}
    code = ("from quotas import fastpath, manager, stats; "
            "print(fastpath.IMPLEMENTATION, manager.SampledRateImpl is stats.SampledRate, "
            "fastpath.describe())")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True,
                         timeout=60).stdout.split(maxsplit=2)
    assert out[0] == expected
    assert out[1] == str(expected == "pure")
    assert out[2].startswith("compiled (quotas._speedups)" if expected == "compiled" else "pure Python")


# --- the stats alone ------------------------------------------------------------------------------

configs = st.builds(RateConfig, samples=st.integers(1, 12), window_ms=st.integers(1, 5_000))
# a step of the clock: mostly forward within a window, sometimes an idle gap beyond the retention,
# sometimes back (the reference's truncation of a negative elapsed time toward zero)
steps = st.one_of(st.integers(0, 3_000), st.integers(3_000, 200_000), st.integers(-5_000, -1))
values = st.one_of(st.floats(-1e6, 1e9, allow_nan=False), st.integers(-10**6, 10**9),
                   st.sampled_from([0.0, -0.0, 1e-300, 5e-324, 1.0 / 3.0]))
rate_ops = st.lists(st.tuples(st.sampled_from(["record", "measure", "parts", "total", "size"]), steps,
                              values), max_size=60)


@pytest.mark.both_twins
@SETTINGS
@given(config=configs, start=st.integers(-10**12, 10**12), ops=rate_ops)
def test_sampled_rate_twin_gives_the_same_floats(config: RateConfig, start: int,
                                                  ops: list[tuple[str, int, float]]) -> None:
    pure = stats.SampledRate(config)
    fast = compiled().SampledRate(config)
    assert fast.config is config
    now = start
    for op, step, value in ops:
        now += step
        if op == "record":
            pure.record(value, now)
            fast.record(value, now)
            continue
        if op == "measure":
            assert exact(fast.measure(now)) == exact(pure.measure(now))
        elif op == "parts":
            assert exact(fast.measure_parts(now)) == exact(pure.measure_parts(now))
        elif op == "total":
            assert exact(fast.total(now)) == exact(pure.total(now))
        else:
            assert fast.window_size_ms(now) == pure.window_size_ms(now)
        assert repr(fast) == repr(pure)
    assert repr(fast) == repr(pure)


bucket_ops = st.lists(st.tuples(st.booleans(), steps, values,
                                st.floats(0.0, 1e9, allow_nan=False),     # quota (units/s)
                                st.floats(0.0, 1e10, allow_nan=False)),   # burst
                      max_size=60)


@pytest.mark.both_twins
@SETTINGS
@given(start=st.integers(-10**12, 10**12), ops=bucket_ops)
def test_token_bucket_twin_gives_the_same_floats(start: int,
                                                 ops: list[tuple[bool, int, float, float, float]]) -> None:
    pure = stats.TokenBucket()
    fast = compiled().TokenBucket()
    assert repr(fast) == repr(pure)
    now = start
    for is_record, step, value, quota, burst in ops:
        now += step
        if is_record:
            pure.record(value, quota, burst, now)
            fast.record(value, quota, burst, now)
        else:
            assert exact(fast.measure(quota, burst, now)) == exact(pure.measure(quota, burst, now))
        assert repr(fast) == repr(pure)


# --- through the quota manager ---------------------------------------------------------------------

@contextmanager
def manager_on(impl: str) -> Iterator[None]:
    """QuotaManager instances built inside use the pure or the compiled stats."""
    module = compiled()
    rate, bucket = ((stats.SampledRate, stats.TokenBucket) if impl == "pure"
                    else (module.SampledRate, module.TokenBucket))
    with (mock.patch.object(manager, "SampledRateImpl", rate),
          mock.patch.object(manager, "TokenBucketImpl", bucket)):
        yield


CLIENTS = ("a", "b", "c")
P, F, R = QuotaKind.PRODUCE, QuotaKind.FETCH, QuotaKind.REQUEST_PERCENTAGE


def quota_config(model: str, burst_ms: int | None, bounds: dict[str, float],
                 shadow: frozenset[str]) -> QuotaConfig:
    entries: list[dict[str, Any]] = []
    for client, bound in bounds.items():
        entries.append({"client_id": client, "producer_byte_rate": bound, "consumer_byte_rate": bound,
                        "request_percentage": max(bound / 1000.0, 1.0), "shadow": client in shadow})
    data: dict[str, Any] = {"rate_model": model, "entries": entries}
    if burst_ms is not None:
        data["burst_ms"] = burst_ms
    return QuotaConfig.from_dict(data)


bounds_st = st.dictionaries(st.sampled_from(CLIENTS), st.integers(1, 2_000_000).map(float), min_size=1)
manager_ops = st.lists(st.one_of(
    st.tuples(st.just("produce"), st.sampled_from(CLIENTS), st.integers(0, 3_000_000)),
    st.tuples(st.just("request"), st.sampled_from(CLIENTS), st.floats(0.0, 50.0, allow_nan=False)),
    st.tuples(st.just("fetch"), st.sampled_from(CLIENTS), st.integers(0, 3_000_000)),
    st.tuples(st.just("unrecord"), st.sampled_from(CLIENTS), st.integers(0, 3_000_000)),
    st.tuples(st.just("advance"), st.just(""), st.one_of(st.integers(0, 2_000), st.integers(2_000, 40_000))),
    st.tuples(st.just("bounds"), st.just(""), bounds_st),
    st.tuples(st.just("shares"), st.sampled_from(CLIENTS),
              st.floats(0.05, 1.0, allow_nan=False, exclude_min=False)),
), max_size=50)


def run_manager(model: str, burst_ms: int | None, window: RateConfig, bounds: dict[str, float],
                shadow: frozenset[str], ops: list[tuple[str, str, Any]]) -> list[Any]:
    """Every observable outcome of `ops` on a fresh manager, as exact values."""
    clock = FakeClock(1_000_000)
    quotas = manager.QuotaManager(quota_config(model, burst_ms, bounds, shadow), clock, window)
    seen: list[Any] = []
    for op, client, arg in ops:
        who = ClientIdentity("ANONYMOUS", client)
        if op == "advance":
            clock.advance(arg)
        elif op == "bounds":
            quotas.update_config(quota_config(model, burst_ms, arg, shadow))
        elif op == "shares":
            key = quotas.record_and_check(P, who, 0).key
            quotas.set_shares({key: arg}, 1.0, busy=frozenset({key}))
        elif op == "unrecord":
            quotas.unrecord(F, who, arg)
        elif op == "fetch":
            admission = quotas.admit_fetch(who, arg)
            d = admission.decision
            seen.append(("fetch", admission.recorded, admission.throttle_is_debt, d.would_throttle_ms,
                         d.throttle_time_ms, exact(d.observed), exact(d.bound), d.shadow))
        else:
            decision = quotas.record_and_check(P if op == "produce" else R, who, arg)
            seen.append((op, decision.would_throttle_ms, decision.throttle_time_ms, exact(decision.observed),
                         exact(decision.bound), decision.shadow))
    now = clock.now_ms()
    seen.extend(("sensor", snap.key, exact(snap.rate.measure_parts(now)), repr(snap.rate))
                for snap in quotas.sensors())
    seen.extend(("usage", usage.key, exact(usage.used_total), usage.throttle_count, exact(usage.base_bound),
                 exact(usage.share)) for usage in quotas.fleet_usage())
    return seen


@pytest.mark.both_twins
@settings(max_examples=120, deadline=None)
@given(model=st.sampled_from(["windowed", "token_bucket"]),
       burst_ms=st.one_of(st.none(), st.integers(1, 2_000)),
       window=st.builds(RateConfig, samples=st.integers(2, 11), window_ms=st.sampled_from([100, 500, 1000])),
       bounds=bounds_st, shadow=st.frozensets(st.sampled_from(CLIENTS)), ops=manager_ops)
def test_the_manager_decides_the_same_on_both_stats(model: str, burst_ms: int | None, window: RateConfig,
                                                     bounds: dict[str, float], shadow: frozenset[str],
                                                     ops: list[tuple[str, str, Any]]) -> None:
    if burst_ms is not None and burst_ms > window.retention_ms:
        burst_ms = window.retention_ms
    with manager_on("pure"):
        expected = run_manager(model, burst_ms, window, bounds, shadow, ops)
    with manager_on("compiled"):
        got = run_manager(model, burst_ms, window, bounds, shadow, ops)
    assert got == expected


@pytest.mark.both_twins
def test_the_manager_differential_can_fail() -> None:
    """The comparison sees a difference: a twin that rounds its window differently is caught."""

    class Skewed(stats.SampledRate):
        def measure_parts(self, now_ms: int) -> tuple[float, int]:
            total, window_ms = super().measure_parts(now_ms)
            return total, window_ms + 1

    ops: list[tuple[str, str, Any]] = [("produce", "a", 5_000_000), ("produce", "a", 1)]
    with manager_on("pure"):
        expected = run_manager("windowed", None, RateConfig(), {"a": 1000.0}, frozenset(), ops)
    with mock.patch.object(manager, "SampledRateImpl", Skewed):
        skewed = run_manager("windowed", None, RateConfig(), {"a": 1000.0}, frozenset(), ops)
    assert skewed != expected
