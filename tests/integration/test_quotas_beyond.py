"""Issue 13 against a real broker and real clients, through a real Sluice: each test fails if its
feature is off.

* token bucket: a producer under ``rate_model: token_bucket`` never goes above 1.2 x its quota in
  any second after the first, while one under Kafka's windowed rate, beside it, bursts again; a
  consumer of batches larger than the burst is held to its quota and gets every record;
* topic quotas: a producer writing two topics is held to the quota of one of them while the other
  flows at several times that rate (a client quota would hold both); a Java producer (Produce v13,
  topics by id) is held to a topic quota too;
* records per second: a producer of small records is held to a records/s quota within ±15 %; a
  consumer is held to at most its quota after a fresh sensor's burst, and loses nothing;
* client-id prefixes: ``etl-1`` and ``etl-2`` share one prefix quota.

Windows are 11 samples of 500 ms; windowed rates are measured over three whole sawtooth periods
(16.5 s) from the first delivery, as in test_quota_enforcement. Rates are measured from what the
broker acknowledged (producers) or what the consumer received.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import create_topic, unique_name
from tests.harness import load
from tests.harness.kafka import KafkaCluster, free_port
from tests.harness.sluice import SluiceProcess
from tests.harness.tools import KafkaTools

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KiB = 1024
MiB = 1024 * 1024
WINDOW = {"samples": 11, "size_ms": 500}
PERIOD_S = 11 * 0.5
RUN_S = 3 * PERIOD_S


def start_sluice(kafka: KafkaCluster, tmp_path: Path, entries: list[dict[str, Any]],
                 **quotas: Any) -> tuple[SluiceProcess, int]:
    port = free_port()
    config = {"metrics": {"port": port}, "quotas": {"window": WINDOW, "entries": entries, **quotas}}
    return SluiceProcess(kafka.bootstrap, tmp_path / "sluice", config=config).start(), port


def metric_lines(port: int, name: str) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def per_second(timeline: load.Timeline, seconds: int) -> list[float]:
    """Acknowledged bytes in each second from the first delivery."""
    first = min(t for t, _ in timeline.events)
    out = [0.0] * seconds
    for t, n in timeline.events:
        i = int(t - first)
        if i < seconds:
            out[i] += n
    return out


def flood_topics(bootstrap: str, weights: Mapping[str, int], seconds: float, *, record_size: int,
                 client_id: str, batch_bytes: int) -> dict[str, load.Timeline]:
    """One librdkafka producer writing several topics, `weights[t]` records to topic t in turn, as
    fast as Sluice lets it: per topic, what the broker acknowledged."""
    from confluent_kafka import Producer

    timelines = {topic: load.Timeline() for topic in weights}
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "linger.ms": 5,
                         "batch.size": batch_bytes, "queue.buffering.max.kbytes": 4 * batch_bytes // 1024,
                         "acks": 1})
    value = b"x" * record_size
    order = [topic for topic, weight in weights.items() for _ in range(weight)]

    def delivered_to(topic: str) -> Any:
        def delivered(err: object, msg: object) -> None:
            if err is None:
                timelines[topic].add(record_size)
        return delivered

    callbacks = {topic: delivered_to(topic) for topic in weights}
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        topic = order[i % len(order)]
        try:
            producer.produce(topic, value, on_delivery=callbacks[topic])
            i += 1
        except BufferError:
            producer.poll(0.05)
            continue
        producer.poll(0)
    producer.purge()
    producer.flush(30)
    return timelines


# ----------------------------------------------------------------------------- token bucket

def test_token_bucket_producer_has_no_periodic_bursts_while_the_windowed_one_does(
        kafka: KafkaCluster, tmp_path: Path) -> None:
    # a quota the loaded machine can exceed tenfold, and a burst of 100 ms of quota: a bucket that
    # fills while its client is slow (starting up, say) lets it send the burst on top of the refill
    quota = 256 * KiB
    seconds = 14
    sluice, _ = start_sluice(kafka, tmp_path, [
        {"client_id": "tb-flood", "producer_byte_rate": quota, "rate_model": "token_bucket",
         "burst_ms": 100},
        {"client_id": "win-flood", "producer_byte_rate": quota}])
    try:
        topic = create_topic(kafka.bootstrap, unique_name("tb"))
        got: dict[str, load.Timeline] = {}

        def run(client_id: str) -> None:
            got[client_id] = load.confluent_flood(sluice.bootstrap, topic, seconds + 2, record_size=1000,
                                                  client_id=client_id, batch_bytes=8 * KiB)

        threads = [threading.Thread(target=run, args=(c,)) for c in ("tb-flood", "win-flood")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        bucket = [b / quota for b in per_second(got["tb-flood"], seconds)]
        windowed = [b / quota for b in per_second(got["win-flood"], seconds)]
        print(f"token bucket per second / Q: {[round(v, 2) for v in bucket]}")
        print(f"windowed per second / Q:     {[round(v, 2) for v in windowed]}")
        assert max(bucket[1:]) <= 1.2, bucket
        # held, not stalled: over the seconds after the first it moves at about the quota
        assert 0.7 <= sum(bucket[1:]) / (seconds - 1) <= 1.1, bucket
        # the windowed rate lets the same client burst again once old samples leave the window
        assert max(windowed[1:]) > 1.2, windowed
    finally:
        sluice.stop()


def test_token_bucket_consumer_of_batches_larger_than_the_burst_is_held_and_loses_nothing(
        kafka: KafkaCluster, tmp_path: Path) -> None:
    """Under the bucket a fetch is delivered while the credits are not negative and then throttles
    what follows. Here every batch (64 KiB) is larger than the burst (100 ms of 256 KiB/s =
    25.6 KiB) and a broker returns a partition's first batch whole: were a fetch emptied whenever
    it did not fit in the credits, the consumer would never get a record."""
    from confluent_kafka import Producer

    quota, total, size = 256 * KiB, 2400, 1000
    topic = create_topic(kafka.bootstrap, unique_name("tbc"))
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 50, "batch.size": 64 * KiB})
    for i in range(total):
        while True:
            try:
                producer.produce(topic, f"{i:08d}".encode() + b"x" * (size - 8))
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)
    sluice, _ = start_sluice(kafka, tmp_path, [
        {"client_id": "tb-reader", "consumer_byte_rate": quota, "rate_model": "token_bucket",
         "burst_ms": 100}])
    try:
        keep: list[bytes] = []
        timeline = load.confluent_drain(sluice.bootstrap, topic, 90, client_id="tb-reader",
                                        group=unique_name("g"), expect=total, keep=keep)
        # every record, once, in order: delivered fetches and the empty ones in debt lose nothing
        assert [int(v[:8]) for v in keep] == list(range(total)), f"{len(keep)} of {total} records"
        times = [t for t, _ in timeline.events]
        span_s = max(times) - min(times)
        # at most the quota: what arrived after the first response is at most quota x span + the
        # burst + one response (64 KiB batches plus framing), with 15 % for the loaded machine
        floor_s = (total * size - 64 * KiB - 25.6 * KiB - 80 * KiB) / (1.15 * quota)
        print(f"{total} records of {size} B in {span_s:.1f} s: {total * size / span_s / KiB:.0f} KiB/s "
              f"(quota {quota // KiB} KiB/s); at most the quota needs >= {floor_s:.1f} s")
        assert span_s >= floor_s, f"{total} records in {span_s:.1f} s"
    finally:
        sluice.stop()


def test_token_bucket_consumer_of_batches_near_a_second_of_quota_gets_no_second_above_quota_and_burst(
        kafka: KafkaCluster, tmp_path: Path) -> None:
    """A consumer with max.partition.fetch.bytes of 1 MiB at a 1 MiB/s token bucket (burst 100 ms),
    reading batches of 0.7 MiB: each response is one batch (Sluice caps max_bytes at 100 ms of
    quota, and a broker returns a partition's first batch whole). Without the bucket's guard each
    response is admitted at zero credits and they come every 0.7 s, so every other second holds
    two: 1.4 x the quota (the issue saw 1.23 x with 1 MiB ones; 1.88 x over a sliding second)."""
    from confluent_kafka import Producer

    quota, record = 1 * MiB, 10_000
    batch = int(0.7 * MiB)
    seconds = 10
    topic = create_topic(kafka.bootstrap, unique_name("tbb"))
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 500, "batch.size": batch,
                         "compression.type": "none"})
    for _ in range((seconds + 4) * quota // record):
        while True:
            try:
                producer.produce(topic, b"x" * record)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)
    sluice, _ = start_sluice(kafka, tmp_path, [
        {"client_id": "tb-big", "consumer_byte_rate": quota, "rate_model": "token_bucket", "burst_ms": 100}])
    try:
        timeline = load.confluent_drain(sluice.bootstrap, topic, seconds + 1, client_id="tb-big",
                                        group=unique_name("g"),
                                        config={"max.partition.fetch.bytes": MiB,
                                                "fetch.max.bytes": 50 * MiB})
        got = [b / quota for b in per_second(timeline, seconds)]
        print(f"token bucket fetch per second / Q: {[round(v, 2) for v in got]}")
        # Every whole second after the first within Q x 1 s + B = 1.1 x Q: what the engine lets
        # through in any second at Sluice; here that is one 0.7 Q response per second (two are
        # 1.4 Q). The first second is the bucket's burst (B = 0.1 Q) and the first response.
        assert max(got[1:]) <= 1.1, got
        # held, not starved: one response per second and a round trip (< 0.4 s on the loaded
        # machine) is at least 0.7 / 1.4 = 0.5 x the quota
        assert sum(got[1:]) / (seconds - 1) >= 0.5, got
    finally:
        sluice.stop()


# ----------------------------------------------------------------------------- topics

def test_topic_quota_holds_one_topic_while_the_other_flows(kafka: KafkaCluster, tmp_path: Path) -> None:
    quota = 256 * KiB
    held = unique_name("held")
    free = unique_name("free")
    sluice, port = start_sluice(kafka, tmp_path, [{"topic": held, "producer_byte_rate": quota}])
    try:
        for topic in (held, free):
            create_topic(kafka.bootstrap, topic)
        timelines = flood_topics(sluice.bootstrap, {held: 1, free: 4}, RUN_S + 1, record_size=1000,
                                 client_id="two-topics", batch_bytes=16 * KiB)
        held_rate = timelines[held].rate_from_first(RUN_S)
        free_rate = timelines[free].rate_from_first(RUN_S)
        print(f"held topic {held_rate / quota:.3f} x quota, the other {free_rate / quota:.3f} x quota")
        assert 0.85 * quota <= held_rate <= 1.15 * quota, f"{held_rate / quota:.3f} x quota"
        # the other topic is not limited: it carries its 4 shares, far past the held topic's quota
        assert free_rate >= 3 * quota, f"{free_rate / quota:.3f} x quota"
        lines = metric_lines(port, "sluice_quota_topic_throttled_requests_total")
        assert any(f'topic="{held}"' in line for line in lines), lines
        assert not any(f'topic="{free}"' in line for line in lines), lines
    finally:
        sluice.stop()


def test_java_producer_is_held_to_a_topic_prefix_quota(kafka: KafkaCluster, tmp_path: Path) -> None:
    quota = 256 * KiB
    prefix = unique_name("pfx") + "-"
    sluice, _ = start_sluice(kafka, tmp_path, [{"topic_prefix": prefix, "producer_byte_rate": quota}])
    try:
        topic = create_topic(kafka.bootstrap, prefix + "a")
        tools = KafkaTools(sluice.bootstrap, workdir=tmp_path)
        with load.WatermarkSampler(kafka.bootstrap, topic) as sampler:
            tools.producer_perf(topic, int(quota * (RUN_S + PERIOD_S) / 1000), 1000,
                                props={"acks": "1", "client.id": "java-topic", "batch.size": "16384"})
        # over whole throttle cycles of the log's growth: Java waits out each throttle itself besides
        # Sluice's mute, so on a loaded machine the periods stretch, and a fixed span of three
        # periods holds fewer bursts (0.81 x measured so)
        achieved = sampler.timeline(1000).cycle_rate(0, RUN_S + PERIOD_S, or_plain=True)
        records, span_s = sampler.records_between(0, RUN_S)
        print(f"java producer, topic prefix quota: {achieved / quota:.3f} x quota over whole cycles "
              f"({records * 1000 / span_s / quota:.3f} x over the first {span_s:.1f} s)")
        assert 0.85 * quota <= achieved <= 1.15 * quota, f"{achieved / quota:.3f} x quota"
    finally:
        sluice.stop()


# ----------------------------------------------------------------------------- records per second

def test_records_per_second_quota_holds_a_producer_of_small_records(kafka: KafkaCluster,
                                                                   tmp_path: Path) -> None:
    quota = 2000  # records/s; 50-byte records: 100 KB/s, far under any byte quota
    sluice, port = start_sluice(kafka, tmp_path, [{"client_id": "small", "producer_record_rate": quota}])
    try:
        topic = create_topic(kafka.bootstrap, unique_name("rec"))
        timeline = load.confluent_flood(sluice.bootstrap, topic, RUN_S + 1, record_size=50, client_id="small",
                                        batch_bytes=8 * KiB)
        first = min(t for t, _ in timeline.events)
        records = sum(1 for t, _ in timeline.events if first <= t < first + RUN_S)
        achieved = records / RUN_S
        print(f"{achieved:.0f} records/s against {quota}")
        assert 0.85 * quota <= achieved <= 1.15 * quota, f"{achieved / quota:.3f} x quota"
        lines = metric_lines(port, "sluice_quota_throttled_requests_total")
        assert any('kind="producer_record_rate"' in line and 'client_id="small"' in line for line in lines)
    finally:
        sluice.stop()


def test_records_per_second_quota_holds_a_consumer_and_loses_nothing(kafka: KafkaCluster,
                                                                    tmp_path: Path) -> None:
    from confluent_kafka import Producer

    quota = 2000
    total = 30_000
    topic = create_topic(kafka.bootstrap, unique_name("crec"))
    # batches of ~270 records: a broker returns a partition's first batch whole whatever max_bytes
    # says, so batches far larger than the quota's window could not be held record by record
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 20, "batch.size": 16384})
    for i in range(total):
        while True:
            try:
                producer.produce(topic, f"{i:08d}".encode() + b"x" * 42)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)
    sluice, _ = start_sluice(kafka, tmp_path, [{"client_id": "slow-reader", "consumer_record_rate": quota}])
    try:
        keep: list[bytes] = []
        timeline = load.confluent_drain(sluice.bootstrap, topic, 90, client_id="slow-reader",
                                        group=unique_name("g"), expect=total, keep=keep)
        times = [t for t, _ in timeline.events]
        span_s = max(times) - min(times)
        # a fresh sensor lets (N-1) windows of quota through at once (a throttled fetch is emptied
        # and un-recorded, so that burst is never paid back); the rest moves at most at the quota
        burst = (WINDOW["samples"] - 1) * WINDOW["size_ms"] / 1000 * quota
        floor_s = (total - 1.1 * burst) / (1.15 * quota)
        print(f"{total} records in {span_s:.1f} s ({(total - burst) / span_s:.0f} records/s after the burst, "
              f"quota {quota}); at most the quota needs >= {floor_s:.1f} s")
        assert span_s >= floor_s, f"{total} records in {span_s:.1f} s"
        # throttled fetches were answered empty and fetched again: every record, once, in order
        assert [int(v[:8]) for v in keep] == list(range(total))
    finally:
        sluice.stop()


# ----------------------------------------------------------------------------- client-id prefixes

def test_a_prefix_quota_is_shared_by_its_members(kafka: KafkaCluster, tmp_path: Path) -> None:
    quota = 512 * KiB
    sluice, port = start_sluice(kafka, tmp_path, [{"client_id_prefix": "etl-", "producer_byte_rate": quota}])
    try:
        topic = create_topic(kafka.bootstrap, unique_name("etl"))
        got: dict[str, load.Timeline] = {}

        def run(client_id: str) -> None:
            got[client_id] = load.confluent_flood(sluice.bootstrap, topic, RUN_S + 2, record_size=1000,
                                                  client_id=client_id, batch_bytes=16 * KiB)

        threads = [threading.Thread(target=run, args=(c,)) for c in ("etl-1", "etl-2")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        together = load.Timeline(events=got["etl-1"].events + got["etl-2"].events)
        achieved = together.rate_from_first(RUN_S)
        print(f"etl-1 + etl-2: {achieved / quota:.3f} x the prefix quota")
        assert 0.85 * quota <= achieved <= 1.15 * quota, f"{achieved / quota:.3f} x quota"
        assert got["etl-1"].total_bytes > 0 and got["etl-2"].total_bytes > 0
        lines = metric_lines(port, "sluice_quota_limit")
        assert any('client_id="etl-*"' in line for line in lines), lines
    finally:
        sluice.stop()
