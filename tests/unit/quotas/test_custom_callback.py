"""A KIP-257 callback plugged into the manager: a Strimzi-style single shared quota."""

from __future__ import annotations

from quotas import (
    ClientIdentity,
    ClusterView,
    FakeClock,
    QuotaCallback,
    QuotaConfig,
    QuotaEntity,
    QuotaEntry,
    QuotaKind,
    QuotaManager,
    SensorKey,
)

P = QuotaKind.PRODUCE


class SharedQuota:
    """Everyone shares one rate per kind (as strimzi/kafka-quotas-plugin's StaticQuotaCallback)."""

    def __init__(self, limit: float | None) -> None:
        self.limit = limit
        self.reset = False
        self.events: list[tuple[object, ...]] = []
        self.closed = False

    def sensor_key(self, kind: QuotaKind, identity: ClientIdentity) -> SensorKey:
        return SensorKey(kind, "", "")

    def quota_limit(self, key: SensorKey) -> float | None:
        self.events.append(("limit", key.kind))
        return self.limit

    def update_quota(self, entity: QuotaEntity, kind: QuotaKind, value: float) -> None:
        self.events.append(("update", entity, kind, value))

    def remove_quota(self, entity: QuotaEntity, kind: QuotaKind) -> None:
        self.events.append(("remove", entity, kind))

    def quota_reset_required(self, kind: QuotaKind) -> bool:
        reset, self.reset = self.reset, False
        return reset

    def update_cluster_metadata(self, cluster: ClusterView) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


def test_custom_callback_shares_one_rate_and_is_always_enabled() -> None:
    callback = SharedQuota(1000.0)
    assert isinstance(callback, QuotaCallback)
    # No entries at all: with a custom callback Kafka's quotasEnabled is always true.
    m = QuotaManager(QuotaConfig(), FakeClock(), callback=callback)
    m.record_and_check(P, ClientIdentity("alice", "a"), 6000)
    decision = m.record_and_check(P, ClientIdentity("bob", "b"), 6000)
    # 12 000 B over the padded 10 s = 1200 B/s: (1200 - 1000) / 1000 * 10 000 = 2000 ms.
    assert decision.key == SensorKey(P, "", "") and decision.throttle_time_ms == 2000
    assert decision.entity is None and not decision.shadow  # the callback cannot say which entity


def test_config_changes_are_notified_as_updates_and_removals() -> None:
    callback = SharedQuota(1000.0)
    alice, bob = QuotaEntity(user="alice"), QuotaEntity(user="bob")
    first = QuotaConfig((QuotaEntry(alice, {P: 100, QuotaKind.FETCH: 200}), QuotaEntry(bob, {P: 300})))
    m = QuotaManager(first, FakeClock(), callback=callback)
    assert [e for e in callback.events if e[0] != "limit"] == [
        ("update", alice, P, 100.0), ("update", alice, QuotaKind.FETCH, 200.0), ("update", bob, P, 300.0)]
    callback.events.clear()
    # alice's produce changes, her fetch goes, bob is unchanged: only the differences are sent.
    m.update_config(QuotaConfig((QuotaEntry(alice, {P: 150}), QuotaEntry(bob, {P: 300}))))
    assert [e for e in callback.events if e[0] != "limit"] == [
        ("remove", alice, QuotaKind.FETCH), ("update", alice, P, 150.0)]


def test_limits_are_reread_only_on_update_or_reset() -> None:
    callback = SharedQuota(1000.0)
    m = QuotaManager(QuotaConfig(), FakeClock(), callback=callback)
    who = ClientIdentity("alice", "a")
    assert m.record_and_check(P, who, 5000).bound == 1000.0
    callback.limit = 400.0
    # Like Kafka, the bound lives with the sensor: a changed limit is not seen ...
    assert m.record_and_check(P, who, 0).bound == 1000.0
    # ... until the callback asks for a reset (polled on every lookup). History is kept:
    # 5000 B / 10 s = 500 B/s against 400: (500 - 400) / 400 * 10 000 = 2500 ms.
    callback.reset = True
    decision = m.record_and_check(P, who, 0)
    assert (decision.bound, decision.throttle_time_ms) == (400.0, 2500)


def test_unlimited_and_shadow_all_with_a_custom_callback() -> None:
    callback = SharedQuota(None)
    m = QuotaManager(QuotaConfig(shadow_all=True), FakeClock(), callback=callback)
    decision = m.record_and_check(P, ClientIdentity("alice", "a"), 10**9)
    assert decision.bound is None and decision.throttle_time_ms == 0 and decision.observed == 10**8
    callback.limit = 1.0
    callback.reset = True
    shadow = m.record_and_check(P, ClientIdentity("alice", "a"), 0)
    assert shadow.shadow and shadow.throttle_time_ms == 0 and shadow.would_throttle_ms > 0
    m.close()
    assert callback.closed
