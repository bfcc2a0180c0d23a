"""Issue 26: topic quotas on the consume side, through a real Sluice process, against real Kafka
and real clients.

* Fetch, one topic entry per unit (bytes/s, records/s, Fetch requests/s): a librdkafka consumer
  draining a prefilled topic T through Sluice is held to T's quota and gets every record once, in
  order; the same client id draining a second prefilled topic with no entry is not held (its span is
  a fraction of T's floor), so the budget is the topic's, not the client's.
* ShareFetch: a librdkafka share consumer of a topic with a bytes/s entry accepts every record
  exactly once, takes at least the floor the quota implies, and Sluice exports throttled requests
  for that topic's sensor.

Checked against feature removal: with each entry's topic replaced by an unrelated topic, all
four fail: the held topic drained in 0.3 s (bytes), 0.1 s (records) and 0.1 s (requests) against
floors of 8.5, 5.7 and 8.3 s, and the share case (before its span bound was added) failed on the
topic throttle metric having no sample. Windows are 11 samples of 500 ms.
"""

from __future__ import annotations

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
    """`total` records `{i:08d}` + padding to `value_bytes`, written straight to the broker."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": batch_bytes})
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
    assert [int(v[:8]) for v in keep] == list(range(total)), f"{len(keep)} of {total} records"
    times = [t for t, _ in timeline.events]
    return max(times) - min(times)


# Sluice caps a Fetch's max_bytes at what the CLIENT's budgets allow in one window, not a topic's:
# a fetch larger than a topic budget's whole window (librdkafka asks for 1 MiB per partition) is
# emptied and fetched again forever. The consumers here ask for at most 16 KiB per fetch.
SMALL_FETCHES: dict[str, object] = {"max.partition.fetch.bytes": 16 * KiB, "fetch.max.bytes": 16 * KiB,
                                     "message.max.bytes": 16 * KiB}

# Each case: (entry unit, quota, records, value bytes, producer batch bytes, consumer config,
# how many quota units one record costs at most / at least). The floor of T's span is
#   (units - 1.1 * burst) / (1.15 * quota),
# 1.1 and 1.15 the same tolerances as the records/s test of test_quotas_beyond (a sampled window's
# edges and the throttle's granularity), burst = BURST_WINDOWS_S * quota.
CASES = {
    # 10,000 records x ~100 B = ~1 MB at 64 KiB/s: burst 320 KiB, floor ~8.8 s, ~10.6 s expected.
    # 8 KiB batches, fetches of <= 16 KiB + one batch: well inside a window's quota.
    "consumer_byte_rate": (64 * KiB, 10_000, 100, 8 * KiB, SMALL_FETCHES),
    # 12,000 records at 1,000/s: burst 5,000, floor ~5.7 s, ~7 s expected; batches of ~140
    # records, fetches of <= ~420 records: inside a window's quota (500).
    "consumer_record_rate": (1000, 12_000, 50, 8 * KiB, SMALL_FETCHES),
    # 150 records of 600 B, one per batch (batch.size below two records); a fetch of at most
    # 1 KiB per partition returns one whole batch (the first is always whole, a second cannot fit),
    # so draining takes >= 150 Fetch requests: at 10/s, burst 50, floor ~8.3 s, ~10 s expected.
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
    sluice, port = start_sluice(kafka, tmp_path, [{"topic": held, unit: quota}])
    try:
        held_s = drain_span(sluice.bootstrap, held, total, "tc-reader", consumer_config)
        free_s = drain_span(sluice.bootstrap, free, total, "tc-reader", consumer_config)
        print(f"{unit}={quota}: {held} drained in {held_s:.1f} s (floor {floor_s:.1f} s), "
              f"{free} (no entry, same client) in {free_s:.1f} s")
        assert held_s >= floor_s, f"{held} drained in {held_s:.1f} s, floor {floor_s:.1f} s"
        # the unlimited topic is read at the consumer's own pace: well under T's floor
        assert free_s < 0.5 * floor_s, f"{free} took {free_s:.1f} s; T's floor is {floor_s:.1f} s"
        throttled = Metrics(port).value("sluice_quota_topic_throttled_requests_total", topic=held)
        assert throttled is not None and throttled > 0, "no throttled request on the topic sensor"
        assert Metrics(port).value("sluice_quota_topic_throttled_requests_total", topic=free) is None
    finally:
        sluice.stop()


def test_a_share_consumer_is_held_by_a_topic_byte_quota_and_accepts_every_record_once(
        kafka: KafkaCluster, tmp_path: Path) -> None:
    quota = 64 * KiB
    total = 9000
    value_bytes = 100
    topic = create_topic(kafka.bootstrap, unique_name("tc-share"))
    prefill(kafka.bootstrap, topic, total, value_bytes, 8 * KiB)
    # as for Fetch: ~900 KB at 64 KiB/s, burst 320 KiB: floor ~7.2 s, ~8.7 s expected. The span is
    # taken from the first poll that saw an accepted record to the one that saw the last, so it is
    # short of the true span by at most one poll interval and the first poll's batch (<= 100
    # records = 10 KB, inside the tolerances).
    floor_s = (total * value_bytes - 1.1 * BURST_WINDOWS_S * quota) / (1.15 * quota)
    sluice, port = start_sluice(kafka, tmp_path, [{"topic": topic, "consumer_byte_rate": quota}])
    group = unique_name("tc-sg")
    member: ConfluentShareMember | None = None
    first: list[float] = []
    try:
        # librdkafka has no admin call for group configs: set share.auto.offset.reset with Kafka's tool
        KafkaTools(sluice.bootstrap).configs("--alter", "--entity-type", "groups", "--entity-name", group,
                                             "--add-config", "share.auto.offset.reset=earliest").check()
        member = ConfluentShareMember(sluice.bootstrap, group, topic, "tc-share-reader")

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
        print(f"share consumer: {total} records in {span_s:.1f} s (floor {floor_s:.1f} s)")
        assert span_s >= floor_s, f"{total} records accepted in {span_s:.1f} s, floor {floor_s:.1f} s"
        throttled = Metrics(port).value("sluice_quota_topic_throttled_requests_total", topic=topic)
        assert throttled is not None and throttled > 0, "no throttled request on the topic sensor"
    finally:
        if member is not None:
            member.stop()
        sluice.stop()
