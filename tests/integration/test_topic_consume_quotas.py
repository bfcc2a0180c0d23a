"""Issue 26: topic quotas on the consume side, through a real Sluice process, against real Kafka
and real clients.

* Fetch, one topic entry per unit (bytes/s, records/s, Fetch requests/s): a librdkafka consumer
  at its default fetch sizes (1 MiB per partition; the request-rate case asks for one batch per
  fetch on purpose) draining a prefilled topic T through Sluice is held to T's quota, within a
  floor and a ceiling derived below, and gets every record once, in order; the same client id
  draining a second prefilled topic with no entry is not held (its span is a fraction of T's
  floor), so the budget is the topic's, not the client's.
* ShareFetch: a librdkafka share consumer of a topic with a bytes/s, a records/s or a ShareFetch
  requests/s entry accepts every record exactly once, within the same floor and ceiling, and Sluice
  exports throttled requests for that topic's sensor.

* The Java consumer (ConsumerPerformance, default fetch sizes) fetches in incremental sessions
  (KIP-227): it is held within the same floor and ceiling and gets every record.

Checked against feature removal: with each entry's topic replaced by an unrelated topic, all
four fail: the held topic drained in 0.3 s (bytes), 0.1 s (records) and 0.1 s (requests) against
floors of 8.5, 5.7 and 8.3 s, and the share case (before its span bound was added) failed on the
topic throttle metric having no sample; the share request case so pointed drained in 1.4 s
against its floor of 8.3 s. Without the cap of a Fetch by its topics' budgets
(`QuotaEngine.topic_fetch_cap`) the bytes case gets 0 of 10,000 records in 90 s: every default-size
response is larger than the budget admits in a window, is answered empty and fetched again; and
without the session's topics kept per connection the Java consumer got 2,920 of 10,000 records
(its first burst) in 30 s. Windows are 11 samples of 500 ms.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import create_topic, unique_name
from tests.harness import load
from tests.harness.kafka import KafkaCluster, free_port
from tests.harness.metrics import Metrics
from tests.harness.share import ConfluentShareMember
from tests.harness.sluice import SluiceProcess
from tests.harness.tools import KafkaTools
from tests.harness.wait import wait_until

pytestmark = [pytest.mark.integration]

KiB = 1024
WINDOW = {"samples": 11, "size_ms": 500}
# a fresh sensor lets (samples - 1) windows of quota through at once before it throttles (a
# throttled fetch is answered empty and not recorded, so that burst is never paid back)
BURST_WINDOWS_S = (WINDOW["samples"] - 1) * WINDOW["size_ms"] / 1000


def start_sluice(kafka: KafkaCluster, tmp_path: Path,
                 entries: list[dict[str, Any]]) -> tuple[SluiceProcess, int]:
    port = free_port()
    config = {"metrics": {"port": port}, "quotas": {"window": WINDOW, "entries": entries}}
    return SluiceProcess(kafka.bootstrap, tmp_path / "sluice", config=config).start(), port


def prefill(bootstrap: str, topic: str, total: int, value_bytes: int, batch_bytes: int) -> None:
    """`total` records `{i:08d}` + padding to `value_bytes`, written straight to the broker once
    each and in order (an idempotent producer: a retried batch under load can neither duplicate
    nor reorder records, which the drains' exactly-once-in-order check would blame on Sluice)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": batch_bytes,
                         "enable.idempotence": True})
    pad = b"x" * (value_bytes - 8)
    for i in range(total):
        while True:
            try:
                producer.produce(topic, f"{i:08d}".encode() + pad)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0


def drain_span(bootstrap: str, topic: str, total: int, client_id: str,
               config: dict[str, object] | None = None) -> float:
    """Seconds from the first record to the last of a drain through Sluice; asserts every record
    arrived once, in order."""
    keep: list[bytes] = []
    timeline = load.confluent_drain(bootstrap, topic, 90, client_id=client_id, group=unique_name("g"),
                                    config=config, expect=total, keep=keep)
    got = [int(v[:8]) for v in keep]
    if got != list(range(total)):
        first = next((i for i, (a, b) in enumerate(zip(got, range(total), strict=False)) if a != b), len(got))
        raise AssertionError(f"{len(got)} of {total} records, {len(set(got))} distinct; the first out of "
                             f"place at {first}: {got[max(0, first - 3):first + 3]}")
    times = [t for t, _ in timeline.events]
    return max(times) - min(times)


def log_bytes(bootstrap: str, topic: str) -> int:
    """The bytes of `topic`'s log on the broker (DescribeLogDirs): exactly the record-set bytes a
    drain of it moves, which is what a topic consumer_byte_rate counts."""
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        dirs = admin.describe_log_dirs([topic])
    finally:
        admin.close()
    return sum(int(p["partition_size"]) for broker in dirs for d in broker["log_dirs"]
               for t in d["topics"] if t["name"] == topic for p in t["partitions"])


# The ceiling of a drain's span under Kafka's windowed rate (N samples of W, retention R = N x W),
# for fetches of at most `fetch` units each (a byte or record budget: the engine's cap of one
# sample window, quota x W; a request budget: one request):
# * a burst admits at least quota x (N - 1) x W - fetch before it is throttled (the padded span
#   is at least (N - 1) x W); of each fetch at most `lost_per_fetch` units are lost (a broker cuts
#   a response at max_bytes mid-batch; the client drops the partial batch and fetches it again, but
#   its bytes were counted), so a burst delivers at least that x (1 - lost_per_fetch / fetch);
# * after the last fetch a burst admits (at time a), every sample that holds data started at or
#   before a and took events for at most W, so all have expired by a + W + R; a throttled consumer
#   retries at least every `retry_s` (bytes and records: fetch / quota + 2 W, the excess over the
#   bound being one fetch and the padded span moving by at most two windows meanwhile; requests:
#   W, Kafka's cap on a request quota's throttle), so the next burst starts by a + R + W + retry_s;
# * a burst of k fetches takes k x RTT_S, the retry one more;
# * a request budget also counts every throttled retry (Kafka keeps a request counted; only a
#   fetch's bytes and records are un-recorded when it is emptied): with k retries in the window the
#   excess is at least k, so the k-th waits at least k / quota, and k retries take k^2 / (2 quota):
#   at most sqrt(2 x quota x R) of them stay counted, taken from the next burst.
# So a drain of `units` from a fresh sensor (its span starts at the first burst) ends within
#   ceil((units - burst) / burst) x (k x RTT_S + R + W + retry_s + RTT_S).
# What a held topic shows is about ceil((units - B) / B) x R, B = quota x (N - 1) x W: the windowed
# rate admits each retention period's worth in one burst at its start, so a drain of a few windows
# takes whole retention periods, not (units - B) / quota; over a long drain it averages
# (N - 1) / N of the quota, as Kafka's broker does (bench_fidelity: broker and Sluice consumers
# both at 0.91 x), and a client-id budget drains the same way (tests/unit/quotas/test_engine.py).
SAMPLES = int(WINDOW["samples"])
WINDOW_S = WINDOW["size_ms"] / 1000
RETENTION_S = SAMPLES * WINDOW_S
# the longest one fetch round trip may take on this machine under the suite's load (the request,
# the broker's read, Sluice reading the whole response and the client's poll)
RTT_S = 0.1


def drain_ceiling_s(units: float, quota: float, fetch: float, lost_per_fetch: float, retry_s: float,
                    retries_counted: float = 0.0) -> float:
    """`retries_counted`: what the throttled retries of one cycle leave counted in the window (an
    emptied fetch's bytes and records are un-recorded, so none for those; a request stays counted)."""
    window_units = quota * (SAMPLES - 1) * WINDOW_S
    burst = (window_units - fetch - retries_counted) * (1 - lost_per_fetch / fetch)
    fetches = math.ceil(window_units / (fetch - lost_per_fetch)) + 1
    cycle_s = fetches * RTT_S + RETENTION_S + WINDOW_S + retry_s + RTT_S
    return math.ceil(max(0.0, units - burst) / burst) * cycle_s


# Each case: (entry unit, quota, records, value bytes, producer batch bytes, consumer config).
# The consumers use librdkafka's default fetch sizes (1 MiB per partition, 50 MiB per fetch), which
# ask for more than a topic budget admits in a window: Sluice caps them at one sample window of the
# topic's budget. The floor of T's span is
#   (units - 1.1 * burst) / (1.15 * quota),
# 1.1 and 1.15 the same tolerances as the records/s test of test_quotas_beyond (a sampled window's
# edges and the throttle's granularity), burst = BURST_WINDOWS_S * quota; the ceiling is
# drain_ceiling_s (record overhead in a batch: at most 11 B for these values).
CASES = {
    # 10,000 records x ~110 B = ~1.1 MB at 64 KiB/s: burst 320 KiB, floor ~8.8 s; fetches of
    # 32 KiB, of which one 8 KiB batch may be cut: ceiling ~45 s; ~17.5 s expected (four bursts)
    "consumer_byte_rate": (64 * KiB, 10_000, 100, 8 * KiB, {}),
    # 12,000 records at 1,000/s: burst 5,000, floor ~5.7 s; fetches of 500 records (the cap is
    # the topic's bytes per record x 500), batches of ~140 records: ceiling ~27 s, ~12 s expected
    "consumer_record_rate": (1000, 12_000, 50, 8 * KiB, {}),
    # 150 records of 600 B, one per batch (batch.size below two records); a fetch of at most
    # 1 KiB per partition returns one whole batch (the first is always whole, a second cannot fit),
    # so draining takes >= 150 Fetch requests: at 10/s, burst 50, floor ~8.3 s, ceiling ~35 s;
    # 17-18 s seen (a burst of ~40 useful fetches per retention period, the throttled retries
    # taking the rest).
    # (A request budget caps no fetch: the small fetches are this case's subject.)
    "request_rate": (10, 150, 600, 700, {"max.partition.fetch.bytes": 1024, "fetch.max.bytes": 1024,
                                         "message.max.bytes": 1024}),
}


@pytest.mark.parametrize("unit", list(CASES))
def test_a_topic_consume_quota_holds_that_topic_not_the_client(kafka: KafkaCluster, tmp_path: Path,
                                                              unit: str) -> None:
    quota, total, value_bytes, batch_bytes, consumer_config = CASES[unit]
    held = create_topic(kafka.bootstrap, unique_name("tc-held"))
    free = create_topic(kafka.bootstrap, unique_name("tc-free"))
    for topic in (held, free):
        prefill(kafka.bootstrap, topic, total, value_bytes, batch_bytes)
    units = total * value_bytes if unit == "consumer_byte_rate" else total
    burst = BURST_WINDOWS_S * quota
    floor_s = (units - 1.1 * burst) / (1.15 * quota)
    if unit == "consumer_byte_rate":  # the record-set bytes the budget counts, and a cut batch
        ceiling_s = drain_ceiling_s(log_bytes(kafka.bootstrap, held), quota, quota * WINDOW_S,
                                    batch_bytes + value_bytes + 11, WINDOW_S + 2 * WINDOW_S)
    elif unit == "consumer_record_rate":  # a cut batch's records are not counted, nor delivered
        per_batch = batch_bytes // (value_bytes + 11) + 1
        ceiling_s = drain_ceiling_s(total, quota, quota * WINDOW_S, per_batch, WINDOW_S + 2 * WINDOW_S)
    else:
        ceiling_s = drain_ceiling_s(total, quota, 1, 0, WINDOW_S, math.sqrt(2 * quota * RETENTION_S))
    sluice, port = start_sluice(kafka, tmp_path, [{"topic": held, unit: quota}])
    try:
        held_s = drain_span(sluice.bootstrap, held, total, "tc-reader", consumer_config)
        free_s = drain_span(sluice.bootstrap, free, total, "tc-reader", consumer_config)
        print(f"{unit}={quota}: {held} drained in {held_s:.1f} s (floor {floor_s:.1f} s, ceiling "
              f"{ceiling_s:.1f} s), {free} (no entry, same client) in {free_s:.1f} s")
        assert floor_s <= held_s <= ceiling_s, \
            f"{held} drained in {held_s:.1f} s, floor {floor_s:.1f} s, ceiling {ceiling_s:.1f} s"
        # the unlimited topic is read at the consumer's own pace: well under T's floor
        assert free_s < 0.5 * floor_s, f"{free} took {free_s:.1f} s; T's floor is {floor_s:.1f} s"
        throttled = Metrics(port).value("sluice_quota_topic_throttled_requests_total", topic=held)
        assert throttled is not None and throttled > 0, "no throttled request on the topic sensor"
        assert Metrics(port).value("sluice_quota_topic_throttled_requests_total", topic=free) is None
    finally:
        sluice.stop()


# ShareFetch cases: (quota, records, value bytes, producer batch bytes, share consumer config). As
# for Fetch: bytes: ~1 MB at 64 KiB/s, burst 320 KiB: floor ~7.2 s; records: 9,000 at 1,000/s,
# burst 5,000: floor ~3.0 s. The span is taken from the first poll that saw an accepted record to
# the one that saw the last, so it is short of the true span by at most one poll interval and the
# first poll's batch (<= 100 records, inside the tolerances).
# Requests: every ShareFetch response that carries the topic counts one request on its budget.
# librdkafka's share consumer asks for max.poll.records records a ShareFetch (its max_records), and
# a share fetch acquires whole batches: with one record per batch (batch.size below two records, as
# the Fetch request case) and max.poll.records 1, each ShareFetch brings at most one record, so
# 150 records take >= 150 ShareFetch requests (checked on Sluice's request counter): at 10/s,
# burst 50, floor ~8.3 s.
SHARE_CASES: dict[str, tuple[float, int, int, int, dict[str, object]]] = {
    "consumer_byte_rate": (64 * KiB, 9000, 100, 8 * KiB, {}),
    "consumer_record_rate": (1000, 9000, 50, 8 * KiB, {}),
    "request_rate": (10, 150, 600, 700, {"max.poll.records": 1}),
}


@pytest.mark.parametrize("unit", list(SHARE_CASES))
def test_a_share_consumer_is_held_by_a_topic_consume_quota_and_accepts_every_record_once(
        kafka: KafkaCluster, tmp_path: Path, unit: str) -> None:
    quota, total, value_bytes, batch_bytes, consumer_config = SHARE_CASES[unit]
    topic = create_topic(kafka.bootstrap, unique_name("tc-share"))
    prefill(kafka.bootstrap, topic, total, value_bytes, batch_bytes)
    units = total * value_bytes if unit == "consumer_byte_rate" else total
    floor_s = (units - 1.1 * BURST_WINDOWS_S * quota) / (1.15 * quota)
    # the ceiling of a Fetch consumer's drain holds for a share consumer too: its fetches are capped
    # alike (max_bytes, or max_records for records) and throttled by the same sensor and formula,
    # and a throttled one is delivered, not emptied (so at most a cut batch is lost, never a whole
    # response; a share fetch's records are whole batches)
    if unit == "consumer_byte_rate":
        ceiling_s = drain_ceiling_s(log_bytes(kafka.bootstrap, topic), quota, quota * WINDOW_S,
                                    8 * KiB + value_bytes + 11, WINDOW_S + 2 * WINDOW_S)
    elif unit == "consumer_record_rate":  # max_records is a hint: a share fetch is only sure to
        # bring one (full) batch
        per_batch = (8 * KiB - 61) // (value_bytes + 11)
        ceiling_s = drain_ceiling_s(total, quota, quota * WINDOW_S, quota * WINDOW_S - per_batch,
                                    WINDOW_S + 2 * WINDOW_S)
    else:  # fetches of one request, each bringing its record; no throttled retry stays counted (a
        # throttled share fetch is delivered: the next one waits out the delay, at most W for a
        # request quota, instead of being emptied and sent again)
        ceiling_s = drain_ceiling_s(total, quota, 1, 0, WINDOW_S)
    sluice, port = start_sluice(kafka, tmp_path, [{"topic": topic, unit: quota}])
    group = unique_name("tc-sg")
    member: ConfluentShareMember | None = None
    first: list[float] = []
    try:
        # librdkafka has no admin call for group configs: set share.auto.offset.reset with Kafka's tool
        KafkaTools(sluice.bootstrap).configs("--alter", "--entity-type", "groups", "--entity-name", group,
                                             "--add-config", "share.auto.offset.reset=earliest").check()
        member = ConfluentShareMember(sluice.bootstrap, group, topic, "tc-share-reader",
                                      config=consumer_config)

        def done() -> bool:
            assert member is not None
            count = member.log.count()
            if count and not first:
                first.append(time.monotonic())
            return count >= total or member.failure is not None

        wait_until(done, 120, f"{total} records accepted (so far {member.log.count()})")
        span_s = time.monotonic() - first[0]
        member.stop()
        assert member.failure is None, member.failure
        values = [int(d.value[:8]) for d in member.log.accepted]
        assert sorted(values) == list(range(total)), f"{len(values)} accepted, {len(set(values))} distinct"
        print(f"share consumer, {unit}={quota}: {total} records in {span_s:.1f} s (floor {floor_s:.1f} s, "
              f"ceiling {ceiling_s:.1f} s)")
        assert floor_s <= span_s <= ceiling_s, \
            f"{total} records accepted in {span_s:.1f} s, floor {floor_s:.1f} s, ceiling {ceiling_s:.1f} s"
        throttled = Metrics(port).value("sluice_quota_topic_throttled_requests_total", topic=topic)
        assert throttled is not None and throttled > 0, "no throttled request on the topic sensor"
        if unit == "request_rate":  # the floor's premise: at least one ShareFetch per record
            share_fetches = Metrics(port).value("sluice_requests_total", api="ShareFetch") or 0
            print(f"{share_fetches:.0f} ShareFetch requests through Sluice")
            assert share_fetches >= total, f"{share_fetches} ShareFetch requests for {total} records"
    finally:
        if member is not None:
            member.stop()
        sluice.stop()


def test_a_java_consumer_in_a_fetch_session_is_held_by_a_topic_byte_quota_at_default_sizes(
        kafka: KafkaCluster, tmp_path: Path) -> None:
    """The Java consumer fetches in incremental sessions (KIP-227): after its first full request
    it lists only the partitions whose position changed, none after an emptied response. Sluice
    keeps the session's topics per connection, so every fetch of the held topic is capped by its
    budget; without that the fetch after an emptied one asks 1 MiB again and is emptied forever."""
    quota = 64 * KiB
    total = 10_000
    value_bytes = 100
    topic = create_topic(kafka.bootstrap, unique_name("tc-java"))
    prefill(kafka.bootstrap, topic, total, value_bytes, 8 * KiB)
    floor_s = (total * value_bytes - 1.1 * BURST_WINDOWS_S * quota) / (1.15 * quota)
    ceiling_s = drain_ceiling_s(log_bytes(kafka.bootstrap, topic), quota, quota * WINDOW_S,
                                8 * KiB + value_bytes + 11, WINDOW_S + 2 * WINDOW_S)
    sluice, port = start_sluice(kafka, tmp_path, [{"topic": topic, "consumer_byte_rate": quota}])
    try:
        result = KafkaTools(sluice.bootstrap).consumer_perf(topic, total, group=unique_name("tc-jg"),
                                                            timeout_ms=30_000)
        assert result.records == total, f"{result.records} of {total} records"
        # ConsumerPerformance's fetch time runs from its first fetch (after the group join) to its
        # last record: the drain's span and at most one round trip before its first record
        span_s = result.mb / result.fetch_mb_per_s if result.fetch_mb_per_s else math.inf
        print(f"java consumer: {result.records} records in {span_s:.1f} s (floor {floor_s:.1f} s, "
              f"ceiling {ceiling_s:.1f} s)")
        assert floor_s <= span_s <= ceiling_s + RTT_S, \
            f"{total} records in {span_s:.1f} s, floor {floor_s:.1f} s, ceiling {ceiling_s:.1f} s"
        throttled = Metrics(port).value("sluice_quota_topic_throttled_requests_total", topic=topic)
        assert throttled is not None and throttled > 0, "no throttled request on the topic sensor"
    finally:
        sluice.stop()
