"""Sensor lifetime: Kafka drops a sensor after 1 h without a record, with its history."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from quotas import (
    DEFAULT,
    SENSOR_SWEEP_INTERVAL_MS,
    ClientIdentity,
    FakeClock,
    QuotaConfig,
    QuotaEntity,
    QuotaEntry,
    QuotaKind,
    QuotaManager,
    SensorKey,
)

P = QuotaKind.PRODUCE
HOUR_MS = 3_600_000


def _manager(clock: FakeClock, expiry_ms: int = HOUR_MS) -> QuotaManager:
    cfg = QuotaConfig((QuotaEntry(QuotaEntity(client_id=DEFAULT), {P: 1000}),))
    return QuotaManager(cfg, clock, sensor_idle_expiry_ms=expiry_ms)


def test_expires_after_more_than_an_hour_idle() -> None:
    clock = FakeClock()
    m = _manager(clock)
    m.record_and_check(P, ClientIdentity("u", "a"), 100)
    clock.set(HOUR_MS)
    # Kafka's Sensor.hasExpired is strict: now - lastRecord > 3 600 000.
    assert m.expire_idle_sensors() == 0 and m.sensor_count == 1
    clock.set(HOUR_MS + 1)
    assert m.expire_idle_sensors() == 1 and m.sensor_count == 0


def test_recording_keeps_a_sensor_alive_checking_does_not() -> None:
    clock = FakeClock()
    m = _manager(clock)
    busy, idle = ClientIdentity("u", "busy"), ClientIdentity("u", "idle")
    m.record_and_check(P, busy, 1)
    m.record_and_check(P, idle, 1)
    clock.set(HOUR_MS - 10)
    m.record_and_check(P, busy, 1)
    m.check(P, idle)  # a read is not activity
    clock.set(HOUR_MS + 1)
    assert m.expire_idle_sensors() == 1
    assert [key for key, _, _ in m.sensors()] == [SensorKey(P, "", "busy")]


def test_history_is_lost_with_the_sensor() -> None:
    clock = FakeClock()
    m = _manager(clock)
    who = ClientIdentity("u", "a")
    m.record_and_check(P, who, 9000)  # 900 B/s
    clock.advance(HOUR_MS + 1)
    m.expire_idle_sensors()
    # A new sensor: only this record, over the padded 10 s.
    assert m.record_and_check(P, who, 500).observed == 50.0


def test_sweeps_run_lazily_every_thirty_seconds() -> None:
    clock = FakeClock()
    m = _manager(clock, expiry_ms=60_000)
    m.record_and_check(P, ClientIdentity("u", "old"), 1)
    clock.set(60_001)  # "old" is now expired, but nobody swept yet
    assert m.sensor_count == 1
    m.record_and_check(P, ClientIdentity("u", "new"), 1)  # 60 001 ms since the last sweep: sweeps
    assert m.sensor_count == 1
    assert [key.client_id for key, _, _ in m.sensors()] == ["new"]
    # Within the next 30 s no sweep runs, however many calls arrive.
    clock.advance(SENSOR_SWEEP_INTERVAL_MS - 1)
    m.record_and_check(P, ClientIdentity("u", "other"), 1)
    assert m.binding_count == 2


def test_churn_of_100k_client_ids_stays_bounded() -> None:
    # One new client id every 50 ms for 5000 s (longer than the 1 h expiry). Each has its own
    # sensor under /clients/<default>. Live sensors are those recorded in the last hour:
    # 3 600 000 / 50 = 72 000, plus at most one sweep interval (30 s / 50 ms = 600) not yet swept.
    clock = FakeClock()
    m = _manager(clock)
    peak_sensors = peak_bindings = 0
    for i in range(100_000):
        clock.advance(50)
        m.record_and_check(P, ClientIdentity("u", f"c{i}"), 1)
        if i % 1000 == 0:
            peak_sensors = max(peak_sensors, m.sensor_count)
            peak_bindings = max(peak_bindings, m.binding_count)
    assert 72_000 <= m.sensor_count <= 72_000 + 600
    assert peak_sensors <= 72_000 + 600
    # The identity -> sensor cache is emptied on every sweep: at most 600 + 1 entries.
    assert peak_bindings <= 601 and m.binding_count <= 601
    clock.advance(HOUR_MS + 1)
    live = m.sensor_count
    assert m.expire_idle_sensors() == live
    assert m.sensor_count == 0 and m.binding_count == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(min_value=0, max_value=60_000), st.integers(min_value=0, max_value=5),
                          st.booleans()), max_size=80))
def test_expiry_matches_brute_force(steps: list[tuple[int, int, bool]]) -> None:
    # Random records (or plain checks) for six client ids with a 100 s expiry, and an explicit
    # expire_idle_sensors() after each. Model: a sensor lives while now - last record <= 100 s;
    # the manager also sweeps by itself when a call comes >= 30 s after the previous sweep; a
    # check creates a missing sensor but does not refresh an existing one (as Kafka's reads).
    clock = FakeClock()
    m = _manager(clock, expiry_ms=100_000)
    last_record: dict[str, int] = {}
    last_sweep = 0

    def sweep(now: int) -> None:
        for c, t in list(last_record.items()):
            if now - t > 100_000:
                del last_record[c]

    for gap, client, record in steps:
        now = clock.advance(gap)
        if now - last_sweep >= SENSOR_SWEEP_INTERVAL_MS:
            sweep(now)
        who = ClientIdentity("u", f"c{client}")
        if record:
            m.record_and_check(P, who, 1)
            last_record[who.client_id] = now
        else:
            m.check(P, who)
            last_record.setdefault(who.client_id, now)
        m.expire_idle_sensors()
        sweep(now)
        last_sweep = now
        assert {key.client_id for key, _, _ in m.sensors()} == set(last_record)
