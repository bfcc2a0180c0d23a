"""KIP-219 against the broker's own behaviour: a slow acks=all produce waits its latency and then
the throttle delay, on the broker and through Sluice alike (issue 26).

Kafka records a produce quota in the response callback, so the delay (the channel's mute) starts
when the response is sent, not when the request arrived. The same client (librdkafka, which does
no KIP-219 back-off of its own, so the mute is all that holds it), the same quota, twice: direct
to the cluster with the broker's quota (`kafka-configs`), and through Sluice with the same quota
in its entries. Produce 1 (about 600 KB, acks=all) goes to a partition whose follower is stopped
(SIGSTOP) for `PAUSE_S`, so its latency L1 is about that long; produce 2 (one small record) goes to
a partition the same broker leads alone, queued behind it on the one connection (one request in
flight), so it is sent as soon as response 1 arrives.

A fresh sensor's rate is divided by (11 - 1) x 1 s: 600 KB / 10 s = 60 KB/s against 50 KiB/s,
throttle T1 = (60 000 - 51 200) / 51 200 x 10 000 ms = about 1.7 s. Delay from the response: the
second response comes T1 + L2 after the first (L2 a few ms). Delay from the request: T1 - L1 < 0,
so it would come at once. Both paths must show the gap of at least 0.8 x T1 (the 20 %: the
request's exact size and the machine's timers), and Sluice's within 25 % of the broker's.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import unique_name
from tests.harness.kafka import KafkaCluster
from tests.harness.sluice import SluiceProcess
from tests.harness.tools import KafkaTools
from tests.harness.wait import wait_until

pytestmark = [pytest.mark.integration]

QUOTA = 50 * 1024
RECORD = 600_000
PAUSE_S = 2.5
WINDOW_S = 10.0  # (11 - 1) x 1 s: a fresh sensor's window, broker and Sluice alike
T1_S = (RECORD / WINDOW_S - QUOTA) / QUOTA * WINDOW_S


def create(cluster: KafkaCluster, name: str, replicas: list[int]) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=1, replica_assignment=[replicas],
                                            config={"max.message.bytes": "2000000"})],
                                  operation_timeout=30)
    futures[name].result(60)
    return name


def gap_after_a_slow_produce(bootstrap: str, client_id: str, slow: str, fast: str,
                             follower: KafkaCluster, follower_id: int) -> tuple[float, float]:
    """(L1, gap): produce 1's latency, and the time from its delivery to produce 2's."""
    from confluent_kafka import Producer

    in_flight: list[int] = []  # produce 1's messages sent and awaiting their response

    def stats(text: str) -> None:
        partition = json.loads(text).get("topics", {}).get(slow, {}).get("partitions", {}).get("0", {})
        in_flight.append(int(partition.get("msgs_inflight", 0)))

    delivered: dict[str, float] = {}

    def on_delivery(name: str) -> Any:
        def done(err: object, msg: object) -> None:
            assert err is None, err
            delivered[name] = time.monotonic()
        return done

    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "acks": "all",
                         "linger.ms": 0, "max.in.flight": 1, "message.max.bytes": 2_000_000,
                         "statistics.interval.ms": 20, "stats_cb": stats})
    try:
        producer.list_topics(slow, timeout=30)
        producer.list_topics(fast, timeout=30)
        node = follower.node(follower_id)
        assert node.process is not None
        os.killpg(node.process.pid, signal.SIGSTOP)
        # the follower's stop is produce 1's latency: it resumes after PAUSE_S, as a slow disk or
        # a long GC pause would
        resume = threading.Timer(PAUSE_S, os.killpg, (node.process.pid, signal.SIGCONT))
        resume.start()
        try:
            sent = time.monotonic()
            producer.produce(slow, b"x" * RECORD, partition=0, on_delivery=on_delivery("slow"))
            # produce 2 only once produce 1 is on the wire (else librdkafka might send it first, or
            # both in one request): the statistics show produce 1's message awaiting its response
            wait_until(lambda: producer.poll(0.02) >= 0 and bool(in_flight) and in_flight[-1] > 0,
                       timeout_s=10, what="produce 1 in flight")
            producer.produce(fast, b"y", partition=0, on_delivery=on_delivery("fast"))
            producer.flush(60)
        finally:
            resume.join()
            os.killpg(node.process.pid, signal.SIGCONT)
    finally:
        producer.flush(10)
    return delivered["slow"] - sent, delivered["fast"] - delivered["slow"]


@pytest.fixture
def topics(kafka_cluster3: KafkaCluster) -> Iterator[tuple[str, str, int, int]]:
    leader, follower = kafka_cluster3.nodes[0].node_id, kafka_cluster3.nodes[1].node_id
    slow = create(kafka_cluster3, unique_name("kip219-slow"), [leader, follower])
    fast = create(kafka_cluster3, unique_name("kip219-fast"), [leader])
    yield slow, fast, leader, follower


def test_a_slow_acks_all_produce_waits_latency_then_delay_as_on_the_broker(
        kafka_cluster3: KafkaCluster, topics: tuple[str, str, int, int], tmp_path: Path) -> None:
    slow, fast, _leader, follower = topics
    direct_id, sluice_id = unique_name("kip219-direct"), unique_name("kip219-sluice")
    tools = KafkaTools(kafka_cluster3.bootstrap, workdir=tmp_path / "tools")
    tools.configs("--alter", "--add-config", f"producer_byte_rate={QUOTA}", "--entity-type", "clients",
                  "--entity-name", direct_id).check()
    try:
        wait_until(lambda: f"producer_byte_rate={QUOTA}" in tools.configs(
            "--describe", "--entity-type", "clients", "--entity-name", direct_id).stdout, timeout_s=30,
            what="the broker's quota")
        broker_l1, broker_gap = gap_after_a_slow_produce(kafka_cluster3.bootstrap, direct_id, slow, fast,
                                                         kafka_cluster3, follower)
    finally:
        tools.configs("--alter", "--delete-config", "producer_byte_rate", "--entity-type", "clients",
                      "--entity-name", direct_id)
    sluice = SluiceProcess(kafka_cluster3.bootstrap, tmp_path / "sluice", config={
        "quotas": {"entries": [{"client_id": sluice_id, "producer_byte_rate": QUOTA}]}}).start()
    try:
        sluice_l1, sluice_gap = gap_after_a_slow_produce(sluice.bootstrap, sluice_id, slow, fast,
                                                         kafka_cluster3, follower)
    finally:
        sluice.stop()
    print(f"T1 {T1_S:.2f} s; broker: L1 {broker_l1:.2f} s, gap {broker_gap:.2f} s; "
          f"Sluice: L1 {sluice_l1:.2f} s, gap {sluice_gap:.2f} s")
    # the test means something only if produce 1 was slower than its delay
    assert broker_l1 > T1_S and sluice_l1 > T1_S, (broker_l1, sluice_l1)
    assert broker_gap >= 0.8 * T1_S, broker_gap        # the broker: the delay ran from the response
    assert sluice_gap >= 0.8 * T1_S, sluice_gap        # so does Sluice's
    assert abs(sluice_gap - broker_gap) <= 0.25 * broker_gap, (sluice_gap, broker_gap)
