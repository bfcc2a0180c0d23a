"""Storage-driven throttling policy (Strimzi proposal 003) with exact numbers."""

from __future__ import annotations

import pytest

from quotas import ClientIdentity, FakeClock, QuotaConfig, QuotaEntity, QuotaEntry, QuotaKind, QuotaManager
from quotas.errors import QuotaConfigError
from quotas.stats import RateConfig
from quotas.storage import (
    CompleteView,
    FactorDecision,
    FallbackReason,
    LimitType,
    StorageLimits,
    Threshold,
    VolumeUsage,
    hold_or_fallback,
    throttle_factor,
    validate_fallback_factor,
    volume_factor,
)

GB = 1_000_000_000


def vol(usable: int, total: int = 100 * GB, broker: int = 1, log_dir: str = "/data") -> VolumeUsage:
    return VolumeUsage(broker, log_dir, total, usable)


BYTES = StorageLimits.parse([{"type": "available_bytes_below", "soft": 5 * GB, "hard": 1 * GB}])


@pytest.mark.parametrize(("usable", "factor"), [
    (50 * GB, 1.0), (5 * GB + 1, 1.0), (5 * GB, 1.0), (3 * GB, 0.5), (2 * GB, 0.25),
    (1 * GB + 1, 0.25e-9), (1 * GB, 0.0), (0, 0.0)])
def test_linear_from_soft_to_hard(usable: int, factor: float) -> None:
    assert volume_factor(vol(usable), BYTES) == pytest.approx(factor, abs=1e-12)


def test_ratio_limits() -> None:
    limits = StorageLimits.parse([{"type": "available_ratio_below", "soft": 0.05, "hard": 0.01}])
    assert volume_factor(vol(10 * GB), limits) == 1.0
    assert volume_factor(vol(3 * GB), limits) == pytest.approx(0.5)
    assert volume_factor(vol(1 * GB), limits) == 0.0


def test_mixed_types_interpolate_in_bytes() -> None:
    # soft at 5 % of 100 GB = 5 GB, hard at 1 GB
    limits = StorageLimits.parse([{"type": "available_ratio_below", "soft": 0.05},
                                  {"type": "available_bytes_below", "hard": 1 * GB}])
    assert limits.soft == Threshold(LimitType.AVAILABLE_RATIO_BELOW, 0.05)
    assert volume_factor(vol(4 * GB), limits) == pytest.approx(0.75)
    # on a 10 GB volume soft is 0.5 GB, below hard: a step at hard
    assert volume_factor(vol(2 * GB, total=10 * GB), limits) == 1.0
    assert volume_factor(vol(1 * GB, total=10 * GB), limits) == 0.0


def test_soft_defaults_to_hard_a_step() -> None:
    limits = StorageLimits.parse([{"type": "available_bytes_below", "hard": 1 * GB}])
    assert limits.soft == limits.hard
    assert volume_factor(vol(1 * GB + 1), limits) == 1.0
    assert volume_factor(vol(1 * GB), limits) == 0.0


def test_minimum_over_volumes_names_the_throttling_volume() -> None:
    a, b, c = vol(50 * GB, broker=1), vol(2 * GB, broker=2, log_dir="/d2"), vol(3 * GB, broker=2)
    d = throttle_factor([a, b, c], BYTES, [1, 2], fallback_factor=1.0)
    assert d.factor == pytest.approx(0.25)
    assert d.throttling_volume == b
    assert not d.fallback_applied and d.reason is None
    ok = throttle_factor([a], BYTES, [1], fallback_factor=0.0)
    assert ok.factor == 1.0 and ok.throttling_volume is None and not ok.fallback_applied


def test_fallback_when_a_broker_has_no_log_dirs() -> None:
    d = throttle_factor([vol(50 * GB, broker=1)], BYTES, [1, 2], fallback_factor=0.3)
    assert (d.factor, d.fallback_applied, d.reason) == (0.3, True, FallbackReason.BROKER_WITHOUT_LOG_DIRS)
    assert "[2]" in d.detail


def test_fallback_when_the_poll_failed_or_no_brokers() -> None:
    d = throttle_factor([], BYTES, [1], fallback_factor=0.0, poll_error="connection refused")
    assert (d.factor, d.reason, d.detail) == (0.0, FallbackReason.POLL_FAILED, "connection refused")
    assert throttle_factor([], BYTES, [], fallback_factor=0.5).reason is FallbackReason.NO_BROKERS


@pytest.mark.parametrize(("limits", "key", "words"), [
    ([], "storage.limits", "hard"),
    ([{"type": "available_bytes_below", "soft": 5}], "storage.limits", "hard"),
    ([{"type": "available_bytes_below", "hard": 1}, {"type": "available_ratio_below", "hard": 0.1}],
     "storage.limits[1].hard", "at most one hard"),
    ([{"type": "available_bytes_below", "soft": 9, "hard": 1},
      {"type": "available_ratio_below", "soft": 0.1}],
     "storage.limits[1].soft", "at most one soft"),
    ([{"type": "available_bytes_below", "soft": 1, "hard": 5}], "storage.limits[0].soft", "must be >= hard"),
    ([{"type": "available_ratio_below", "hard": 1.5}], "storage.limits[0].hard", "between 0 and 1"),
    ([{"type": "available_bytes_below", "hard": -3}], "storage.limits[0].hard", "> 0"),
    ([{"type": "available_bytes_below", "hard": 1.5}], "storage.limits[0].hard", "whole number"),
    ([{"type": "used_bytes_above", "hard": 1}], "storage.limits[0].type", "available_bytes_below"),
    ([{"type": "available_bytes_below"}], "storage.limits[0]", "soft, hard or both"),
    ([{"type": "available_bytes_below", "hard": 1, "sfot": 2}], "storage.limits[0]", "unknown"),
])
def test_invalid_limits_name_the_key(limits: list[dict[str, object]], key: str, words: str) -> None:
    with pytest.raises(QuotaConfigError) as err:
        StorageLimits.parse(limits)
    assert any(k == key and words in r for k, r in err.value.problems), err.value.problems


def test_fallback_factor_range() -> None:
    assert validate_fallback_factor(0) == 0.0
    for bad in (-0.1, 1.01, True):
        with pytest.raises(QuotaConfigError, match=r"storage\.fallback_factor"):
            validate_fallback_factor(bad)


# -- applying the factor to produce quotas ---------------------------------------------------------

ALICE = ClientIdentity("alice", "app")
BOB = ClientIdentity("bob", "app")


def manager(clock: FakeClock) -> QuotaManager:
    cfg = QuotaConfig((QuotaEntry(QuotaEntity(user="alice"), {QuotaKind.PRODUCE: 1000.0,
                                                              QuotaKind.FETCH: 500.0}),),
                      window=RateConfig(samples=11, window_ms=1000))
    return QuotaManager(cfg, clock)


def test_scale_rebinds_bounds_and_keeps_history() -> None:
    clock = FakeClock(0)
    m = manager(clock)
    m.record_and_check(QuotaKind.PRODUCE, ALICE, 5000)
    clock.advance(1000)
    m.set_limit_scale(QuotaKind.PRODUCE, 0.5)
    d = m.check(QuotaKind.PRODUCE, ALICE)
    assert d.bound == 500.0
    assert d.observed == pytest.approx(5000 / 10)  # history kept: 5000 bytes over the 10 s floor
    assert m.check(QuotaKind.FETCH, ALICE).bound == 500.0  # other kinds untouched
    assert m.check(QuotaKind.PRODUCE, BOB).bound is None  # unlimited stays unlimited
    m.set_limit_scale(QuotaKind.PRODUCE, 1.0)
    assert m.check(QuotaKind.PRODUCE, ALICE).bound == 1000.0


def test_factor_zero_throttles_any_produce_for_one_full_window_at_most() -> None:
    clock = FakeClock(0)
    m = manager(clock)
    m.set_limit_scale(QuotaKind.PRODUCE, 0.0)
    d = m.record_and_check(QuotaKind.PRODUCE, ALICE, 1)
    assert d.bound == 0.0
    assert d.throttle_time_ms == 11_000  # samples x window, not int32 max
    m.set_limit_scale(QuotaKind.PRODUCE, 1.0)
    assert m.record_and_check(QuotaKind.PRODUCE, ALICE, 1).throttle_time_ms == 0


def test_scaled_throttle_is_kafkas_formula_below_the_cap() -> None:
    clock = FakeClock(0)
    m = manager(clock)
    m.set_limit_scale(QuotaKind.PRODUCE, 0.5)  # bound 500 B/s
    d = m.record_and_check(QuotaKind.PRODUCE, ALICE, 6000)  # 600 B/s over the 10 s floor
    assert d.throttle_time_ms == 2000  # (600 - 500) / 500 * 10 000
    with pytest.raises(ValueError):
        m.set_limit_scale(QuotaKind.PRODUCE, 1.5)


def test_quota_managers_apply_the_scale_to_brokers_seen_later() -> None:
    from quotas.engine import QuotaEngine

    clock = FakeClock(0)
    cfg = QuotaConfig((QuotaEntry(QuotaEntity(user="alice"), {QuotaKind.PRODUCE: 1000.0}),))
    managers = QuotaEngine(cfg, clock)
    early = managers.for_broker(1)
    managers.set_limit_scale(QuotaKind.PRODUCE, 0.25)
    assert early.check(QuotaKind.PRODUCE, ALICE).bound == 250.0
    assert managers.for_broker(2).check(QuotaKind.PRODUCE, ALICE).bound == 250.0


def test_an_offline_log_dir_counts_as_full() -> None:
    offline = VolumeUsage(2, "/data2", 0, 0, offline=True)
    assert volume_factor(offline, BYTES) == 0.0 and offline.available_ratio == 0.0
    d = throttle_factor([vol(50 * GB, broker=1), offline], BYTES, [1, 2], fallback_factor=1.0)
    assert (d.factor, d.fallback_applied, d.throttling_volume) == (0.0, False, offline)


FAILED = FactorDecision(1.0, True, FallbackReason.POLL_FAILED, detail="connection refused")


@pytest.mark.parametrize("last_factor", [0.0, 0.4, 1.0])
def test_a_failed_poll_holds_the_last_complete_factor_within_the_window(last_factor: float) -> None:
    last = CompleteView(FactorDecision(last_factor), at_ms=10_000)
    d = hold_or_fallback(FAILED, last, now_ms=10_000 + 299_999, validity_ms=300_000)
    assert (d.factor, d.held, d.fallback_applied, d.reason) == (last_factor, True, False,
                                                                FallbackReason.POLL_FAILED)


def test_after_the_window_the_fallback_applies_but_never_lifts_a_hard_stop() -> None:
    soft = CompleteView(FactorDecision(0.4), at_ms=0)
    assert hold_or_fallback(FAILED, soft, 300_000, 300_000) == FAILED  # expired: fallback 1.0
    stop = CompleteView(FactorDecision(0.0), at_ms=0)
    d = hold_or_fallback(FAILED, stop, 300_000, 300_000)
    assert (d.factor, d.fallback_applied, d.held) == (0.0, True, False)
    assert "hard stop stays" in d.detail
    assert hold_or_fallback(FAILED, stop, 300_000, 300_000, fallback_lifts_hard_stop=True) == FAILED


def test_complete_views_and_a_first_failed_poll_apply_as_they_are() -> None:
    fresh = FactorDecision(0.7)
    assert hold_or_fallback(fresh, CompleteView(FactorDecision(0.0), 0), 5, 1000) is fresh
    assert hold_or_fallback(FAILED, None, 5, 1000) is FAILED  # no complete view yet: the fallback
