"""The fleet member over a fake exchange and a fake clock: what it reports, how it reads the
others, how claims of throttled connections keep a share, and the fallback."""

from __future__ import annotations

import asyncio

import pytest

from proxy.fleet.member import FleetClaims, FleetCollector, FleetMember
from proxy.flow.pipeline import ConnectionContext
from quotas.clock import FakeClock, SystemClock
from quotas.config import QuotaConfig
from quotas.engine import QuotaEngine
from quotas.entity import ClientIdentity, QuotaKind, SensorKey
from quotas.fleet import FleetView, GroupUsage, ShareDecision, UsageReport, decode_report, encode_report
from quotas.manager import ThrottleDecision

Q = 1_000_000.0
KEY = SensorKey(QuotaKind.PRODUCE, "", "app")
APP = ClientIdentity.of("ANONYMOUS", "app")


class FakeExchange:
    def __init__(self) -> None:
        self.published: list[bytes] = []
        self.inbox: list[bytes] = []
        self.connected = True
        self.errors = 0

    def start(self) -> None: ...

    def publish(self, payload: bytes) -> None:
        self.published.append(payload)
        self.inbox.append(payload)  # every member hears itself too

    def drain(self) -> list[bytes]:
        out, self.inbox = self.inbox, []
        return out

    def describe(self) -> str:
        return "fake"

    def close(self) -> None: ...


def member(clock: FakeClock) -> tuple[FleetMember, FakeExchange, QuotaEngine]:
    config = QuotaConfig.from_dict({"entries": [{"client_id": "app", "producer_byte_rate": Q}]})
    managers = QuotaEngine(config, clock)
    exchange = FakeExchange()
    view = FleetView("f", "a", 1500, warmup_ms=0)
    claims = FleetClaims(clock, ("all", "cluster"), hold_ms=1000)
    return FleetMember(view, exchange, managers, clock, claims, 500), exchange, managers


def peer(member_name: str, seq: int, used: float, constrained: bool) -> bytes:
    return encode_report(UsageReport("f", member_name, seq, 500, (GroupUsage("1", KEY, used, constrained),)))


def test_reports_what_was_admitted_per_second_and_splits_with_a_constrained_peer() -> None:
    clock = FakeClock()
    m, exchange, managers = member(clock)
    broker1 = managers.for_broker(1)
    broker1.record_and_check(QuotaKind.PRODUCE, APP, 1)
    m.tick()                                     # first round: the sensor is seen
    broker1.record_and_check(QuotaKind.PRODUCE, APP, 100_000)
    clock.advance(500)
    exchange.inbox.append(peer("b", 1, 300_000, True))
    m.tick()
    (report,) = [decode_report(p) for p in exchange.published[-1:]]
    # 100 000 bytes in 500 ms: 200 000 bytes/s, not throttled
    assert report.groups == (GroupUsage("1", KEY, 200_000.0, False),)
    # a wants 200k x 1.2 = 0.24 Q; b is constrained and gets the rest
    assert m.decision.shares[("1", KEY)] == pytest.approx(0.24)
    assert broker1.quota_bound(KEY) == pytest.approx(0.24 * Q)
    assert m.decision.members == 2 and not m.in_fallback


def test_a_claim_keeps_a_muted_client_constrained_until_its_connection_closes() -> None:
    clock = FakeClock()
    m, exchange, managers = member(clock)
    broker1 = managers.for_broker(1)
    broker1.record_and_check(QuotaKind.PRODUCE, APP, 1)
    ctx = ConnectionContext(connection_id=7, client_address="10.0.0.1", listener="broker 1", broker_id=1)
    m.claims.on_violation(ctx, ThrottleDecision(QuotaKind.PRODUCE, KEY, 3000, 2 * Q, Q))
    m.tick()
    clock.advance(2000)                          # muted: nothing recorded for 2 s
    exchange.inbox.append(peer("b", 1, 500_000, True))
    m.tick()
    (report,) = [decode_report(p) for p in exchange.published[-1:]]
    assert report.groups[0].constrained and report.groups[0].used_per_s == 0
    assert m.decision.shares[("1", KEY)] == pytest.approx(0.5)
    # the client goes away: no claim, nothing used -> not active; b takes it all, a is on standby
    m.claims.connection_closed(7)
    clock.advance(500)
    exchange.inbox.append(peer("b", 2, 500_000, True))
    m.tick()
    assert decode_report(exchange.published[-1]).groups == ()
    assert ("1", KEY) not in m.decision.shares and m.decision.standby == pytest.approx(0.5)


def test_claims_end_with_their_throttle_plus_the_hold() -> None:
    clock = FakeClock()
    claims = FleetClaims(clock, ("all",), hold_ms=1000)
    ctx = ConnectionContext(connection_id=1, client_address="x", listener="bootstrap", broker_id=None)
    claims.on_violation(ctx, ThrottleDecision(QuotaKind.PRODUCE, KEY, 500, 2 * Q, Q))
    assert claims.claimed(clock.now_ms()) == {("bootstrap", KEY), ("all", KEY)}
    clock.advance(1499)
    assert claims.claimed(clock.now_ms())
    clock.advance(1)                             # 500 ms throttle + 1000 ms hold
    assert claims.claimed(clock.now_ms()) == set()
    # a shadow decision (nothing enforced) claims nothing
    claims.on_violation(ctx, ThrottleDecision(QuotaKind.PRODUCE, KEY, 500, 2 * Q, Q, shadow=True))
    assert claims.claimed(clock.now_ms()) == set()


def test_silence_is_the_fallback_split_by_the_last_known_count_and_metrics_say_so() -> None:
    clock = FakeClock()
    m, exchange, managers = member(clock)
    managers.for_broker(1).record_and_check(QuotaKind.PRODUCE, APP, 1)
    exchange.inbox += [peer("b", 1, 1, True), peer("c", 1, 1, True)]
    m.tick()
    assert m.decision.members == 3
    exchange.connected = False                   # the channel says it is down
    clock.advance(500)
    m.tick()
    assert m.in_fallback and m.decision.standby == pytest.approx(1 / 3)
    assert managers.for_broker(1).quota_bound(KEY) == pytest.approx(Q / 3)
    exported = {(metric.name, tuple(s.labels.items())): s.value
                for metric in FleetCollector(m).collect() for s in metric.samples}
    assert exported[("sluice_fleet_fallback", ())] == 1
    assert exported[("sluice_fleet_members", ())] == 3


def test_garbage_on_the_exchange_is_counted_and_ignored() -> None:
    clock = FakeClock()
    m, exchange, _ = member(clock)
    exchange.inbox += [b"not a report", peer("b", 1, 1, True)]
    m.tick()
    assert m.bad_reports == 1 and m.decision.members == 2
    exported = {(metric.name, tuple(s.labels.items())): s.value
                for metric in FleetCollector(m).collect() for s in metric.samples}
    assert exported[("sluice_fleet_reports_ignored", (("reason", "malformed"),))] == 1


def test_scope_cluster_and_cluster_entries_are_shared_groups_too() -> None:
    from proxy.stages.callbacks import QuotaPlugins

    clock = FakeClock()
    quotas = {"scope": "cluster", "entries": [{"client_id": "app", "producer_byte_rate": Q}],
              "cluster_entries": [{"client_id": "app", "producer_byte_rate": 2 * Q}]}
    config = QuotaConfig.from_dict({"entries": quotas["entries"]})
    managers = QuotaEngine(config, clock, QuotaPlugins.from_dict(quotas))
    exchange = FakeExchange()
    m = FleetMember(FleetView("f", "a", 1500), exchange, managers, clock,
                    FleetClaims(clock, ("all", "cluster"), hold_ms=1000), 500)
    for manager, _kinds in managers.for_request(2):
        manager.record_and_check(QuotaKind.PRODUCE, APP, 1000)
    m.tick()
    clock.advance(500)
    for manager, _kinds in managers.for_request(2):
        manager.record_and_check(QuotaKind.PRODUCE, APP, 1000)
    exchange.inbox.append(encode_report(UsageReport("f", "b", 1, 500, (
        GroupUsage("all", KEY, 1, True), GroupUsage("cluster", KEY, 1, True)))))
    m.tick()
    # one budget for the cluster (scope: cluster, label "all") and one for cluster_entries: each
    # shared with the constrained peer b; a wants 2000 B/s x 1.2, a tiny part of either
    assert set(m.decision.shares) == {("all", KEY), ("cluster", KEY)}
    bounds = {label: manager.quota_bound(KEY) for label, manager in managers.labelled()}
    assert bounds["all"] == pytest.approx(2400.0)
    assert bounds["cluster"] == pytest.approx(2400.0)


def exported(m: FleetMember, cap: int = 2000) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(metric.name, tuple(s.labels.items())): s.value
            for metric in FleetCollector(m, cap).collect() for s in metric.samples}


def test_reports_of_another_format_version_are_counted_by_reason_and_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    m, exchange, _ = member(clock)
    v1 = (b'{"v":1,"fleet":"f","member":"old","seq":%d,"interval_ms":500,'
          b'"groups":[["1","producer_byte_rate","","app",1,0]]}')
    v9 = b'{"v":9,"fleet":"f","member":"new","seq":1,"interval_ms":500,"groups":[]}'
    with caplog.at_level("INFO", logger="sluice.fleet"):
        for seq in (1, 2, 3):
            exchange.inbox += [v1 % seq, v9]
            m.tick()
            clock.advance(500)
    # neither the old nor the new member is read as a member of this fleet
    assert m.decision.members == 1
    counts = exported(m)
    assert counts[("sluice_fleet_reports_ignored", (("reason", "old_version"),))] == 3
    assert counts[("sluice_fleet_reports_ignored", (("reason", "unknown_version"),))] == 3
    assert counts[("sluice_fleet_reports_ignored", (("reason", "malformed"),))] == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert sum("old_version" in w for w in warnings) == 1, warnings
    assert sum("unknown_version" in w for w in warnings) == 1, warnings


def test_start_joins_before_serving_and_holds_its_due_meanwhile() -> None:
    clock = FakeClock()
    m, exchange, managers = member(clock)
    m.view.expect_members(3)
    shares_seen: list[float] = []
    ticks = m.tick

    def tick() -> None:  # what a manager created between two joining rounds would get
        shares_seen.append(managers.fleet_standby_share)
        ticks()

    m.tick = tick  # type: ignore[method-assign]
    exchange.inbox += [peer("b", 1, 1, True), peer("c", 1, 1, True)]

    async def run() -> None:
        await m.start()
        await m.close()

    asyncio.run(run())
    # before its own report came back it held a third (1 / expected members), never the whole quota
    assert shares_seen and shares_seen[0] == pytest.approx(1 / 3)
    # it returned only once joined: its first report came back in the second round
    assert m.view.joined and len(shares_seen) == 2
    assert not m.decision.joining and m.decision.members == 3
    # a manager created now (a client's first request to a broker) starts at the standby share
    managers.for_broker(1).record_and_check(QuotaKind.PRODUCE, APP, 1)
    assert managers.for_broker(1).quota_bound(KEY) == pytest.approx(Q / 3)


def test_start_gives_up_joining_after_the_join_timeout_and_keeps_the_joining_share() -> None:
    clock = SystemClock()
    config = QuotaConfig.from_dict({"entries": [{"client_id": "app", "producer_byte_rate": Q}]})
    managers = QuotaEngine(config, clock)
    exchange = FakeExchange()
    exchange.publish = lambda payload: None  # type: ignore[method-assign]  # nothing comes back
    view = FleetView("f", "a", 150)
    view.expect_members(2)
    claims = FleetClaims(clock, ("all", "cluster"), hold_ms=1000)
    m = FleetMember(view, exchange, managers, clock, claims, 500)
    m.join_timeout_ms = 300

    async def run() -> None:
        await m.start()
        await m.close()

    asyncio.run(run())
    assert not view.joined and m.decision.standby == pytest.approx(1 / 2)
    assert managers.fleet_standby_share == pytest.approx(1 / 2)


def test_the_share_metric_is_labelled_with_the_whole_key_and_capped() -> None:
    clock = FakeClock()
    m, _, _ = member(clock)
    keys = [SensorKey(QuotaKind.PRODUCE, "alice", "", client_id_prefix="etl-"),
            SensorKey(QuotaKind.PRODUCE, "alice", ""),
            SensorKey(QuotaKind.PRODUCE, "", "", topic="t"),
            SensorKey(QuotaKind.PRODUCE, "", "", topic_prefix="logs."),
            SensorKey.from_tags(QuotaKind.PRODUCE, {"team": "payments"}),
            SensorKey.from_tags(QuotaKind.PRODUCE, {"team": "search"})]
    m.decision = ShareDecision({("1", k): 0.1 * (i + 1) for i, k in enumerate(keys)}, 0.5, 2)
    shares = {labels: value for (name, labels), value in exported(m).items() if name == "sluice_fleet_share"}
    # six groups, six series (before, the prefix and the user's own group shared one label set,
    # the two topic groups that of the whole fleet, and two teams of a callback's own tag too)
    assert len(shares) == 6
    assert shares[(("broker", "1"), ("kind", "producer_byte_rate"), ("user", "alice"), ("client_id", ""),
                   ("client_id_prefix", "etl-"), ("topic", ""), ("topic_prefix", ""), ("tags", ""))
                  ] == pytest.approx(0.1)
    assert shares[(("broker", "1"), ("kind", "producer_byte_rate"), ("user", ""), ("client_id", ""),
                   ("client_id_prefix", ""), ("topic", "t"), ("topic_prefix", ""), ("tags", ""))
                  ] == pytest.approx(0.3)
    assert shares[(("broker", "1"), ("kind", "producer_byte_rate"), ("user", ""), ("client_id", ""),
                   ("client_id_prefix", ""), ("topic", ""), ("topic_prefix", ""), ("tags", "team=search"))
                  ] == pytest.approx(0.6)
    # under a cap of 2: two series of their own, the other four in one overflow series (mean share)
    collector = FleetCollector(m, 2)
    samples = {(metric.name, tuple(s.labels.items())): s.value
               for metric in collector.collect() for s in metric.samples}
    capped = {labels: v for (name, labels), v in samples.items() if name == "sluice_fleet_share"}
    assert len(capped) == 3
    overflow = [v for labels, v in capped.items() if dict(labels)["user"] == "__overflow__"]
    assert len(overflow) == 1
    assert samples[("sluice_fleet_share_series_folded", ())] == 4
