"""`quotas.connection_limits`: connection counts, KIP-612's per-IP creation rate, the buffer budget
and the ip entries of the quotas section, with a fake clock (no time passes unless told)."""

from __future__ import annotations

import pytest

from quotas.clock import FakeClock
from quotas.config import QuotaConfig
from quotas.connection_limits import (
    CONNECTION_CREATION_RATE,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_IP,
    BufferBudget,
    ConnectionAdmission,
    ConnectionLimiter,
    ConnectionVerdict,
    IpConnectionRates,
    canonical_ip,
    split_ip_entries,
)
from quotas.engine import QuotaEngine
from quotas.errors import QuotaConfigError
from quotas.stats import RateConfig


def test_per_ip_count_refuses_only_that_ip_until_one_closes() -> None:
    limiter = ConnectionLimiter(max_connections=100, max_connections_per_ip=2)
    assert limiter.admit("10.0.0.1").allowed and limiter.admit("10.0.0.1").allowed
    assert limiter.admit("10.0.0.1") == ConnectionAdmission(False, MAX_CONNECTIONS_PER_IP, 0)
    assert limiter.admit("10.0.0.2").allowed  # another address is not affected
    limiter.release("10.0.0.1")
    assert limiter.admit("10.0.0.1").allowed
    assert limiter.count("10.0.0.1") == 2 and limiter.total == 3  # the refused ones were never counted


def test_per_ip_overrides_are_kafkas_max_connections_per_ip_overrides() -> None:
    limiter = ConnectionLimiter(100, 1, per_ip_overrides={"10.0.0.9": 3, "10.0.0.6": 0})
    assert [limiter.admit("10.0.0.9").allowed for _ in range(4)] == [True, True, True, False]
    assert [limiter.admit("10.0.0.1").allowed for _ in range(2)] == [True, False]  # the default, 1
    assert limiter.admit("10.0.0.6").reason == MAX_CONNECTIONS_PER_IP            # 0: none at all


def test_total_count_refuses_every_ip_once_full() -> None:
    limiter = ConnectionLimiter(max_connections=3, max_connections_per_ip=10)
    for ip in ("a", "b", "c"):
        assert limiter.admit(ip).allowed
    assert limiter.admit("d") == ConnectionAdmission(False, MAX_CONNECTIONS, 0)
    limiter.release("b")
    assert limiter.admit("d").allowed


def test_release_without_admission_is_a_bug() -> None:
    with pytest.raises(ValueError, match="no admitted connection"):
        ConnectionLimiter(1, 1).release("10.0.0.9")


def verb(rates: dict[str, float], clock: FakeClock | None = None,
         window: RateConfig | None = None) -> tuple[QuotaEngine, ConnectionLimiter]:
    """The engine's `new_connection` verb, and a limiter that asks it (as the proxy's does)."""
    config = QuotaConfig() if window is None else QuotaConfig(window=window)
    engine = QuotaEngine(config, clock or FakeClock(0), ip_connection_rates=rates)
    return engine, ConnectionLimiter(10_000, 10_000, engine.new_connection)


def test_creation_rate_throttle_time_is_kafkas() -> None:
    # window 11 x 1000 ms: a fresh sensor divides by (11-1) x 1000 = 10 s. Quota 10/s, so 100
    # connections at t=0 are 10.0/s (allowed, <= bound); the 101st makes 101/10 s = 10.1/s:
    # throttle = (10.1 - 10) / 10 x 10000 ms = 100 ms, and it is un-recorded (back to 100).
    engine, limiter = verb({"<default>": 10})
    for _ in range(100):
        assert limiter.admit("10.0.0.1").allowed
    assert limiter.admit("10.0.0.1") == ConnectionAdmission(False, CONNECTION_CREATION_RATE, 100, 10.0)
    assert engine.ip_connection_rates.rate("10.0.0.1", 0) == pytest.approx(10.0)  # un-recorded
    assert limiter.admit("10.0.0.1").throttle_ms == 100   # the next one again
    assert limiter.admit("10.0.0.2").allowed  # per IP: another address has its own rate
    assert limiter.count("10.0.0.1") == 100       # throttled connections are not counted open


def test_the_verb_returns_a_typed_verdict() -> None:
    engine, _ = verb({"<default>": 10, "198.51.100.7": 1})
    for n in range(1, 11):  # the n-th at t=0: n / 10 s (a fresh sensor's window), <= 1/s
        verdict = engine.new_connection("198.51.100.7")
        assert (verdict.throttle_ms, verdict.bound, verdict.allowed) == (0, 1.0, True)
        assert verdict.rate_per_s == pytest.approx(n / 10)
    # the 11th: 11 / 10 s = 1.1/s > 1: (1.1 - 1) / 1 x 10 000 ms = 1 000 ms, capped at one window
    # (1 000 ms, Kafka's boundedThrottleTime); un-recorded, so the rate stays 1.0/s
    over = engine.new_connection("198.51.100.7")
    assert over == ConnectionVerdict(1000, 1.0, 1.0) and not over.allowed
    # an IP of no entry and no <default>: unlimited, nothing recorded
    unlimited, _ = verb({"198.51.100.7": 1})
    assert unlimited.new_connection("203.0.113.1") == ConnectionVerdict(0, 0.0, None)


def test_per_ip_override_and_the_cap_of_one_window() -> None:
    # 198.51.100.7 may open 1/s: the 11th at t=0 is 11 / 10 s = 1.1/s, (1.1 - 1) / 1 x 10000 ms =
    # 1000 ms, which is also the cap (one window, Kafka's boundedThrottleTime).
    engine, limiter = verb({"<default>": 10, "198.51.100.7": 1})
    for _ in range(10):
        assert limiter.admit("198.51.100.7").allowed
    assert limiter.admit("198.51.100.7").throttle_ms == 1000
    rates = engine.ip_connection_rates
    assert rates.quota_for("198.51.100.7") == 1 and rates.quota_for("203.0.113.1") == 10


def test_creation_rate_recovers_once_the_window_has_passed() -> None:
    # Quota 1/s: 10 connections at t=0 fill it (10 / 10 s). Samples whose last event is >= 11 x
    # 1000 ms old are purged, so at t=11000 the rate starts from nothing and the IP is admitted.
    clock = FakeClock(0)
    _, limiter = verb({"<default>": 1}, clock, RateConfig(11, 1000))
    for _ in range(10):
        assert limiter.admit("10.0.0.1").allowed
    assert not limiter.admit("10.0.0.1").allowed
    clock.advance(11_000)
    assert limiter.admit("10.0.0.1").allowed


def test_no_ip_quota_means_unlimited_and_no_sensor() -> None:
    engine, limiter = verb({})
    assert all(limiter.admit("10.0.0.1").allowed for _ in range(5_000))
    assert not engine.ip_connection_rates.enabled and engine.ip_connection_rates.sensor_count == 0


def test_idle_ip_sensors_are_dropped_after_the_retention() -> None:
    # Sensors idle for 11 x 1000 ms hold nothing Kafka would count any more: dropped at the next
    # record, so memory follows the recently seen addresses only.
    rates = IpConnectionRates({"<default>": 100})
    for i in range(50):
        rates.record(f"10.0.1.{i}", 0)
    assert rates.sensor_count == 50
    rates.record("10.0.2.1", 11_000)
    assert rates.sensor_count == 1


def test_buffer_budget_pauses_the_biggest_holder_and_resumes_below_three_quarters() -> None:
    budget = BufferBudget(1000)  # resume at 750
    assert budget.update(1, 600).pause == ()          # 600 <= 1000
    change = budget.update(2, 500)                     # 1100 > 1000: the biggest, 1, pauses
    assert change.pause == (1,) and budget.is_paused(1) and not budget.is_paused(2)
    assert budget.update(2, 700).pause == (2,)         # 1300: 1 is paused already, so 2 (the biggest left)
    assert budget.update(1, 100) == budget.update(1, 100)  # 800 > 750: both stay paused
    assert budget.is_paused(1) and budget.is_paused(2)
    change = budget.update(2, 0)                       # 100 <= 750: every paused connection resumes
    assert change.resume == (1, 2) and budget.total_bytes == 100 and budget.holders() == [1]
    budget.remove(1)
    assert budget.total_bytes == 0 and budget.holders() == []


def test_buffer_budget_never_pauses_a_connection_holding_nothing() -> None:
    budget = BufferBudget(100)
    assert budget.update(1, 150).pause == (1,)
    assert budget.update(2, 0).pause == ()  # 2 holds nothing: nothing more to pause


def test_ip_entries_are_split_from_the_quota_entries() -> None:
    rates, rest = split_ip_entries({"shadow": False, "entries": [
        {"ip": "<default>", "connection_creation_rate": 10},
        {"user": "alice", "producer_byte_rate": 1024},
        {"ip": "::FFFF:127.0.0.2", "connection_creation_rate": 3},
        {"ip": "127.0.0.3", "connection_creation_rate": 5.0}]})
    assert rates == {"<default>": 10.0, "127.0.0.2": 3.0, "127.0.0.3": 5.0}  # IPv4-mapped: as IPv4
    assert rest == {"shadow": False, "entries": [{"user": "alice", "producer_byte_rate": 1024}]}


@pytest.mark.parametrize(("entry", "key", "why"), [
    ({"ip": "not-an-ip", "connection_creation_rate": 1}, "quotas.entries[0].ip", "an IP address"),
    ({"ip": "<default>"}, "quotas.entries[0].connection_creation_rate", "required"),
    ({"ip": "<default>", "connection_creation_rate": 0}, "quotas.entries[0].connection_creation_rate",
     ">= 1"),
    ({"ip": "<default>", "connection_creation_rate": 1.5}, "quotas.entries[0].connection_creation_rate",
     "whole number"),
    ({"ip": "<default>", "connection_creation_rate": 2, "producer_byte_rate": 5},
     "quotas.entries[0].producer_byte_rate", "unknown key for an ip entry"),
    ({"user": "bob", "connection_creation_rate": 2}, "quotas.entries[0].connection_creation_rate",
     "only to an ip entry"),
])
def test_bad_ip_entries_name_the_key(entry: dict[str, object], key: str, why: str) -> None:
    with pytest.raises(QuotaConfigError) as err:
        split_ip_entries({"entries": [entry]})
    assert key in str(err.value) and why in str(err.value)


def test_canonical_ip_spells_each_address_once() -> None:
    assert canonical_ip("::ffff:10.0.0.1") == "10.0.0.1"  # a dual-stack socket's IPv4 client
    assert canonical_ip("2001:DB8:0:0::1") == "2001:db8::1"
    with pytest.raises(ValueError):
        canonical_ip("host.example")


def test_duplicate_ip_entries_are_refused() -> None:
    with pytest.raises(QuotaConfigError, match=r"entries\[1\].ip: duplicate ip 10.0.0.1"):
        split_ip_entries({"entries": [{"ip": "10.0.0.1", "connection_creation_rate": 1},
                                      {"ip": "10.0.0.1", "connection_creation_rate": 2}]})
