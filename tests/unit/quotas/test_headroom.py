"""Headroom arithmetic, the usage document's JSON, the caller filter and the workers' merge."""

from __future__ import annotations

import json

import pytest

from quotas.entity import QuotaKind, SensorKey
from quotas.headroom import (
    UsageEntry,
    UsageFormatError,
    UsageReport,
    WorkerUsage,
    headroom,
    headroom_ratio,
    merge_worker_reports,
    select,
)

P = QuotaKind.PRODUCE


def test_headroom_is_limit_minus_rate_and_the_ratio_its_share_of_the_limit() -> None:
    assert headroom(400.0, 1000.0) == 600.0 and headroom_ratio(400.0, 1000.0) == 0.6
    assert headroom_ratio(0.0, 1000.0) == 1.0           # idle
    assert headroom_ratio(1000.0, 1000.0) == 0.0        # at the limit
    assert headroom_ratio(1250.0, 1000.0) == -0.25      # over it: (1000 - 1250) / 1000
    assert headroom_ratio(5.0, 0.0) == 0.0              # storage factor 0: no room at all
    assert headroom(5.0, None) is None and headroom_ratio(5.0, None) is None  # unlimited


def test_entry_labels_follow_the_sensor_tags_and_round_trip_through_json() -> None:
    prefix = UsageEntry.of_sensor("1", SensorKey(P, "alice", "", client_id_prefix="etl-"), 10.0, 100.0,
                                  base_limit=200.0, share=0.5, storage_factor=0.8,
                                  entity=(("user", "alice"), ("client-id", None)))
    topic = UsageEntry.of_sensor("all", SensorKey(QuotaKind.FETCH, "", "", topic_prefix="logs."), 3.0, None)
    assert (prefix.client_id, prefix.topic, topic.topic, topic.base_limit) == ("etl-*", "", "logs.*", None)
    doc = UsageReport(11_000, "broker", (prefix, topic)).to_json()
    assert doc["entries"][0] == {
        "broker": "1", "kind": "produce", "key": "producer_byte_rate", "user": "alice", "client_id": "etl-*",
        "topic": "", "tags": "", "unit": "bytes/s", "rate": 10.0, "limit": 100.0, "headroom": 90.0,
        "headroom_ratio": 0.9,
        "base_limit": 200.0, "share": 0.5, "storage_factor": 0.8, "shadow": False,
        "entity": {"user": "alice", "client-id": None}}
    assert doc["entries"][1]["limit"] is None and doc["entries"][1]["headroom_ratio"] is None
    # a callback's own tag (KIP-257's tag map): two teams are two entries, through JSON too
    teams = [UsageEntry.of_sensor("1", SensorKey.from_tags(P, {"team": t}), 1.0, 10.0) for t in ("a", "b")]
    assert [e.tags for e in teams] == ["team=a", "team=b"] and teams[0].group != teams[1].group
    back = UsageReport.from_json(UsageReport(11_000, "broker", tuple(teams)).to_json())
    assert [e.tags for e in back.entries] == ["team=a", "team=b"]
    back = UsageReport.from_json(json.loads(json.dumps(doc)))
    assert back == UsageReport(11_000, "broker", (prefix, topic))
    with pytest.raises(UsageFormatError):
        UsageReport.from_json({"version": 99, "entries": []})
    with pytest.raises(UsageFormatError):
        UsageReport.from_json({**doc, "entries": [{"kind": "produce"}]})


def test_select_finds_the_sensors_a_caller_or_a_topic_is_counted_in() -> None:
    def e(user: str, client: str, topic: str = "") -> UsageEntry:
        return UsageEntry("bootstrap", P, user, client, topic, 0.0, 1.0)

    alice_all, alice_app, app_any, etl, bob, logs, other = (
        e("alice", ""), e("alice", "app"), e("", "app"), e("", "etl-*"), e("bob", "app"),
        e("", "", "logs.*"), e("", "", "metrics"))
    entries = [alice_all, alice_app, app_any, etl, bob, logs, other]
    assert select(entries) == entries
    assert select(entries, user="alice") == [alice_all, alice_app]
    assert select(entries, client_id="etl-7") == [etl]
    # the caller alice/app is counted in alice's shared sensor, its own, and app's of every user
    assert select(entries, user="alice", client_id="app") == [alice_all, alice_app, app_any]
    assert select(entries, topic="logs.app") == [logs]
    assert select(entries, user="bob", client_id="app", topic="metrics") == [app_any, bob, other]


def test_workers_sum_rates_and_the_limit_is_the_budget_they_share() -> None:
    key = SensorKey(P, "alice", "")

    def report(*entries: UsageEntry) -> UsageReport:
        return UsageReport(11_000, "broker", entries)

    # budget 1000 B/s; worker 0 active with share 0.7 (700), worker 1 active with 0.3 (300),
    # worker 2 idle on a standby share of 1/3 (333.3): the limits sum to 1333.3 > 1000, so the
    # instance's limit is the budget, 1000; rates 650 + 280 + 0 = 930; headroom 70, ratio 0.07
    merged = merge_worker_reports({
        0: report(UsageEntry.of_sensor("bootstrap", key, 650.0, 700.0, 1000.0, 0.7)),
        1: report(UsageEntry.of_sensor("bootstrap", key, 280.0, 300.0, 1000.0, 0.3)),
        2: report(UsageEntry.of_sensor("bootstrap", key, 0.0, 1000.0 / 3, 1000.0, 1 / 3),
                  UsageEntry.of_sensor("1", key, 5.0, 1000.0 / 3, 1000.0, 1 / 3)),
    }, workers=3)
    assert merged.workers == 3 and merged.window_ms == 11_000
    boot, broker1 = merged.entries
    assert (boot.rate, boot.limit, boot.share) == (930.0, 1000.0, 1.0)
    assert boot.headroom == pytest.approx(70.0) and boot.headroom_ratio == pytest.approx(0.07)
    assert boot.workers == (WorkerUsage(0, 650.0, 700.0, 0.7), WorkerUsage(1, 280.0, 300.0, 0.3),
                            WorkerUsage(2, 0.0, 1000.0 / 3, 1 / 3))
    # only worker 2 has a sensor on broker 1: its limit in force, a third of the budget
    assert broker1.limit == pytest.approx(1000.0 / 3) and broker1.share == pytest.approx(1 / 3)
    assert broker1.headroom_ratio == pytest.approx(1 - 5.0 / (1000.0 / 3))
    assert merge_worker_reports({}, workers=2).entries == ()


def test_unlimited_sensors_stay_unlimited_when_merged() -> None:
    key = SensorKey(P, "", "app")
    merged = merge_worker_reports({i: UsageReport(11_000, "cluster", (UsageEntry.of_sensor("all", key, 2.0,
                                                                                            None),))
                                   for i in (0, 1)}, workers=2)
    (entry,) = merged.entries
    assert (entry.rate, entry.limit, entry.headroom_ratio, merged.scope) == (4.0, None, None, "cluster")


def test_worker_limits_merge_into_the_instance_part_of_each_budget() -> None:
    from quotas.headroom import EffectiveLimit, WorkerLimit, merge_worker_limits

    def limit(value: float, share: float, source: str = "entry") -> EffectiveLimit:
        return EffectiveLimit("bootstrap", "producer_byte_rate", "bytes/s", value, 1000.0, 0.5, share, source,
                              False, "client-id 'a'")

    # storage factor 0.5: the budget is 500; worker 0 active (0.8), worker 1 on standby (0.5):
    # the sum (650) exceeds the budget, so the instance's limit is the budget, its share 1
    (merged, topic) = merge_worker_limits({0: [limit(400.0, 0.8), limit(100.0, 0.2, "topic")],
                                           1: [limit(250.0, 0.5), limit(150.0, 0.3, "topic")]})
    assert (merged.limit, merged.fleet_share) == (500.0, 1.0)
    assert merged.workers == (WorkerLimit(0, 400.0, 0.8), WorkerLimit(1, 250.0, 0.5))
    # below the budget (another instance of the fleet holds the rest): the sum, and its share
    assert (topic.limit, topic.fleet_share) == (250.0, 0.5)
    assert EffectiveLimit.from_json(merged.to_json()) == merged
