"""KIP-257 extras: cluster metadata for callbacks that want it, swapping a callback live, and the
cost of polling `quota_reset_required` per request."""

from __future__ import annotations

from typing import ClassVar

from quotas import (
    NO_LEADER,
    ClientIdentity,
    ClusterView,
    DefaultQuotaCallback,
    FakeClock,
    QuotaCallback,
    QuotaConfig,
    QuotaEntity,
    QuotaEntry,
    QuotaKind,
    QuotaManager,
    RateConfig,
    SensorKey,
)

P = QuotaKind.PRODUCE
ALICE = ClientIdentity("alice", "app")
BOB = ClientIdentity("bob", "app")


class Everyone:
    """Everyone shares one rate; the limit is 1000 B/s per broker that leads something."""

    wants_cluster_metadata: ClassVar[bool] = True

    def __init__(self) -> None:
        self.views: list[ClusterView] = []
        self.closed = False
        self.updates: list[tuple[QuotaEntity, QuotaKind, float]] = []

    def sensor_key(self, kind: QuotaKind, identity: ClientIdentity) -> SensorKey:
        return SensorKey(kind, "", "")

    def quota_limit(self, key: SensorKey) -> float | None:
        brokers = len(self.views[-1].brokers) if self.views else 1
        return 1000.0 * max(brokers, 1)

    def update_quota(self, entity: QuotaEntity, kind: QuotaKind, value: float) -> None:
        self.updates.append((entity, kind, value))

    def remove_quota(self, entity: QuotaEntity, kind: QuotaKind) -> None:
        pass

    def quota_reset_required(self, kind: QuotaKind) -> bool:
        return False

    def update_cluster_metadata(self, cluster: ClusterView) -> bool:
        self.views.append(cluster)
        return True

    def close(self) -> None:
        self.closed = True


def config() -> QuotaConfig:
    return QuotaConfig((QuotaEntry(QuotaEntity(user="alice"), {P: 500}),), window=RateConfig(11, 1000))


def test_cluster_view_counts_leaders_and_merges_partial_responses() -> None:
    view = ClusterView().merged({"orders": [(0, 1), (1, 1), (2, 2)], "logs": [(0, 3), (1, NO_LEADER)]})
    assert view.leader_counts() == {1: 2, 2: 1, 3: 1}
    assert view.leader_share(1, ["orders"]) == 2 / 3
    assert view.leader_share(3, ["orders"]) == 0.0
    assert view.leader_share(1, ["nothing"]) is None
    assert view.brokers == {1, 2, 3}
    # a response about orders only replaces orders; unchanged data gives the same object back
    moved = view.merged({"orders": [(0, 2), (1, 2), (2, 2)]})
    assert moved.leader_counts(["orders"]) == {2: 3} and moved.topics["logs"] == (3, NO_LEADER)
    assert moved.merged({"orders": [(2, 2), (0, 2), (1, 2)]}) is moved
    assert moved.merged({}, gone=["logs"]).topics.keys() == {"orders"}
    assert hash(view) == hash(ClusterView(dict(view.topics))) and view == ClusterView(dict(view.topics))


def test_default_callback_is_a_quota_callback_and_ignores_metadata() -> None:
    callback = DefaultQuotaCallback()
    assert isinstance(callback, QuotaCallback) and isinstance(Everyone(), QuotaCallback)
    assert not DefaultQuotaCallback.wants_cluster_metadata
    m = QuotaManager(config(), FakeClock())
    assert not m.wants_cluster_metadata
    assert not m.update_cluster_metadata(ClusterView({"t": (1,)}))


def test_metadata_update_rereads_limits() -> None:
    callback = Everyone()
    m = QuotaManager(config(), FakeClock(), callback=callback)
    assert m.record_and_check(P, ALICE, 1).bound == 1000.0
    assert m.update_cluster_metadata(ClusterView({"t": (1, 2, 3)}))
    # three brokers lead partitions now: 3 x 1000; the live sensor was re-bound, not replaced
    assert m.quota_bound(SensorKey(P, "", "")) == 3000.0
    assert m.record_and_check(P, BOB, 1).bound == 3000.0


def test_swapping_the_callback_keeps_config_and_history_of_keys_produced_again() -> None:
    clock = FakeClock()
    m = QuotaManager(config(), clock)  # Kafka's default: alice has 500 B/s under key (alice, "")
    m.record_and_check(P, ALICE, 6000)
    m.record_and_check(P, BOB, 3000)  # bob: unlimited, key ("", "app")
    assert m.sensor_count == 2
    old = m.callback
    new = Everyone()
    m.set_callback(new)
    assert m.callback is new and m.wants_cluster_metadata
    # the new callback was told the configuration; the old one is closed on replacement
    assert new.updates == [(QuotaEntity(user="alice"), P, 500.0)]
    assert isinstance(old, DefaultQuotaCallback)
    assert m.sensor_count == 0  # nothing exported until the new callback binds keys
    decision = m.record_and_check(P, ALICE, 1000)
    # ("", "") is a new key: a fresh rate. 1000 B over the padded 10 s window = 100 B/s.
    assert decision.key == SensorKey(P, "", "") and decision.observed == 100.0
    assert decision.bound == 1000.0

    # back to the default: alice's key (alice, "") comes back within the sweep interval, and
    # with it the 6000 B recorded before the first swap. 6000 / 10 s = 600 B/s > 500: throttled.
    m.set_callback(DefaultQuotaCallback(sticky_levels=False))
    assert new.closed
    back = m.record_and_check(P, ALICE, 0)
    assert back.key == SensorKey(P, "alice", "") and back.observed == 600.0 and back.bound == 500.0
    assert back.throttle_time_ms == 2000  # (600 - 500) / 500 x 10 000 ms

    # keys not produced again are dropped at the next sweep (30 s of clock time)
    clock.advance(30_000)
    m.record_and_check(P, ALICE, 0)
    m.set_callback(Everyone())
    m.record_and_check(P, ALICE, 0)
    assert [s.key for s in m.sensors()] == [SensorKey(P, "", "")]


class Polled(Everyone):
    wants_cluster_metadata: ClassVar[bool] = False

    def __init__(self) -> None:
        super().__init__()
        self.polls = 0

    def quota_reset_required(self, kind: QuotaKind) -> bool:
        self.polls += 1
        return False


def test_reset_flag_is_polled_once_per_lookup_and_stays_cheap() -> None:
    callback = Polled()
    clock = FakeClock()
    custom = QuotaManager(config(), clock, callback=callback)
    default = QuotaManager(config(), clock)
    n = 20_000
    for _ in range(10):
        custom.record_and_check(P, ALICE, 1)
    assert callback.polls == 10  # one poll per request

    for _ in range(n):
        custom.record_and_check(P, ALICE, 1)
        default.record_and_check(P, ALICE, 1)
    # the poll is one method call per request, never more (its cost is a benchmark's business, not a
    # unit test's: wall-clock ratios are not stable on a loaded machine)
    assert callback.polls == 10 + n
