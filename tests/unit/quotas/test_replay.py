"""Known answers of the replay (quotas/replay.py): recorded arrivals through the quota engine.

Windowed arithmetic (kafka-quota-semantics.md §1.2, §2.3) with Kafka's defaults, 11 samples of
1 s: a fresh sensor's window is padded to 10 s, so at t ms after its first record (t < 10 s) it
divides by ``10 000 + t % 1000`` ms, and the throttle of a total ``S`` over a window ``W`` s at a
bound ``B`` is ``(S / W - B) / B x W x 1000 = (S - B x W) / B x 1000`` ms.
"""

from __future__ import annotations

import math

import pytest

from quotas import QuotaConfig, QuotaEntry, RateModel
from quotas.entity import ClientIdentity, QuotaEntity, QuotaKind
from quotas.replay import Arrival, replay, replay_summary, service_time_ms, summarize

ALICE = ClientIdentity("alice", "app")


def config(entity: QuotaEntity, bound: float, kind: QuotaKind = QuotaKind.PRODUCE,
           **kw: object) -> QuotaConfig:
    return QuotaConfig((QuotaEntry(entity, {kind: bound}),), **kw)  # type: ignore[arg-type]


def steady(who: ClientIdentity, value: float, every_ms: int, until_ms: int,
           start_ms: int = 0) -> list[Arrival]:
    return [Arrival(t, who, value) for t in range(start_ms, until_ms, every_ms)]


def test_steady_client_under_a_windowed_quota_is_never_throttled() -> None:
    # 100 B every 100 ms = 1000 B/s against 2000 B/s: the fresh window's rate is at most
    # 100 B x 100 requests / 10 s = 1000 B/s and later 1000 B/s; never above 2000.
    arrivals = steady(ALICE, 100, 100, 20_000)
    s = replay_summary(arrivals, config(QuotaEntity(user="alice"), 2000), QuotaKind.PRODUCE)
    assert s.throttles == 0 and s.throttled_seconds == 0
    assert s.admitted == s.demand == 20_000
    assert s.deferred == 0 and s.max_wait_ms == 0
    assert s.active_seconds == 20
    assert math.isnan(s.throttle_mean_ms)


def test_steady_client_over_a_windowed_quota() -> None:
    # 300 B every 100 ms = 3000 B/s against 1000 B/s, 60 s.
    # First throttle: after n requests (the last at t = 100 (n-1)) the rate is 300 n / (10 + t%1000/1000).
    # t = 3300: 34 x 300 = 10 200 B / 10.3 s = 990 B/s (<= 1000, not throttled);
    # t = 3400: 35 x 300 = 10 500 B / 10.4 s = 1009.6 B/s -> (10 500 - 1000 x 10.4) / 1000 x 1000 = 100 ms.
    arrivals = steady(ALICE, 300, 100, 60_000)
    cfg = config(QuotaEntity(user="alice"), 1000)
    result = replay(arrivals, cfg, QuotaKind.PRODUCE)
    first = result.throttles[0]
    assert (first.at_ms, first.throttle_ms, first.arrival) == (3400, 100, 34)
    # The 36th request (t = 3500) waited for the mute to end (3400 + 100) and no longer.
    assert result.admissions[35].admitted_ms == 3500
    s = summarize(arrivals, result)
    # Long run: the window holds the last ~10-11 s, and every decision keeps its total at most
    # B x W plus the one request that crossed; so everything admitted by the end is at most the
    # bound times (span + the 10 s a fresh window lends) plus one request:
    # 1000 x (60 + 10) + 300 = 70 300 B, i.e. <= 1171.7 B/s over the 60 s span. It is at least the
    # bound over the span less one window of lag (the mute ends when the rate is back at the
    # bound): 1000 x (60 - 11) = 49 000 B.
    assert 49_000 <= s.admitted <= 70_300
    assert s.demand == 180_000
    assert s.deferred == pytest.approx(s.demand - s.admitted)
    # Backlogged from 3400 on, the client is muted from then to the end but for the instants of its
    # decisions (each next one is read when the mute ends): seconds 3 to 59 are throttled (57), and
    # the time muted within the recording is exactly the time from 3400 to the end (59 901, 1 ms
    # after the last arrival); the last mute's overhang past the end is not counted, but the
    # decisions' own sum has it.
    assert s.throttled_seconds == 57
    assert s.throttled_share == pytest.approx(57 / 60)
    assert s.throttle_total_ms == result.end_ms - 3400
    overhang = result.throttles[-1].at_ms + result.throttles[-1].throttle_ms - result.end_ms
    assert overhang > 0
    assert sum(t.throttle_ms for t in result.throttles) == s.throttle_total_ms + overhang
    # What is deferred at the end was backlog then: the peak is at least that.
    assert s.max_backlog >= s.deferred > 0


def test_a_produce_delay_starts_when_its_response_is_sent() -> None:
    # KIP-219: the broker (and Sluice's adapter) starts a produce's delay when the response is sent,
    # so a throttled produce whose response took L ms mutes its client until decision + L + T.
    # The steady client above, every response taking 30 ms: the first throttle is the same
    # (t = 3400, 35 x 300 = 10 500 B / 10.4 s -> 100 ms), but the mute ends at 3400 + 30 + 100 = 3530,
    # not 3500: the 36th request (t = 3500) is read at 3530. There the rate is 36 x 300 = 10 800 B over
    # 10.53 s: (10 800 - 1000 x 10.53) / 1000 x 1000 = 270 ms, where a mute from the decision reads it
    # at 3500: (10 800 - 10 500) = 300 ms. The later start lowers the next throttle.
    arrivals = [Arrival(a.ts_ms, a.client, a.value, response_ms=30) for a in steady(ALICE, 300, 100, 6000)]
    cfg = config(QuotaEntity(user="alice"), 1000)
    result = replay(arrivals, cfg, QuotaKind.PRODUCE)
    first, second = result.throttles[:2]
    assert (first.at_ms, first.throttle_ms, first.arrival) == (3400, 100, 34)
    assert result.admissions[35].admitted_ms == 3530
    assert (second.at_ms, second.throttle_ms, second.arrival) == (3530, 270, 35)
    # muted from the decision (no response time recorded, e.g. acks=0): read at 3500, throttled 300
    plain = replay(steady(ALICE, 300, 100, 6000), cfg, QuotaKind.PRODUCE)
    assert (plain.throttles[1].at_ms, plain.throttles[1].throttle_ms) == (3500, 300)
    # a fetch's delay is not from its response (it mutes from the decision): the response time
    # changes nothing there
    fetch_cfg = config(QuotaEntity(user="alice"), 1000, QuotaKind.FETCH)
    fetch = replay(arrivals, fetch_cfg, QuotaKind.FETCH)
    assert fetch.throttles and fetch == replay(steady(ALICE, 300, 100, 6000), fetch_cfg, QuotaKind.FETCH)


def test_a_throttled_produce_waits_for_the_brokers_service_time_not_for_queues() -> None:
    # Every produce sent to one broker in an unthrottled recording, (arrival, wait) in ms, of any
    # client. Idle = arrived once every earlier produce had its response: (0, 5) yes, free at 5;
    # (10, 30) yes (10 >= 5), free at 40; (20, 995) no (20 < 40), free at 1015; (2000, 7) yes;
    # (3000, 9) yes. Waits 5, 30, 7, 9: the mean is 51 / 4 = 12.75 -> 13 ms.
    assert service_time_ms([(0, 5), (10, 30), (20, 995), (2000, 7), (3000, 9)]) == 13
    # Three produces queued behind the first for ~4 s (a pipelining client's own queue, or a
    # flooder's requests ahead of another client's): only (0, 5) and (4100, 6) found the broker
    # idle (4100 >= 1 + 4000), mean 5.5 -> 6 ms (half to even); the mean of every wait would be
    # ~2.4 s, the queue's.
    assert service_time_ms([(0, 5), (1, 4000), (2, 3999), (3, 3998), (4100, 6)]) == 6
    # A bursty client's produces wait >= 362 ms: 4 bursts of 5 sent at once (pipelined: each
    # waits for the ones before it); only each burst's first found the broker idle. Here the
    # broker answered that first one in 2 ms; two other clients' 20 produces, alone, in 1 to 3 ms
    # (7 x 1, 7 x 2, 6 x 3 = 39). Idle waits: 4 x 2 and the 20: (8 + 39) / 24 = 1.96 -> 2 ms,
    # where the bursty client's own waits average 802 ms.
    bursty = [(1000 * b + i, 2.0 + 400 * i) for b in range(1, 5) for i in range(5)]
    others = [(5000 + 100 * k, 1.0 + k % 3) for k in range(20)]
    assert service_time_ms(bursty + others) == 2
    assert service_time_ms([]) == 0


def test_a_burst_under_the_token_bucket() -> None:
    # Bound 1000 B/s, burst 2000 ms = 2000 B of credits, full at the start. Five 1000 B requests at t = 0:
    # #0 credits 2000 -> 1000 (>= 0, no throttle); #1 1000 -> 0 (no throttle: violated only below 0);
    # #2 0 -> -1000: throttle = 1000 / 1000 x 1000 = 1000 ms, the client is muted until 1000;
    # #3 waits, at 1000 the credits refilled to 0 -> -1000: throttle 1000 ms; #4 likewise at 2000.
    arrivals = [Arrival(0, ALICE, 1000) for _ in range(5)]
    cfg = config(QuotaEntity(user="alice"), 1000, rate_model=RateModel.TOKEN_BUCKET, burst_ms=2000)
    result = replay(arrivals, cfg, QuotaKind.PRODUCE, end_ms=10_000)
    assert [a.admitted_ms for a in result.admissions] == [0, 0, 0, 1000, 2000]
    assert [(t.at_ms, t.throttle_ms) for t in result.throttles] == [(0, 1000), (1000, 1000), (2000, 1000)]
    s = summarize(arrivals, result)
    assert s.max_backlog == 2000  # #3 and #4 wait from 0 until 1000
    assert s.max_wait_ms == 2000 and s.deferred == 0
    # The same burst under the windowed model: 5000 B / 10 s = 500 B/s <= 1000: nobody waits.
    windowed = replay(arrivals, config(QuotaEntity(user="alice"), 1000), QuotaKind.PRODUCE, end_ms=10_000)
    assert windowed.throttles == () and {a.admitted_ms for a in windowed.admissions} == {0}


def _two_clients(first: ClientIdentity, second: ClientIdentity) -> list[Arrival]:
    # 600 B per second each: the first at 0, 1000, 2000, ..., the second at 500, 1500, ...
    return sorted(steady(first, 600, 1000, 20_000) + steady(second, 600, 1000, 20_000, start_ms=500),
                  key=lambda a: a.ts_ms)


def test_a_prefix_group_shares_one_budget() -> None:
    # batch-a and batch-b share client-id-prefix=batch- at 1000 B/s; together they send 1200 B/s.
    # t = 7500: 16 x 600 = 9600 B / 10.5 s = 914 B/s; t = 8000 (batch-a): 17 x 600 = 10 200 B / 10.0 s
    # = 1020 B/s -> (10 200 - 10 000) / 1000 x 1000 = 200 ms.
    a, b = ClientIdentity("u", "batch-a"), ClientIdentity("u", "batch-b")
    arrivals = _two_clients(a, b)
    shared = replay(arrivals, config(QuotaEntity(client_id_prefix="batch-"), 1000), QuotaKind.PRODUCE)
    first = shared.throttles[0]
    assert (first.at_ms, first.throttle_ms, arrivals[first.arrival].client) == (8000, 200, a)
    # Both clients get throttled: the budget is the group's.
    assert {arrivals[t.arrival].client for t in shared.throttles} == {a, b}
    # Each alone at 600 B/s under its own 1000 B/s (client-id=<default>) is never throttled.
    from quotas.entity import DEFAULT

    alone = replay(arrivals, config(QuotaEntity(client_id=DEFAULT), 1000), QuotaKind.PRODUCE)
    assert alone.throttles == ()


def test_a_topic_budget_limits_every_client_of_the_topic_together() -> None:
    # Two clients produce 600 B/s each to topic orders with a 1000 B/s topic budget: the same
    # arithmetic as the prefix group (first throttle at 8000 ms, 200 ms), the sensor is the topic's.
    a, b = ClientIdentity("u", "p1"), ClientIdentity("v", "p2")
    arrivals = [Arrival(x.ts_ms, x.client, x.value, "orders") for x in _two_clients(a, b)]
    result = replay(arrivals, config(QuotaEntity(topic="orders"), 1000), QuotaKind.PRODUCE, topics=True)
    first = result.throttles[0]
    assert (first.at_ms, first.throttle_ms) == (8000, 200)
    # Another topic is not limited by it.
    other = [Arrival(x.ts_ms, x.client, x.value, "payments") for x in arrivals]
    orders = config(QuotaEntity(topic="orders"), 1000)
    assert replay(other, orders, QuotaKind.PRODUCE, topics=True).throttles == ()


def test_a_muted_clients_backlog_waits_and_carries_over() -> None:
    # Bound 1000 B/s. 20 000 B at t = 0: 20 000 / 10 s = 2000 B/s -> (20 000 - 10 000) / 1000 x 1000 =
    # 10 000 ms; the client is muted until 10 000. Nine 100 B requests at 100, 200, ..., 900 wait.
    # At 10 000 the first of them is read: the window is 10 s unpadded (elapsed 10 000, 10 full windows),
    # 20 100 B / 10 s = 2010 B/s -> 10 100 ms, muted until 20 100. At 20 100 the 0 ms sample is purged
    # (20 100 - 0 >= 11 x 1000): 200 B / 10.1 s, then up to 900 B / 10.1 s: the other eight go at once.
    arrivals = [Arrival(0, ALICE, 20_000)] + [Arrival(t, ALICE, 100) for t in range(100, 1000, 100)]
    cfg = config(QuotaEntity(user="alice"), 1000)
    result = replay(arrivals, cfg, QuotaKind.PRODUCE, end_ms=30_000)
    assert [a.admitted_ms for a in result.admissions] == [0, 10_000] + [20_100] * 8
    assert [(t.at_ms, t.throttle_ms) for t in result.throttles] == [(0, 10_000), (10_000, 10_100)]
    s = summarize(arrivals, result)
    assert s.max_backlog == 900  # all nine followers, from t = 900 to 10 000
    assert s.deferred == 0
    assert s.max_wait_ms == 20_100 - 200
    # Stopped where the recording ends (1 ms after the last arrival), all nine are deferred.
    assert summarize(arrivals, replay(arrivals, cfg, QuotaKind.PRODUCE)).deferred == 900


def test_a_throttled_windowed_fetch_is_emptied_and_asked_for_again() -> None:
    # consumer_byte_rate 1000 B/s; fetches of 6000 B at t = 0 and t = 100: the first, 6000 / 10 s = 600,
    # is delivered; the second makes 12 000 / 10.1 s = 1188 B/s -> (12 000 - 10 100) / 1000 x 1000 = 1900 ms:
    # Kafka answers it empty and un-records it. Asked again at 2000: 12 000 / 10 s -> 2000 ms throttle,
    # emptied again (the window did not move: the un-record left 6000 in it); at 4000:
    # 12 000 / 10 s = 1200 -> 2000 ms ... until the 0 ms sample is purged at 11 000: 6000 / 10 s, delivered.
    arrivals = [Arrival(0, ALICE, 6000), Arrival(100, ALICE, 6000)]
    result = replay(arrivals, config(QuotaEntity(user="alice"), 1000, QuotaKind.FETCH), QuotaKind.FETCH,
                    end_ms=20_000)
    assert result.admissions[0].admitted_ms == 0
    assert [(t.at_ms, t.throttle_ms) for t in result.throttles][:2] == [(100, 1900), (2000, 2000)]
    assert result.admissions[1].admitted_ms is not None and result.admissions[1].admitted_ms >= 11_000
    assert summarize(arrivals, result).deferred == 0


def test_a_fetch_larger_than_the_window_allows_is_delivered_in_pieces() -> None:
    # KAFKA-9677: one fetch carries at most bound x (samples - 1) x window = 100 x 10 = 1000 B. A recorded
    # 2500 B response is delivered as 1000 + 1000 + 500 B: the first piece fills the fresh window to the
    # bound (1000 / 10 s = 100, not above), so the second throttles and is asked for again later.
    arrivals = [Arrival(0, ALICE, 2500)]
    result = replay(arrivals, config(QuotaEntity(user="alice"), 100, QuotaKind.FETCH), QuotaKind.FETCH,
                    end_ms=100_000)
    admission = result.admissions[0]
    assert admission.admitted_value == 2500 and admission.admitted_ms is not None
    assert admission.admitted_ms > 10_000  # the pieces are more than one full window apart


def test_a_fetch_after_a_mute_carries_everything_the_consumer_waited_for() -> None:
    # consumer_byte_rate 1000 B/s. 10 000 B at t = 0: 10 000 / 10 s = 1000, not above: delivered.
    # 200 B at t = 100: 10 200 / 10.1 s -> (10 200 - 10 100) / 1000 x 1000 = 100 ms: emptied, un-recorded,
    # muted until 200. 200 B more arrive at 150. At 200 the fetch returns what is there, both: 400 B,
    # 10 400 / 10.2 s -> (10 400 - 10 200) / 1000 x 1000 = 200 ms: emptied again, muted until 400.
    # At 400: 10 400 / 10.4 s = 1000, not above: both delivered by that one fetch.
    arrivals = [Arrival(0, ALICE, 10_000), Arrival(100, ALICE, 200), Arrival(150, ALICE, 200)]
    result = replay(arrivals, config(QuotaEntity(user="alice"), 1000, QuotaKind.FETCH), QuotaKind.FETCH,
                    end_ms=5000)
    assert [a.admitted_ms for a in result.admissions] == [0, 400, 400]
    assert [(t.at_ms, t.throttle_ms) for t in result.throttles] == [(100, 100), (200, 200)]


def test_a_topic_budget_caps_the_fetch_of_its_topic_to_one_sample_window() -> None:
    # Topic orders, consumer_byte_rate 1000 B/s; one recorded 12 000 B fetch at t = 0. The proxy caps
    # a fetch of a held topic at one sample window of its budget, 1000 x 1 s = 1000 B
    # (QuotaEngine.topic_fetch_cap), and the replay does the same: ten 1000 B pieces fill the fresh
    # window to the bound (10 000 / 10 s = 1000, not above); the eleventh makes 11 000 / 10 s ->
    # (11 000 - 10 000) / 1000 x 1000 = 1000 ms, emptied and un-recorded, and so again each second
    # until the 0 ms sample is purged at 11 000 (11 x 1000 ms): then 2000 / 10 s, both delivered.
    # Uncapped, the whole 12 000 B (12 000 / 10 s = 1200 > 1000) would be emptied forever.
    arrivals = [Arrival(0, ALICE, 12_000, "orders")]
    result = replay(arrivals, config(QuotaEntity(topic="orders"), 1000, QuotaKind.FETCH), QuotaKind.FETCH,
                    topics=True, end_ms=100_000)
    assert [(a.admitted_ms, a.admitted_value) for a in result.admissions] == [(11_000, 12_000)]
    assert [(t.at_ms, t.throttle_ms) for t in result.throttles] == [(t, 1000) for t in range(0, 11_000, 1000)]
