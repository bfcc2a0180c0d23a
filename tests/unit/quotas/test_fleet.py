"""Fleet shares, sans I/O: the report codec, water-filling, the view's decisions, and a quota
manager enforcing ``limit x share`` (fake clock; the arithmetic is in the comments)."""

from __future__ import annotations

import math

import pytest

from quotas.clock import FakeClock
from quotas.config import QuotaConfig
from quotas.entity import ClientIdentity, QuotaKind, SensorKey
from quotas.fleet import (
    FleetFallback,
    FleetReportError,
    FleetReportVersionError,
    FleetView,
    GroupUsage,
    UsageReport,
    decode_report,
    encode_report,
    water_fill,
)
from quotas.manager import QuotaManager

KEY = SensorKey(QuotaKind.PRODUCE, "", "app")
Q = 1_000_000.0  # bytes/s


def report(member: str, seq: int, *groups: GroupUsage, fleet: str = "f") -> UsageReport:
    return UsageReport(fleet, member, seq, 500, groups)


def g(used: float, constrained: bool = False, scope: str = "1", key: SensorKey = KEY) -> GroupUsage:
    return GroupUsage(scope, key, used, constrained)


# ---------------------------------------------------------------------------------- codec

def test_report_round_trips() -> None:
    r = report("a/w0/1", 7, g(1234.5, True), g(0.0, False, "cluster",
                                                SensorKey(QuotaKind.REQUEST_RATE, "alice", "")))
    assert decode_report(encode_report(r)) == r


def test_a_report_carries_the_whole_budget_key_byte_for_byte() -> None:
    prefix = SensorKey(QuotaKind.PRODUCE, "alice", "", client_id_prefix="etl-")
    topic = SensorKey(QuotaKind.FETCH, "", "", topic="t")
    topics = SensorKey(QuotaKind.PRODUCER_RECORD_RATE, "", "", topic_prefix="logs.")
    team = SensorKey.from_tags(QuotaKind.PRODUCE, {"team": "payments", "region": "eu"})
    r = UsageReport("f1", "s-0/p42", 9, 500, (GroupUsage("1", prefix, 1048576.25, True),
                                              GroupUsage("all", topic, 0.0, False),
                                              GroupUsage("cluster", topics, 12.3456, False),
                                              GroupUsage("1", team, 5.0, False)))
    assert encode_report(r) == (
        b'{"v":3,'                  # format version: 3 carries the whole SensorKey and a callback's tags
        b'"fleet":"f1",'            # fleet id: reports of another fleet are ignored
        b'"member":"s-0/p42",'      # member name: instance[/worker]/pid, new at every start
        b'"seq":9,'                 # per member, increasing: an older report is ignored
        b'"interval_ms":500,'       # the member's report interval
        b'"groups":['
        # [scope, [kind, user, client_id, client_id_prefix, topic, topic_prefix, [[tag, value]...]],
        #  used/s, constrained]
        b'["1",["producer_byte_rate","alice","","etl-","","",[]],1048576.25,1],'
        b'["all",["consumer_byte_rate","","","","t","",[]],0.0,0],'
        # used/s is rounded to 3 decimals
        b'["cluster",["producer_record_rate","","","","","logs.",[]],12.346,0],'
        # a callback's own tags (KIP-257's tag map), sorted by name
        b'["1",["producer_byte_rate","","","","","",[["region","eu"],["team","payments"]]],5.0,0]'
        b']}')
    back = decode_report(encode_report(r))
    assert [gr.key for gr in back.groups] == [prefix, topic, topics, team]
    # a user's prefix group and the user's own group are different groups on every member
    assert prefix != SensorKey(QuotaKind.PRODUCE, "alice", "")
    # and two teams are two groups, though every other tag is empty
    assert team != SensorKey.from_tags(QuotaKind.PRODUCE, {"team": "search", "region": "eu"})


def test_reports_of_another_version_are_refused_by_reason_never_misread() -> None:
    # what a version-1 member sends: the key cut to (kind, user, client_id)
    v1 = (b'{"v":1,"fleet":"f","member":"m","seq":1,"interval_ms":500,'
          b'"groups":[["1","producer_byte_rate","","app",1,0]]}')
    with pytest.raises(FleetReportVersionError) as old:
        decode_report(v1)
    assert old.value.reason == "old_version" and old.value.version == 1
    # a version-2 member's key has no tags: its groups of two teams would be one
    v2 = (b'{"v":2,"fleet":"f","member":"m","seq":1,"interval_ms":500,'
          b'"groups":[["1",["producer_byte_rate","","app","","",""],1,0]]}')
    with pytest.raises(FleetReportVersionError) as older:
        decode_report(v2)
    assert older.value.reason == "old_version" and older.value.version == 2
    # a future version is not read as this one
    v4 = (b'{"v":4,"fleet":"f","member":"m","seq":1,"interval_ms":500,'
          b'"groups":[["1",["producer_byte_rate","","app","","","",[],"x"],1,0]]}')
    with pytest.raises(FleetReportVersionError) as new:
        decode_report(v4)
    assert new.value.reason == "unknown_version"
    for version in (b'"3"', b"3.0", b"true", b"null"):
        with pytest.raises(FleetReportVersionError) as odd:
            decode_report(b'{"v":' + version + b',"fleet":"f","member":"m","seq":1,"interval_ms":500,'
                          b'"groups":[]}')
        assert odd.value.reason == "unknown_version"


V3 = b'{"v":3,"fleet":"f","member":"m","seq":1,"interval_ms":500,"groups":[%s]}'


@pytest.mark.parametrize("payload", [
    b"", b"\xff", b"[]", b'{"fleet":"f"}', b'{"v":3}',
    b'{"v":3,"fleet":"f","member":"m","seq":1,"interval_ms":0,"groups":[]}',
    b'{"v":3,"fleet":"f","member":"m","seq":"1","interval_ms":500,"groups":[]}',
    V3 % b'["1",["nope","","","","","",[]],1,0]',                      # unknown kind
    V3 % b'["1",["producer_byte_rate","","","","","",[]],-1,0]',       # negative usage
    V3 % b'["1",["producer_byte_rate","","","","","",[]],1,2]',        # constrained not 0/1
    V3 % b'["1",["producer_byte_rate","","app"],1,0]',                 # a version-1-sized key
    V3 % b'["1",["producer_byte_rate","","","","",""],1,0]',           # a version-2 key (no tags)
    V3 % b'["1",["producer_byte_rate","","","","","",[],""],1,0]',     # a key with a field more
    V3 % b'["1",["producer_byte_rate","","",null,"","",[]],1,0]',      # a tag that is not a string
    V3 % b'["1",["producer_byte_rate","","","","","",{"team":"x"}],1,0]',  # tags not as pairs
    V3 % b'["1",["producer_byte_rate","","","","","",[["team"]]],1,0]',    # a pair of one
    V3 % b'["1","producer_byte_rate","","app",1,0]',                   # a version-1 group
    V3 % b'["1"]',
])
def test_garbage_is_a_malformed_report(payload: bytes) -> None:
    with pytest.raises(FleetReportError) as exc:
        decode_report(payload)
    assert exc.value.reason == "malformed"


# ---------------------------------------------------------------------------------- water-filling

def test_water_fill() -> None:
    # three that want all they can get: a third each
    assert water_fill([math.inf] * 3) == pytest.approx([1 / 3] * 3)
    # one wants 0.1: it gets 0.1, the other two split 0.9
    assert water_fill([math.inf, 0.1, math.inf]) == pytest.approx([0.45, 0.1, 0.45])
    # nobody is constrained: wants 0.2 and 0.3, the 0.5 left is split equally -> 0.45, 0.55
    assert water_fill([0.2, 0.3]) == pytest.approx([0.45, 0.55])
    # shares always sum to 1
    assert sum(water_fill([0.7, math.inf, 0.05, 2.0])) == pytest.approx(1.0)
    assert water_fill([]) == []


# ---------------------------------------------------------------------------------- the view

def view(member: str = "a", timeout_ms: int = 1500, joined: bool = True, **kw: object) -> FleetView:
    """A view; `joined`: it has heard its own report back at 0 (it has heard the fleet)."""
    v = FleetView("f", member, timeout_ms, **kw)  # type: ignore[arg-type]
    if joined:
        v.receive(report(member, 0), 0)
    return v


def test_three_constrained_members_get_a_third_each() -> None:
    v = view()
    v.receive(report("b", 1, g(300_000, True)), 0)
    v.receive(report("c", 1, g(300_000, True)), 0)
    d = v.decide([g(300_000, True)], {("1", KEY): Q}, 100)
    assert d.members == 3 and not d.fallback
    assert d.shares[("1", KEY)] == pytest.approx(1 / 3)
    assert d.standby == pytest.approx(1 / 3)


def test_idle_peers_leave_the_whole_quota_to_the_active_member() -> None:
    # b and c still report, but used nothing and are not throttled: they are not active on KEY
    v = view()
    v.receive(report("b", 2, g(0.0, False)), 0)
    v.receive(report("c", 2), 0)
    d = v.decide([g(400_000, True)], {("1", KEY): Q}, 100)
    assert d.shares[("1", KEY)] == pytest.approx(1.0)
    # ... while a member with no traffic of its own on a group holds the standby share 1/3
    assert ("1", KEY) not in v.decide([], {("1", KEY): Q}, 100).shares


def test_an_unconstrained_peer_keeps_what_it_uses_plus_headroom() -> None:
    # b uses 200 kB/s unthrottled: it wants 200k x 1.2 = 240k = 0.24 Q; a (constrained) gets 0.76
    v = view()
    v.receive(report("b", 1, g(200_000, False)), 0)
    d = v.decide([g(700_000, True)], {("1", KEY): Q}, 100)
    assert d.shares[("1", KEY)] == pytest.approx(0.76)


def test_a_newly_active_member_holds_at_most_its_standby_share_while_warming_up() -> None:
    # b and c were idle in their last reports; a's clients just started: a cannot know yet whether
    # theirs did too, so for 1000 ms it takes at most 1/3, then the whole quota it finds unused
    v = view(warmup_ms=1000)
    v.receive(report("b", 1), 0)
    v.receive(report("c", 1), 0)
    assert v.decide([g(1, True)], {("1", KEY): Q}, 100).shares[("1", KEY)] == pytest.approx(1 / 3)
    v.receive(report("b", 2), 600)
    v.receive(report("c", 2), 600)
    assert v.decide([g(1, True)], {("1", KEY): Q}, 1100).shares[("1", KEY)] == pytest.approx(1.0)
    # inactive again, then active: warming up afresh
    v.decide([], {("1", KEY): Q}, 1200)
    assert v.decide([g(1, True)], {("1", KEY): Q}, 1300).shares[("1", KEY)] == pytest.approx(1 / 3)


def test_groups_are_per_scope() -> None:
    # b is active on broker 2 only: on broker 1 a is alone
    v = view()
    v.receive(report("b", 1, g(500_000, True, scope="2")), 0)
    d = v.decide([g(500_000, True, scope="1"), g(500_000, True, scope="2")],
                 {("1", KEY): Q, ("2", KEY): Q}, 100)
    assert d.shares[("1", KEY)] == pytest.approx(1.0)
    assert d.shares[("2", KEY)] == pytest.approx(0.5)


def test_a_silent_member_leaves_after_the_timeout() -> None:
    v = view(timeout_ms=1500)
    v.receive(report("b", 1, g(1, True)), 0)
    v.receive(report("a", 1), 1000)  # our own echo keeps the channel alive
    assert v.decide([g(1, True)], {("1", KEY): Q}, 1500).shares[("1", KEY)] == pytest.approx(0.5)
    v.receive(report("a", 2), 1600)
    # b last heard at 0, now 1501 ms later > 1500: gone
    d = v.decide([g(1, True)], {("1", KEY): Q}, 1501 + 100)
    assert d.members == 1 and d.shares[("1", KEY)] == pytest.approx(1.0)


def test_reports_of_another_fleet_and_old_reports_are_ignored() -> None:
    v = view()
    assert not v.receive(report("b", 1, g(1, True), fleet="other"), 0)
    assert v.rejected == 1
    assert v.receive(report("b", 5, g(1, True)), 0)
    assert not v.receive(report("b", 4), 10)  # older than what we have
    assert v.decide([g(1, True)], {("1", KEY): Q}, 20).shares[("1", KEY)] == pytest.approx(0.5)


def test_fallback_splits_by_the_last_known_member_count() -> None:
    v = view(timeout_ms=1500)
    for m in ("b", "c", "d"):
        v.receive(report(m, 1, g(1, True)), 0)
    assert v.decide([g(1, True)], {("1", KEY): Q}, 100).members == 4
    # nothing at all for longer than the timeout: the exchange is down
    d = v.decide([g(1, True)], {("1", KEY): Q}, 1700)
    assert d.fallback and d.members == 4 and d.shares == {} and d.standby == pytest.approx(0.25)
    # the channel itself can say it is down, too
    v.receive(report("a", 9), 1800)
    assert v.decide([], {}, 1800, channel_up=False).fallback


def test_membership_is_frozen_while_the_exchange_is_silent() -> None:
    # b and c last reported at 0; our own echo came back once more, at 400 (reports of one round
    # arrive spread over the round); then the exchange fell silent (its broker died)
    v = view(timeout_ms=1500)
    v.receive(report("b", 1, g(1, True)), 0)
    v.receive(report("c", 1, g(1, True)), 0)
    v.receive(report("a", 1), 400)
    assert v.decide([g(1, True)], {("1", KEY): Q}, 500).members == 3
    # at 1600, b and c are 1600 ms silent (> 1500) but the exchange itself is only 1200 ms silent:
    # nothing was received after their deadline, so they have not left (before, they were dropped
    # here and a took the whole quota as the last member standing)
    d = v.decide([g(1, True)], {("1", KEY): Q}, 1600)
    assert d.members == 3 and d.shares[("1", KEY)] == pytest.approx(1 / 3)
    # from 1901 the exchange is silent (> 1500 ms): the fallback splits by the frozen count, 3,
    # for as long as the outage lasts
    for now in (1901, 5000, 25_000):
        d = v.decide([g(1, True)], {("1", KEY): Q}, now)
        assert d.fallback and d.members == 3 and d.standby == pytest.approx(1 / 3), now


def test_after_the_exchange_returns_members_get_a_whole_timeout_to_be_heard() -> None:
    v = view(timeout_ms=1500)
    v.receive(report("b", 1, g(1, True)), 0)
    v.receive(report("c", 1, g(1, True)), 0)
    v.decide([g(1, True)], {("1", KEY): Q}, 100)
    # a 25 s outage; then our own echo is the first thing back, b a round later, c never (it died
    # during the outage)
    v.receive(report("a", 2), 25_000)
    d = v.decide([g(1, True)], {("1", KEY): Q}, 25_000)
    assert not d.fallback and d.members == 3 and d.shares[("1", KEY)] == pytest.approx(1 / 3)
    v.receive(report("b", 2, g(1, True)), 25_500)
    v.receive(report("a", 3), 26_000)
    assert v.decide([g(1, True)], {("1", KEY): Q}, 26_000).members == 3
    # c: silent for 1500 ms of a healthy exchange once something arrives after 25 000 + 1500
    v.receive(report("a", 4), 26_501)
    d = v.decide([g(1, True)], {("1", KEY): Q}, 26_501)
    assert d.members == 2 and d.shares[("1", KEY)] == pytest.approx(1 / 2)


def test_a_member_silent_while_the_exchange_works_leaves() -> None:
    # b stops at 0 while our own reports keep coming back every 500 ms: b has left once one
    # arrives more than 1500 ms after b's last report, at 2000
    v = view(timeout_ms=1500)
    v.receive(report("b", 1, g(1, True)), 0)
    for seq, now in enumerate((500, 1000, 1500), start=1):
        v.receive(report("a", seq), now)
        assert v.decide([g(1, True)], {("1", KEY): Q}, now).members == 2, now
    v.receive(report("a", 4), 2000)
    d = v.decide([g(1, True)], {("1", KEY): Q}, 2000)
    assert d.members == 1 and not d.fallback and d.shares[("1", KEY)] == pytest.approx(1.0)


def test_a_joining_member_holds_its_due_until_its_own_report_comes_back() -> None:
    # a restarted instance: the exchange replays the last reports of b and c (and of its own
    # previous process, a0) before a's own first report comes back
    v = view("a1", joined=False)
    v.receive(report("b", 7, g(300_000, True)), 0)
    v.receive(report("c", 7, g(300_000, True)), 0)
    v.receive(report("a0", 7, g(300_000, True)), 0)
    d = v.decide([g(500_000, True)], {("1", KEY): Q}, 100)
    # it knows 4 members (a0 has not timed out yet): 1/4 for every group, active or not
    assert d.joining and d.shares == {} and d.standby == pytest.approx(1 / 4)
    v.receive(report("a1", 1), 500)
    d = v.decide([g(500_000, True)], {("1", KEY): Q}, 500)
    assert not d.joining and d.shares[("1", KEY)] == pytest.approx(1 / 4)
    # a0 is gone once the exchange has carried 1500 ms more (b and c kept reporting): three
    # members, a third each
    v.receive(report("b", 8, g(300_000, True)), 1000)
    v.receive(report("c", 8, g(300_000, True)), 1000)
    v.receive(report("a1", 2), 1501)
    assert v.decide([g(500_000, True)], {("1", KEY): Q}, 1501).shares[("1", KEY)] == pytest.approx(1 / 3)


def test_the_members_make_room_for_a_newcomer_before_its_clients_arrive() -> None:
    """A rolling restart's rejoin: a and b hold a half each of a group both saturate (b joined after
    a, at 500: a newcomer until 3500 that is active on the group, so its real want counts); c (restarted)
    is first heard at 1000 while it joins, with no traffic yet. It holds its standby share, 1/3, of
    every group from then on, so a and b count it as a peer wanting 1/3 at once: a third each, not a
    half, so the fleet never holds 1/2 + 1/2 + 1/3 = 4/3 while c's first report of the group is on
    its way (one report interval plus the exchange's delay). join_grace_ms = 3000."""
    v = view(join_grace_ms=3000)
    v.receive(report("b", 1, g(500_000, True)), 500)
    assert v.decide([g(500_000, True)], {("1", KEY): Q}, 500).shares[("1", KEY)] == pytest.approx(1 / 2)
    v.receive(report("c", 1), 1000)                   # joining: nothing used yet
    v.receive(report("b", 2, g(500_000, True)), 1000)
    d = v.decide([g(500_000, True)], {("1", KEY): Q}, 1000)
    # wants: a inf, b inf, c its standby 1/3 -> water-fill 1/3 each
    assert d.members == 3 and d.shares[("1", KEY)] == pytest.approx(1 / 3)
    # c's clients came: its report shows it throttled on the group, its real want counts (inf)
    v.receive(report("c", 2, g(300_000, True)), 1500)
    assert v.decide([g(300_000, True)], {("1", KEY): Q}, 1500).shares[("1", KEY)] == pytest.approx(1 / 3)


def test_a_newcomer_whose_clients_never_come_is_given_room_only_for_the_grace() -> None:
    # c joined at 1000 and never uses the group: from 1000 + 3000 on, a and b split it again. A
    # group only a uses: 1 - 1/3 (c's standby) during the grace, the whole quota after it
    other = SensorKey(QuotaKind.PRODUCE, "", "solo")
    v = view(joined=False, join_grace_ms=3000)
    v.receive(report("b", 0, g(500_000, True)), 0)   # b was there before a joined: not a newcomer
    v.receive(report("a", 0), 0)
    for t in (1000, 2000, 3000, 3999, 4000):
        v.receive(report("b", t, g(500_000, True)), t)
        v.receive(report("c", t), t)
        v.receive(report("a", t), t)
        d = v.decide([g(500_000, True), g(100, True, key=other)], {("1", KEY): Q, ("1", other): Q}, t)
        during = t < 4000
        assert d.shares[("1", KEY)] == pytest.approx(1 / 3 if during else 1 / 2), t
        assert d.shares[("1", other)] == pytest.approx(2 / 3 if during else 1.0), t


def test_members_heard_while_joining_are_not_newcomers() -> None:
    # a restarted member hears b and c before its own report comes back: they were there before
    # it, so it gives them no room on a group only it uses (it holds its warm-up cap as before)
    v = view("a1", joined=False, join_grace_ms=3000)
    v.receive(report("b", 7), 0)
    v.receive(report("c", 7), 0)
    v.receive(report("a1", 1), 100)
    assert v.decide([g(100, True)], {("1", KEY): Q}, 200).shares[("1", KEY)] == pytest.approx(1.0)
    # and without join_grace_ms nobody is a newcomer (the behaviour before it)
    v = view()
    v.receive(report("b", 1, g(500_000, True)), 500)
    v.receive(report("c", 1), 1000)
    assert v.decide([g(500_000, True)], {("1", KEY): Q}, 1000).shares[("1", KEY)] == pytest.approx(1 / 2)


def test_before_first_contact_a_member_holds_its_due_then_falls_back() -> None:
    # FULL: a member that never hears its own report back fails open only once it has waited a
    # whole timeout (1500 ms) for it; until then it holds its due, 1 / expected members
    v = view(joined=False, fallback_mode=FleetFallback.FULL)
    v.expect_members(3)
    d = v.decide([], {}, 0)
    assert d.joining and not d.fallback and d.standby == pytest.approx(1 / 3)
    d = v.decide([], {}, 1501)
    assert d.fallback and not d.joining and d.standby == 1.0
    # SPLIT: the same 1 / 3 while joining and in the fallback
    v = view(joined=False)
    v.expect_members(3)
    assert v.decide([], {}, 0).standby == pytest.approx(1 / 3)
    d = v.decide([], {}, 1501)
    assert d.fallback and d.standby == pytest.approx(1 / 3)


# ---------------------------------------------------------------------------------- the manager

def config(rate: float) -> QuotaConfig:
    return QuotaConfig.from_dict({"entries": [{"client_id": "app", "producer_byte_rate": rate}]})


def test_manager_enforces_the_bound_times_the_share() -> None:
    clock = FakeClock()
    m = QuotaManager(config(Q), clock, sticky_quotas_enabled=False)
    who = ClientIdentity.of("ANONYMOUS", "app")
    m.record_and_check(QuotaKind.PRODUCE, who, 1)  # create the sensor
    m.set_shares({KEY: 0.25}, standby=0.5)
    assert m.quota_bound(KEY) == pytest.approx(250_000)
    # a young sensor's window is padded to (11 - 1) x 1 s = 10 s: 3 000 000 bytes are a rate of
    # 300 000 > 250 000; throttle = (300000 - 250000) / 250000 x 10000 = 2000 ms
    d = m.record_and_check(QuotaKind.PRODUCE, who, 2_999_999)
    assert d.bound == pytest.approx(250_000) and d.observed == pytest.approx(300_000)
    assert d.throttle_time_ms == 2000
    # without a share the same rate is far under 1 MB/s
    m.set_shares({}, standby=1.0)
    assert m.quota_bound(KEY) == Q
    assert m.check(QuotaKind.PRODUCE, who).throttle_time_ms == 0


def test_a_new_sensor_of_a_group_others_use_starts_without_credit() -> None:
    who = ClientIdentity.of("ANONYMOUS", "app")
    # not busy elsewhere: Kafka's young-sensor padding, 10 s x 250 000 B/s = 2.5 MB before a throttle
    free = QuotaManager(config(Q), FakeClock(100_000), sticky_quotas_enabled=False)
    free.set_shares({}, standby=0.25)
    assert free.record_and_check(QuotaKind.PRODUCE, who, 2_000_000).throttle_time_ms == 0
    # busy elsewhere: the 10 windows before now hold 250 000 B each, the rate is the bound exactly
    # (2.5 MB / 10 s), so the same 2 MB is over it: (2.5 + 2) MB / 10 s = 450 000 B/s,
    # throttle = (450000 - 250000) / 250000 x 10000 ms = 8000 ms
    busy = QuotaManager(config(Q), FakeClock(100_000), sticky_quotas_enabled=False)
    busy.set_shares({}, standby=0.25, busy={KEY})
    d = busy.record_and_check(QuotaKind.PRODUCE, who, 2_000_000)
    assert d.observed == pytest.approx(450_000) and d.throttle_time_ms == 8000
    # what the fleet is told it used is only what it admitted
    (usage,) = busy.fleet_usage()
    assert usage.used_total == 2_000_000


def test_a_new_token_bucket_of_a_group_others_use_starts_empty() -> None:
    who = ClientIdentity.of("ANONYMOUS", "app")
    cfg = QuotaConfig.from_dict({"rate_model": "token_bucket", "burst_ms": 2000,
                                 "entries": [{"client_id": "app", "producer_byte_rate": Q}]})
    free = QuotaManager(cfg, FakeClock(100_000), sticky_quotas_enabled=False)
    free.set_shares({}, standby=0.5)
    # full: burst = 500 000 B/s x 2 s = 1 MB of credit; 600 kB leaves 400 kB
    assert free.record_and_check(QuotaKind.PRODUCE, who, 600_000).throttle_time_ms == 0
    busy = QuotaManager(cfg, FakeClock(100_000), sticky_quotas_enabled=False)
    busy.set_shares({}, standby=0.5, busy={KEY})
    # empty: 600 kB puts it 600 kB in debt, 1.2 s to refill at 500 000 B/s
    assert busy.record_and_check(QuotaKind.PRODUCE, who, 600_000).throttle_time_ms == 1200


def test_a_share_caps_byte_throttles_at_the_quota_window() -> None:
    clock = FakeClock()
    m = QuotaManager(config(Q), clock, sticky_quotas_enabled=False)
    who = ClientIdentity.of("ANONYMOUS", "app")
    m.set_shares({}, standby=0.01)
    # rate 100e6 / 11 s = 9.09e6 against 10 000: uncapped it would be ~10 000 s; capped at the
    # retention of 11 samples x 1 s = 11 000 ms
    assert m.record_and_check(QuotaKind.PRODUCE, who, 100e6).throttle_time_ms == 11_000


def test_fleet_usage_counts_what_was_recorded_and_throttled() -> None:
    clock = FakeClock()
    m = QuotaManager(config(Q), clock, sticky_quotas_enabled=False)
    who = ClientIdentity.of("ANONYMOUS", "app")
    m.record_and_check(QuotaKind.PRODUCE, who, 1000)
    m.record_and_check(QuotaKind.PRODUCE, who, 100e6)   # throttled
    m.unrecord(QuotaKind.PRODUCE, who, 500)
    (usage,) = list(m.fleet_usage())
    assert usage.key == KEY and usage.used_total == 1000 + 100e6 - 500
    assert usage.throttle_count == 1 and usage.base_bound == Q and usage.share == 1.0


def test_shares_must_be_positive() -> None:
    m = QuotaManager(config(Q), FakeClock())
    with pytest.raises(ValueError):
        m.set_shares({KEY: 0.0}, standby=1.0)


def steady(m: QuotaManager, clock: FakeClock, who: ClientIdentity, rate: float, seconds: int) -> None:
    for _ in range(seconds):
        m.record_and_check(QuotaKind.PRODUCE, who, rate)
        clock.advance(1000)


def test_a_raised_share_does_not_readmit_the_window_under_the_windowed_rate() -> None:
    """A member that held 1/4 and used it, raised to 1/2 (another member left): the 11 s window
    says it used 250 000 B/s of a 500 000 B/s bound, so without owing it could admit
    (500 000 - 250 000) x 11 s = 2.75 MB at once, though the member that left used that budget.
    The raise is owed, (1/2 - 1/4) x 1 MB/s x 11 s = 2.75 MB, repaid over the next 11 s."""
    who = ClientIdentity.of("ANONYMOUS", "app")
    clock = FakeClock(100_000)
    m = QuotaManager(config(Q), clock, sticky_quotas_enabled=False)
    m.set_shares({KEY: 0.25}, standby=0.25)
    steady(m, clock, who, 250_000, 12)
    before = m.check(QuotaKind.PRODUCE, who).observed
    assert before == pytest.approx(250_000, rel=0.1)
    m.set_shares({KEY: 0.5}, standby=0.25)
    d = m.check(QuotaKind.PRODUCE, who)
    # the owed 2.75 MB over the window's length (its measured total's divisor) on top
    assert d.bound == pytest.approx(500_000) and d.observed == pytest.approx(before + 250_000, rel=0.1)
    burst = m.record_and_check(QuotaKind.PRODUCE, who, 2_000_000)
    assert burst.throttle_time_ms > 0
    # the metric and the fleet are told only what was admitted
    (usage,) = m.fleet_usage()
    assert usage.used_total == pytest.approx(12 * 250_000 + 2_000_000)
    # a client at the new bound from now on is not held back once the owed part is repaid
    clock.advance(11_000)
    steady(m, clock, who, 500_000, 11)
    assert m.check(QuotaKind.PRODUCE, who).throttle_time_ms == 0
    # a rise back to a bound held within the window owes nothing: 1/2 -> 1/3 -> 1/2
    m.set_shares({KEY: 1 / 3}, standby=0.25)
    clock.advance(1000)
    m.set_shares({KEY: 0.5}, standby=0.25)
    assert m.check(QuotaKind.PRODUCE, who).observed == pytest.approx(500_000, rel=0.1)


def test_a_raised_share_owes_nothing_idle_or_under_the_token_bucket() -> None:
    who = ClientIdentity.of("ANONYMOUS", "app")
    clock = FakeClock(100_000)
    m = QuotaManager(config(Q), clock, sticky_quotas_enabled=False)
    m.record_and_check(QuotaKind.PRODUCE, who, 1)
    clock.advance(20_000)  # idle for more than the window: nothing to re-admit
    m.set_shares({KEY: 0.25}, standby=0.25)
    m.set_shares({KEY: 0.5}, standby=0.25)
    assert m.check(QuotaKind.PRODUCE, who).observed < 1
    cfg = QuotaConfig.from_dict({"rate_model": "token_bucket", "burst_ms": 1000,
                                 "entries": [{"client_id": "app", "producer_byte_rate": Q}]})
    bucket = QuotaManager(cfg, clock, sticky_quotas_enabled=False)
    bucket.set_shares({KEY: 0.25}, standby=0.25)
    steady(bucket, clock, who, 250_000, 12)
    bucket.set_shares({KEY: 0.5}, standby=0.25)
    # the bucket refills at the new rate from the credits it holds; nothing owed
    assert bucket.record_and_check(QuotaKind.PRODUCE, who, 250_000).throttle_time_ms == 0
