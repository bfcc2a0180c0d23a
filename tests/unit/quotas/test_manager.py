"""QuotaManager against Kafka's ClientQuotaManagerTest and the semantics doc, on a fake clock."""

from __future__ import annotations

import math

import pytest

from quotas import (
    DEFAULT,
    ClientIdentity,
    FakeClock,
    QuotaConfig,
    QuotaConfigError,
    QuotaEntity,
    QuotaEntry,
    QuotaKind,
    QuotaManager,
    RateConfig,
    SensorKey,
    ThrottleDecision,
    ThrottleStats,
    ThrottleTime,
)

P = QuotaKind.PRODUCE
F = QuotaKind.FETCH
ANON = ClientIdentity("ANONYMOUS", "unknown")


def config(*entries: tuple[QuotaEntity, dict[QuotaKind, float]] | QuotaEntry, shadow_all: bool = False,
           window: RateConfig | None = None) -> QuotaConfig:
    built = tuple(e if isinstance(e, QuotaEntry) else QuotaEntry(e[0], e[1]) for e in entries)
    return QuotaConfig(built, shadow_all=shadow_all, window=window or RateConfig())


def manager(*entries: tuple[QuotaEntity, dict[QuotaKind, float]] | QuotaEntry, shadow_all: bool = False,
            window: RateConfig | None = None) -> tuple[QuotaManager, FakeClock]:
    clock = FakeClock()
    return QuotaManager(config(*entries, shadow_all=shadow_all, window=window), clock), clock


# ---- ClientQuotaManagerTest.testQuotaViolation, every step ----

def test_quota_violation() -> None:
    m, clock = manager((QuotaEntity(client_id=DEFAULT), {P: 500}))
    # 400 B/s for 10 s against 500 B/s: never throttled. At t = 0 the rate is 400 B over the
    # padded 10 s = 40 B/s; at t = 9 s, 4000 B over 9 s (9 full windows < N-1 = 10), padded to
    # 10 s = 400 B/s.
    observed = []
    for _ in range(10):
        decision = m.record_and_check(P, ANON, 400)
        assert decision.throttle_time_ms == 0
        observed.append(decision.observed)
        clock.advance(1000)
    assert observed == [40.0 * n for n in range(1, 11)]

    # A spike at 10.5 s: 400*10 + 2300 = 6300 B over 10.5 s = 600 B/s (the last window is half
    # complete). (600 - 500) / 500 * 10 500 ms = 2100 ms.
    clock.advance(500)
    decision = m.record_and_check(P, ANON, 2300)
    assert decision == ThrottleDecision(P, SensorKey(P, "", "unknown"), 2100, 600.0, 500.0, False,
                                        QuotaEntity(client_id=DEFAULT))
    assert decision.throttle_time_ms == 2100

    # The client waits out its throttle, then keeps sending 400 B/s: delays continue until the
    # bursty sample rolls out. Samples are dropped once their last event is >= 11 s old.
    clock.advance(2100)  # t = 12.6 s
    expected = [
        # t = 12.6 s: samples from 0 s and 1 s are gone; 2 s..9 s (8 * 400) + 2300 + 400 = 5900 B
        # since 2 s: 5900 / 10.6 = 556.6 B/s -> (556.6 - 500) / 500 * 10 600 = 1200 ms.
        1200,
        # 13.6 s .. 19.6 s: each second one old 400 B sample leaves, a new one arrives: the same
        # 5900 B over 10.6 s, 1200 ms each time.
        1200, 1200, 1200, 1200, 1200, 1200, 1200,
        # 20.6 s: the 9 s sample is gone; 2300 (opened 10.5 s, still < 11 s old) + 9 * 400 = 5900 B
        # over 20.6 - 10.5 = 10.1 s = 584.2 B/s -> 84.16 / 500 * 10 100 = 1700 ms.
        1700,
        # 21.6 s: the burst sample is 11.1 s old and gone: 10 * 400 B since 12.6 s; 9 s elapsed,
        # padded to 10 s: 400 B/s, under quota.
        0,
    ]
    actual = []
    for _ in range(10):
        actual.append(m.record_and_check(P, ANON, 400).throttle_time_ms)
        clock.advance(1000)
    assert actual == expected
    # 22.6 s: "unthrottled since bursty sample has rolled over": 4000 B over 10 s = 400 B/s.
    final = m.record_and_check(P, ANON, 0)
    assert (final.throttle_time_ms, final.observed) == (0, 400.0)


def test_hundred_megabyte_burst_on_a_fresh_sensor() -> None:
    # 1 MB/s quota; one 100 MB produce on a fresh sensor is averaged over the padded 10 s:
    # O = 10 MB/s, X = (10 - 1) / 1 * 10 000 ms = 90 000 ms. Byte rates are not capped.
    m, _ = manager((QuotaEntity(user="alice"), {P: 1_000_000}))
    decision = m.record_and_check(P, ClientIdentity("alice", "app"), 100_000_000)
    assert (decision.observed, decision.throttle_time_ms) == (10_000_000.0, 90_000)


def test_fresh_sensor_allows_a_ten_times_burst() -> None:
    # First second of traffic divides by 10 s: exactly 10x the quota is allowed (strict >) ...
    m, _ = manager((QuotaEntity(user="alice"), {P: 1000}))
    alice = ClientIdentity("alice", "app")
    at_bound = m.record_and_check(P, alice, 10_000)
    assert (at_bound.observed, at_bound.bound, at_bound.throttle_time_ms) == (1000.0, 1000.0, 0)
    # ... and one more byte is over: 10 001 / 10 = 1000.1 B/s -> 0.1 / 1000 * 10 000 = 1 ms.
    over = m.record_and_check(P, alice, 1)
    assert (over.observed, over.throttle_time_ms) == (1000.1, 1)


def test_violation_is_strictly_greater_than_bound() -> None:
    m, clock = manager((QuotaEntity(client_id="c"), {F: 100}))
    c = ClientIdentity("u", "c")
    clock.set(5000)
    # 1000 B over 10 s = 100.0 B/s exactly: not a violation (Kafka's Quota.acceptable is v <= bound;
    # at O = T the formula would give 0 ms anyway).
    decision = m.record_and_check(F, c, 1000)
    assert decision.observed == 100.0 and decision.throttle_time_ms == 0 and not decision.violated


def test_throttle_rounds_half_up() -> None:
    # samples=9: a fresh sensor is padded to (9-1) * 1 s = 8 s, so every step is exact in binary.
    # 1032 B / 8 s = 129 B/s against 128 B/s: (129 - 128) / 128 * 8000 = 62.5 ms -> 63 (Java's
    # Math.round; Python's round(62.5) is 62).
    m, _ = manager((QuotaEntity(user="u"), {P: 128}), window=RateConfig(samples=9, window_ms=1000))
    decision = m.record_and_check(P, ClientIdentity("u", ""), 1032)
    assert (decision.observed, decision.throttle_time_ms) == (129.0, 63)


# ---- ClientQuotaManagerTest.testQuotaConfigPrecedence, ported ----

def test_quota_config_precedence() -> None:
    clock = FakeClock(1_000_000)  # time never moves in this test: every record is at one instant
    cfg = config(
        (QuotaEntity(user=DEFAULT), {P: 1000}),
        (QuotaEntity(client_id=DEFAULT), {P: 2000}),
        (QuotaEntity(user=DEFAULT, client_id=DEFAULT), {P: 3000}),
        (QuotaEntity(user="userA"), {P: 4000}),
        (QuotaEntity(user="userA", client_id="client1"), {P: 5000}),
        (QuotaEntity(user="userB"), {P: 6000}),
        (QuotaEntity(user="userB", client_id="client1"), {P: 7000}),
        (QuotaEntity(user="userB", client_id=DEFAULT), {P: 8000}),
        (QuotaEntity(user="userC"), {P: 10000}),
        (QuotaEntity(client_id="client1"), {P: 9000}),
    )
    m = QuotaManager(cfg, clock)

    def check(user: str, client: str, bound: float, value: int, throttled: bool) -> None:
        who = ClientIdentity(user, client)
        # getMaxValueInQuotaWindow = bound * (N-1) * 1 s.
        assert m.max_value_in_quota_window(P, who) == 10 * bound
        # Records value * 11 at one instant: the rate is (sum so far) / 10 s (padded).
        decision = m.record_and_check(P, who, value * 11)
        assert decision.bound == bound
        assert (decision.throttle_time_ms > 0) is throttled, decision

    check("userA", "client1", 5000, 4500, False)  # <user, client> quota takes precedence over <user>
    check("userA", "client2", 4000, 4500, True)   # <user> quota takes precedence over <client> and defaults
    check("userA", "client3", 4000, 0, True)      # <user> quota is shared across clients of user
    check("userA", "client1", 5000, 0, False)     # <user, client> is exclusive use, unaffected by others

    check("userB", "client1", 7000, 8000, True)
    check("userB", "client2", 8000, 7000, False)  # default per-client quota, exclusive to <user, client>
    check("userB", "client3", 8000, 7000, False)

    check("userD", "client1", 3000, 3500, True)   # default <user, client> quota
    check("userD", "client2", 3000, 2500, False)
    check("userE", "client1", 3000, 2500, False)

    # Remove default <user, client> quota config, revert to <user> default.
    cfg = cfg.without_entity(QuotaEntity(user=DEFAULT, client_id=DEFAULT))
    m.update_config(cfg)
    check("userD", "client1", 1000, 0, False)     # metric tags changed, restart counter
    check("userE", "client4", 1000, 1500, True)
    check("userF", "client4", 1000, 800, False)   # default <user> quota shared across clients of user
    check("userF", "client5", 1000, 800, True)

    # Remove default <user> quota config, revert to <client-id> default.
    cfg = cfg.without_entity(QuotaEntity(user=DEFAULT))
    m.update_config(cfg)
    check("userF", "client4", 2000, 0, False)     # default <client-id> quota shared across users
    check("userF", "client5", 2000, 0, False)
    check("userF", "client5", 2000, 2500, True)
    check("userG", "client5", 2000, 0, True)

    # Update quotas.
    cfg = cfg.with_value(QuotaEntity(user="userA"), P, 8000).with_value(
        QuotaEntity(user="userA", client_id="client1"), P, 10000)
    m.update_config(cfg)
    check("userA", "client2", 8000, 0, False)
    check("userA", "client2", 8000, 4500, True)   # throttled due to sum of new and earlier values
    check("userA", "client1", 10000, 0, False)
    check("userA", "client1", 10000, 6000, True)
    cfg = cfg.without_entity(QuotaEntity(user="userA", client_id="client1"))
    m.update_config(cfg)
    check("userA", "client6", 8000, 0, True)      # throttled due to shared user quota
    cfg = cfg.with_value(QuotaEntity(user="userA", client_id="client6"), P, 11000)
    m.update_config(cfg)
    check("userA", "client6", 11000, 8500, False)
    cfg = cfg.with_value(QuotaEntity(user="userA", client_id=DEFAULT), P, 12000).without_entity(
        QuotaEntity(user="userA", client_id="client6"))
    m.update_config(cfg)
    check("userA", "client6", 12000, 4000, True)  # throttled due to sum of new and earlier values


# ---- sharing ----

def test_client_ids_of_one_user_share_the_user_quota() -> None:
    # /users/u: 1000 B/s for all of u's client ids together. 6000 + 6000 B over 10 s = 1200 B/s.
    m, _ = manager((QuotaEntity(user="u"), {P: 1000}))
    first = m.record_and_check(P, ClientIdentity("u", "a"), 6000)
    second = m.record_and_check(P, ClientIdentity("u", "b"), 6000)
    assert first.key == second.key == SensorKey(P, "u", "")
    assert (first.throttle_time_ms, second.observed) == (0, 1200.0)
    assert second.throttle_time_ms == 2000  # (1200 - 1000) / 1000 * 10 000


def test_user_default_client_quota_applies_per_client_id() -> None:
    # /users/u/clients/<default>: 1000 B/s for each client id separately.
    m, _ = manager((QuotaEntity(user="u", client_id=DEFAULT), {P: 1000}))
    first = m.record_and_check(P, ClientIdentity("u", "a"), 6000)
    second = m.record_and_check(P, ClientIdentity("u", "b"), 6000)
    assert first.key == SensorKey(P, "u", "a") and second.key == SensorKey(P, "u", "b")
    assert second.observed == 600.0 and second.throttle_time_ms == 0


def test_kinds_have_separate_sensors() -> None:
    m, _ = manager((QuotaEntity(user="u"), {P: 1000, F: 1000}))
    u = ClientIdentity("u", "a")
    m.record_and_check(P, u, 9000)
    assert m.record_and_check(F, u, 9000).observed == 900.0


def test_empty_client_id_is_unlimited_under_client_id_quotas() -> None:
    m, _ = manager((QuotaEntity(client_id=DEFAULT), {P: 10}))
    decision = m.record_and_check(P, ClientIdentity("u", ""), 1_000_000)
    assert decision.key == SensorKey(P, "", "") and decision.bound is None and decision.throttle_time_ms == 0
    # It is still measured: 1 MB over the padded 10 s.
    assert decision.observed == 100_000.0


# ---- quotasEnabled ----

def test_nothing_recorded_until_a_quota_of_that_kind_exists() -> None:
    m, _ = manager((QuotaEntity(user="u"), {F: 100}))
    u = ClientIdentity("u", "a")
    decision = m.record_and_check(P, u, 1_000_000)
    assert decision.bound is None and decision.observed == 0.0 and decision.throttle_time_ms == 0
    assert all(s.key.kind is F for s in m.sensors()) and m.sensor_count == 0
    # Once a produce quota exists, recording starts from nothing: the earlier 1 MB was never counted.
    m.update_config(m.config.with_value(QuotaEntity(user="u"), P, 1000))
    assert m.record_and_check(P, u, 100).observed == 10.0


@pytest.mark.parametrize("sticky", [True, False])
def test_quotas_enabled_is_sticky_like_kafka_up_to_4_0(sticky: bool) -> None:
    clock = FakeClock()
    cfg = config((QuotaEntity(user="u"), {P: 1000}))
    # The default is Kafka <= 4.0's sticky behaviour.
    m = QuotaManager(cfg, clock) if sticky else QuotaManager(cfg, clock, sticky_quotas_enabled=False)
    u = ClientIdentity("u", "a")
    m.record_and_check(P, u, 5000)
    m.update_config(QuotaConfig())  # every quota removed
    decision = m.record_and_check(P, u, 5000)
    assert decision.bound is None and decision.throttle_time_ms == 0
    if sticky:
        # Still recorded into the (now unlimited) sensor: 10 000 B over 10 s.
        assert decision.observed == 1000.0 and m.sensor_count == 1
    else:
        # Kafka 4.1+ (KAFKA-19282): nothing recorded once no quota of the kind is left.
        assert decision.observed == 0.0


# ---- live updates ----

def test_update_keeps_history() -> None:
    m, clock = manager((QuotaEntity(user="u"), {P: 1000}))
    u = ClientIdentity("u", "a")
    m.record_and_check(P, u, 8000)  # 800 B/s
    clock.advance(500)
    m.update_config(m.config.with_value(QuotaEntity(user="u"), P, 500))
    # The rate continues: 8000 + 1000 B over 10.5 s = 857.1 B/s against the new 500 B/s.
    # (857.14 - 500) / 500 * 10 500 = 7500 ms.
    decision = m.record_and_check(P, u, 1000)
    assert decision.bound == 500.0
    assert decision.observed == pytest.approx(9000 / 10.5)
    assert decision.throttle_time_ms == 7500


def test_removed_quota_is_unlimited_but_keeps_measuring() -> None:
    m, _ = manager((QuotaEntity(user="u"), {P: 100}), (QuotaEntity(user="v"), {P: 100}))
    u = ClientIdentity("u", "a")
    assert m.record_and_check(P, u, 5000).throttle_time_ms > 0
    m.update_config(m.config.without_entity(QuotaEntity(user="u")))
    decision = m.record_and_check(P, u, 5000)
    assert decision.bound is None and decision.throttle_time_ms == 0
    # u's key stays (u, "") as the user level is still in use (by v): the same sensor goes on.
    assert decision.key == SensorKey(P, "u", "") and decision.observed == 1000.0
    assert m.quota_bound(SensorKey(P, "u", "")) is None


def test_window_cannot_change_at_runtime() -> None:
    m, _ = manager((QuotaEntity(user="u"), {P: 100}))
    with pytest.raises(QuotaConfigError) as err:
        m.update_config(config((QuotaEntity(user="u"), {P: 100}), window=RateConfig(samples=5)))
    assert err.value.key == "window"


def test_window_comes_from_the_config() -> None:
    # samples=3, window 2 s: a fresh sensor is padded to (3-1) * 2 s = 4 s.
    m, _ = manager((QuotaEntity(user="u"), {P: 100}), window=RateConfig(samples=3, window_ms=2000))
    assert m.rate_config == RateConfig(3, 2000)
    assert m.record_and_check(P, ClientIdentity("u", ""), 400).observed == 100.0


# ---- shadow ----

def test_shadow_entry_computes_but_does_not_throttle() -> None:
    m, _ = manager(QuotaEntry(QuotaEntity(user="u"), {P: 100}, shadow=True),
                   (QuotaEntity(user="v"), {P: 100}))
    shadowed = m.record_and_check(P, ClientIdentity("u", "a"), 2000)
    # 2000 B / 10 s = 200 B/s: (200 - 100) / 100 * 10 000 = 10 000 ms, not enforced.
    assert shadowed.shadow and shadowed.throttle_time_ms == 0 and shadowed.would_throttle_ms == 10_000
    assert shadowed.entity == QuotaEntity(user="u")
    enforced = m.record_and_check(P, ClientIdentity("v", "a"), 2000)
    assert not enforced.shadow and enforced.throttle_time_ms == enforced.would_throttle_ms == 10_000


def test_shadow_all() -> None:
    m, _ = manager((QuotaEntity(user="u"), {P: 100}), shadow_all=True)
    decision = m.record_and_check(P, ClientIdentity("u", "a"), 2000)
    assert decision.shadow and decision.throttle_time_ms == 0 and decision.would_throttle_ms == 10_000
    # Turning shadow_all off applies to the existing sensor (history kept): 4000 B / 10 s.
    m.update_config(m.config.with_shadow_all(False))
    decision = m.record_and_check(P, ClientIdentity("u", "a"), 2000)
    assert not decision.shadow and decision.throttle_time_ms == 30_000


# ---- request quotas ----

@pytest.mark.parametrize("kind", [QuotaKind.REQUEST_PERCENTAGE, QuotaKind.REQUEST_RATE])
def test_request_quotas_cap_throttle_at_one_window(kind: QuotaKind) -> None:
    m, _ = manager((QuotaEntity(user="u"), {kind: 10}))
    u = ClientIdentity("u", "a")
    # 105 / 10 s = 10.5 per s: (10.5 - 10) / 10 * 10 000 = 500 ms, under the cap.
    assert m.record_and_check(kind, u, 105).throttle_time_ms == 500
    # 405 / 10 s = 40.5: 30 500 ms uncapped, capped at quota.window.size = 1000 ms.
    decision = m.record_and_check(kind, u, 300)
    assert decision.throttle_time_ms == 1000 and decision.would_throttle_ms == 1000


def test_request_rate_counts_requests() -> None:
    # Sluice's requests/second quota: record 1 per request. 5 req/s; 51 requests at once over the
    # padded 10 s = 5.1 req/s -> 0.1 / 5 * 10 000 = 200 ms.
    m, _ = manager((QuotaEntity(client_id=DEFAULT), {QuotaKind.REQUEST_RATE: 5}))
    who = ClientIdentity("u", "app")
    decisions = [m.record_and_check(QuotaKind.REQUEST_RATE, who, 1) for _ in range(51)]
    assert [d.throttle_time_ms for d in decisions[:50]] == [0] * 50
    assert decisions[50].throttle_time_ms == 200


# ---- check / record / unrecord ----

def test_check_measures_without_recording() -> None:
    m, _ = manager((QuotaEntity(user="u"), {P: 100}))
    u = ClientIdentity("u", "a")
    assert m.check(P, u).observed == 0.0
    m.record_and_check(P, u, 2000)
    before = m.check(P, u)
    assert (before.observed, before.would_throttle_ms) == (200.0, 10_000)
    assert m.check(P, u).observed == 200.0  # checking twice changes nothing
    assert m.check(F, u).bound is None       # no fetch quota anywhere


def test_unrecord_takes_back_a_throttled_fetch() -> None:
    m, _ = manager((QuotaEntity(user="u"), {F: 100}))
    u = ClientIdentity("u", "a")
    m.record_and_check(F, u, 500)
    throttled = m.record_and_check(F, u, 1000)  # 1500 / 10 s = 150 B/s -> 5000 ms
    assert throttled.throttle_time_ms == 5000
    m.unrecord(F, u, 1000)  # the client gets an empty response instead
    assert m.check(F, u).observed == 50.0


def test_record_without_check() -> None:
    m, _ = manager((QuotaEntity(user="u"), {QuotaKind.REQUEST_PERCENTAGE: 10}))
    u = ClientIdentity("u", "a")
    m.record(QuotaKind.REQUEST_PERCENTAGE, u, 500)  # network-thread time: no decision
    assert m.check(QuotaKind.REQUEST_PERCENTAGE, u).observed == 50.0


def test_max_value_in_quota_window() -> None:
    m, _ = manager((QuotaEntity(user="u"), {F: 100}))
    # KAFKA-9677: quota * (N-1) * W_s = 100 * 10 * 1 = 1000 B per fetch at most.
    assert m.max_value_in_quota_window(F, ClientIdentity("u", "a")) == 1000.0
    assert m.max_value_in_quota_window(P, ClientIdentity("u", "a")) == math.inf


# ---- throttle statistics ----

def test_throttle_stats_count_non_zero_throttles() -> None:
    m, _ = manager((QuotaEntity(user="u"), {P: 100}),
                   QuotaEntry(QuotaEntity(user="s"), {P: 100}, shadow=True))
    u = ClientIdentity("u", "a")
    m.record_and_check(P, u, 500)    # 50 B/s: no throttle, not counted
    m.record_and_check(P, u, 700)    # 120 B/s: 2000 ms
    m.record_and_check(P, u, 300)    # 150 B/s: 5000 ms
    stats = m.throttle_stats(SensorKey(P, "u", ""))
    assert stats == ThrottleStats(count=2, total_ms=7000, max_ms=5000)
    assert stats.avg_ms == 3500.0
    assert m.shadow_throttle_stats(SensorKey(P, "u", "")) == ThrottleStats()
    assert math.isnan(ThrottleStats().avg_ms)

    m.record_and_check(P, ClientIdentity("s", "a"), 2000)  # shadow: 10 000 ms computed, not enforced
    assert m.throttle_stats(SensorKey(P, "s", "")) == ThrottleStats()
    assert m.shadow_throttle_stats(SensorKey(P, "s", "")) == ThrottleStats(1, 10_000, 10_000)
    assert m.throttle_stats(SensorKey(P, "nobody", "")) is None


def test_sensors_export() -> None:
    m, clock = manager((QuotaEntity(client_id=DEFAULT), {P: 100}))
    m.record_and_check(P, ClientIdentity("u", "a"), 10)
    clock.advance(7)
    m.record_and_check(P, ClientIdentity("u", "b"), 20)
    exported = {key: (rate.total(clock.now_ms()), last) for key, rate, last in m.sensors()}
    assert exported == {SensorKey(P, "", "a"): (10.0, 0), SensorKey(P, "", "b"): (20.0, 7)}
    assert m.quota_bound(SensorKey(P, "", "a")) == 100.0


def test_throttle_time_is_over_the_metric_window() -> None:
    """Kafka's `throttle-time` (avg, and max) covers the metric window (2 x 30 s), so a client that
    was throttled hard a minute ago and lightly now shows the light throttle only; the
    counts since creation stay in `throttle_stats`."""
    m, clock = manager((QuotaEntity(user="u"), {P: 100}))
    u = ClientIdentity("u", "a")
    key = SensorKey(P, "u", "")
    m.record_and_check(P, u, 700)   # 70 B/s: none
    none = m.throttle_time(key)
    assert none is not None and none.count == 0 and math.isnan(none.avg_ms) and math.isnan(none.max_ms)
    m.record_and_check(P, u, 500)   # 120 B/s: 2000 ms
    m.record_and_check(P, u, 300)   # 150 B/s: 5000 ms
    assert m.throttle_time(key) == ThrottleTime(3500.0, 5000.0, 2)
    clock.advance(60_000)           # N x W after the last throttle: out of the window
    gone = m.throttle_time(key)
    assert gone is not None and gone.count == 0 and math.isnan(gone.avg_ms)
    clock.advance(10_000)           # the rate's window has emptied as well: 1100 B over 10 s
    decision = m.record_and_check(P, u, 1100)
    assert decision.throttle_time_ms == 1000
    assert m.throttle_time(key) == ThrottleTime(1000.0, 1000.0, 1)
    assert m.throttle_stats(key) == ThrottleStats(count=3, total_ms=8000, max_ms=5000)
    assert m.throttle_time(SensorKey(P, "nobody", "")) is None
