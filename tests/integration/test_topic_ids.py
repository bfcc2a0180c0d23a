"""Topic ids named by the process that meets them (issue 26): a client that fetches by topic id
(Fetch v16) through a Sluice that never forwarded a Metadata response naming that topic (the
client learned the id elsewhere: another instance, another worker, or the broker) is matched to
its topic's quota once Sluice has asked the broker itself. Real Kafka, a real Sluice process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import create_topic, unique_name
from tests.harness.kafka import KafkaCluster, free_port
from tests.harness.metrics import Metrics
from tests.harness.quotas import WINDOW
from tests.harness.rawclient import RawKafkaSocket, metadata_request
from tests.harness.sluice import SluiceProcess
from tests.harness.wait import wait_until
from tests.integration.test_kafka4_leader_move import fetch_v16, metadata

pytestmark = pytest.mark.integration


def test_a_fetch_by_an_id_this_process_never_saw_named_is_charged_to_its_topic(
        kafka: KafkaCluster, tmp_path: Path) -> None:
    topic = create_topic(kafka.bootstrap, unique_name("by-id"))
    _fill(kafka.bootstrap, topic, 50)
    port = free_port()
    sluice = SluiceProcess(kafka.bootstrap, tmp_path / "sluice", config={
        "metrics": {"port": port},
        "quotas": {"window": WINDOW, "entries": [{"topic": topic, "consumer_byte_rate": 10_000}]}}).start()
    metrics = Metrics(port)
    try:
        # the id, from the broker itself: no Metadata naming the topic passes through this Sluice
        _, topic_id, _ = metadata(kafka.bootstrap, topic)
        # a Metadata for no topic through Sluice: its broker address (and nothing about the topic)
        with RawKafkaSocket(sluice.bootstrap) as raw:
            raw.send(metadata_request([]))
            _, body = raw.recv(3, 12)
        assert not body.topics
        (broker,) = body.brokers
        address = f"{broker.host}:{broker.port}"

        throttled: list[int] = []

        def charged_to_the_topic() -> bool:
            _, fetched = fetch_v16(address, topic_id, [0])
            if fetched.throttle_time.total_seconds() > 0:  # answered empty: held by a quota
                throttled.append(int(fetched.throttle_time.total_seconds() * 1000))
            return metrics.value("sluice_quota_topic_limit", topic=topic) == 10_000 and \
                (metrics.value("sluice_quota_topic_rate", topic=topic) or 0) > 0

        # the first fetch counts against the id's hex form (no topic quota matches it) while Sluice
        # asks the broker; from the answer on, fetches are charged to the topic's quota
        wait_until(charged_to_the_topic, 20, "a fetch by id charged to the topic's quota")
        # and held by it: 50 kB fetched at 10 kB/s; no client quota is configured
        wait_until(lambda: charged_to_the_topic() and bool(throttled), 20,
                   "a fetch throttled by the topic quota")
        assert sluice.wait_for_log(f"topic ids: named 1 by the broker ({topic})")
    finally:
        sluice.stop()


def _fill(bootstrap: str, topic: str, records: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for _ in range(records):
        producer.produce(topic, b"x" * 1000)
    assert producer.flush(30) == 0
