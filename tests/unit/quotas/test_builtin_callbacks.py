"""The built-in callbacks with a fake clock: groups, partition-proportional quotas, fair shares.

The window is Kafka's default, 11 samples of 1 s; a rate over a young sensor is padded to 10 s
(Kafka's `SampledStat`), so X bytes recorded at t=0 measure X / 10 B/s.
"""

from __future__ import annotations

import pytest

from quotas import (
    DEFAULT,
    ClientIdentity,
    ClusterView,
    FakeClock,
    QuotaConfig,
    QuotaConfigError,
    QuotaEntity,
    QuotaEntry,
    QuotaKind,
    QuotaManager,
    SensorKey,
)
from quotas.builtin import FairShareCallback, GroupQuotaCallback, PartitionProportionalCallback

P = QuotaKind.PRODUCE
F = QuotaKind.FETCH

# ------------------------------------------------------------------------------------ groups


def groups() -> GroupQuotaCallback:
    return GroupQuotaCallback(groups=[
        {"name": "payments", "users": ["alice", "bob"], "client_ids": ["billing"],
         "producer_byte_rate": 1000},
        {"name": "readers", "users": ["alice"], "consumer_byte_rate": 5000},
    ])


def test_group_members_share_one_sensor_and_limit() -> None:
    config = QuotaConfig((QuotaEntry(QuotaEntity(user="carol"), {P: 300}),))
    m = QuotaManager(config, FakeClock(), callback=groups())
    alice = m.record_and_check(P, ClientIdentity("alice", "a1"), 6000)
    bob = m.record_and_check(P, ClientIdentity("bob", "b1"), 3000)
    billing = m.record_and_check(P, ClientIdentity("dave", "billing"), 3000)  # member by client id
    key = SensorKey(P, "<group:payments>", "")
    assert alice.key == bob.key == billing.key == key
    # 6000 + 3000 + 3000 = 12 000 B / 10 s = 1200 B/s against the group's 1000:
    # (1200 - 1000) / 1000 x 10 000 ms = 2000 ms
    assert billing.observed == 1200.0 and billing.bound == 1000.0 and billing.throttle_time_ms == 2000
    assert m.sensor_count == 1


def test_non_members_and_unset_kinds_fall_back_to_kafka_precedence() -> None:
    carol = QuotaEntity(user="carol")
    m = QuotaManager(QuotaConfig((QuotaEntry(carol, {P: 300, F: 700}),)), FakeClock(), callback=groups())
    d = m.record_and_check(P, ClientIdentity("carol", "c"), 1)
    assert d.key == SensorKey(P, "carol", "") and d.bound == 300.0 and d.entity == carol
    # alice is in "readers" for fetch, but bob has no fetch group: Kafka's precedence (none: unlimited)
    assert m.record_and_check(F, ClientIdentity("alice", "a"), 1).key == SensorKey(F, "<group:readers>", "")
    assert m.record_and_check(F, ClientIdentity("alice", "a"), 1).bound == 5000.0
    assert m.record_and_check(F, ClientIdentity("bob", "b"), 1).bound is None
    assert groups().quota_kinds == {P, F}


@pytest.mark.parametrize(("config", "message"), [
    ({"groups": [{"name": "g", "users": ["a"]}]}, "groups[0]: needs at least one of"),
    ({"groups": [{"name": "g", "producer_byte_rate": 1}]}, "groups[0]: needs users or client_ids"),
    ({"groups": [{"name": "g", "users": ["a"], "producer_byte_rate": 0}]}, "producer_byte_rate: must be > 0"),
    ({"groups": [{"name": "g", "users": ["a"], "producer_byte_rate": 1},
                 {"name": "g", "users": ["b"], "producer_byte_rate": 1}]}, "groups[1]: duplicate group name"),
    ({"groups": [{"name": "<x>", "users": ["a"], "producer_byte_rate": 1}]}, "groups[0].name"),
])
def test_group_config_errors_name_the_key(config: dict[str, object], message: str) -> None:
    with pytest.raises(QuotaConfigError) as info:
        GroupQuotaCallback(**config)
    assert message in str(info.value)


# --------------------------------------------------------------------- partition-proportional


def proportional(broker_id: int | None, **config: object) -> QuotaManager:
    entries = QuotaConfig((QuotaEntry(QuotaEntity(client_id=DEFAULT), {P: 3000}),))
    callback = PartitionProportionalCallback(broker_id=broker_id, **config)
    return QuotaManager(entries, FakeClock(), callback=callback)


def test_limit_follows_the_share_of_leaders_and_moves_with_them() -> None:
    who = ClientIdentity("u", "writer")
    m1, m2, m3 = proportional(1), proportional(2), proportional(3)
    # before any metadata: the total on every broker
    assert [m.record_and_check(P, who, 1).bound for m in (m1, m2, m3)] == [3000.0] * 3
    view = ClusterView({"orders": (1, 1, 2)})
    for m in (m1, m2, m3):
        assert m.update_cluster_metadata(view)
    key = SensorKey(P, "", "writer")
    # broker 1 leads 2 of 3 partitions: 3000 x 2/3; broker 2: 3000 x 1/3; broker 3: none, so the
    # floor min_share 0.01: 3000 x 0.01 = 30
    assert [m.quota_bound(key) for m in (m1, m2, m3)] == [2000.0, 1000.0, 30.0]
    # a leader moves from 1 to 3: the limits follow, sensors and history stay
    moved = ClusterView({"orders": (1, 3, 2)})
    # broker 2's share is unchanged: its limits are not re-read
    assert [m.update_cluster_metadata(moved) for m in (m1, m2, m3)] == [True, False, True]
    assert [m.quota_bound(key) for m in (m1, m2, m3)] == [1000.0, 1000.0, 1000.0]
    assert m1.record_and_check(P, who, 0).observed == 0.1  # the 1 B from before: 1 / 10 s
    # the same view again changes nothing and re-reads nothing
    assert not m1.update_cluster_metadata(ClusterView({"orders": (1, 3, 2)}))


def test_topic_rules_pick_the_topics_counted_and_bootstrap_keeps_the_total() -> None:
    rules = {"topics": [{"client_id": "orders-app", "topics": ["orders*"]}]}
    m2 = proportional(2, **rules)
    m2.update_cluster_metadata(ClusterView({"orders-eu": (1, 2), "orders-us": (2, 2), "logs": (1, 1, 1, 1)}))
    # orders-app counts orders-*: broker 2 leads 3 of 4 -> 2250; anyone else counts every topic:
    # broker 2 leads 3 of 8 -> 1125
    assert m2.record_and_check(P, ClientIdentity("u", "orders-app"), 1).bound == 2250.0
    assert m2.record_and_check(P, ClientIdentity("u", "other"), 1).bound == 1125.0
    bootstrap = proportional(None)
    bootstrap.update_cluster_metadata(ClusterView({"logs": (1,)}))
    assert bootstrap.record_and_check(P, ClientIdentity("u", "other"), 1).bound == 3000.0


# -------------------------------------------------------------------------------- fair shares


def fair(clock: FakeClock, **extra: object) -> QuotaManager:
    callback = FairShareCallback(capacity={"producer_byte_rate": 4000},
                                 shares=[{"user": "alice", "shares": 1}, {"user": "bob", "shares": 3}],
                                 active_ms=5000, **extra)
    return QuotaManager(QuotaConfig(), clock, callback=callback)


def test_alone_an_entity_gets_the_whole_capacity_and_contenders_split_by_shares() -> None:
    clock = FakeClock()
    m = fair(clock)
    alice, bob = ClientIdentity("alice", "a"), ClientIdentity("bob", "b")
    assert m.record_and_check(P, alice, 1).bound == 4000.0  # alone: all of it
    clock.advance(100)
    # bob arrives: bound while he is being looked up counts him, 4000 x 3/4
    assert m.record_and_check(P, bob, 1).bound == 3000.0
    clock.advance(100)
    # the active set changed: the next lookup re-reads every limit, alice 4000 x 1/4
    assert m.record_and_check(P, alice, 1).bound == 1000.0
    assert m.quota_bound(SensorKey(P, "bob", "")) == 3000.0
    # bob goes quiet; once alice records more than active_ms (5 s) after bob's last record he
    # leaves the active set and alice gets all of it again
    clock.advance(4_900)  # t = 5100: bob last recorded at 100, 5000 ms ago: still active
    assert m.record_and_check(P, alice, 1).bound == 1000.0
    clock.advance(1)  # 5101 - 100 > 5000: bob inactive, the change shows at the next lookup
    m.record_and_check(P, alice, 1)
    assert m.record_and_check(P, alice, 1).bound == 4000.0


def test_unlisted_entities_get_default_shares_by_client_id_and_other_kinds_follow_kafka() -> None:
    clock = FakeClock()
    m = fair(clock, default_shares=2)
    m.record_and_check(P, ClientIdentity("x", "loader"), 1)
    m.record_and_check(P, ClientIdentity("alice", "a"), 1)
    d = m.record_and_check(P, ClientIdentity("y", "loader"), 1)  # same client id: same group
    # loader: 2 shares, alice 1: 4000 x 2/3
    assert d.key == SensorKey(P, "", "loader") and d.bound == pytest.approx(4000 * 2 / 3)
    assert m.record_and_check(F, ClientIdentity("x", "loader"), 1).bound is None  # no fetch capacity


def test_fair_share_config_errors() -> None:
    with pytest.raises(QuotaConfigError, match="capacity"):
        FairShareCallback(capacity={})
    with pytest.raises(QuotaConfigError, match=r"shares\[0\]: needs a user or a client_id"):
        FairShareCallback(capacity={"producer_byte_rate": 1}, shares=[{"shares": 1}])
