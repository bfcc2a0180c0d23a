"""Sluice in front of three brokers: routing to every leader, and a leader change under load."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.conftest import create_topic, metadata_with_leaders, unique_name
from tests.harness import clients
from tests.harness.kafka import KafkaCluster
from tests.harness.sluice import SluiceProcess
from tests.harness.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_leaders_on_every_broker_are_reached_through_sluice(kafka_cluster3: KafkaCluster,
                                                            sluice3: SluiceProcess) -> None:
    name = create_topic(sluice3.bootstrap, unique_name("route"), partitions=6, replication=3)
    md = metadata_with_leaders(sluice3.bootstrap, name, 6)
    assert sorted(md.brokers) == [1, 2, 3]
    real_ports = {n.port for n in kafka_cluster3.nodes}
    assert not {b.port for b in md.brokers.values()} & real_ports
    assert {p.leader for p in md.topics[name].partitions.values()} == {1, 2, 3}
    sent = clients.values(3000, "route")
    clients.confluent_produce(sluice3.bootstrap, name, sent, {"acks": "all"})
    got = clients.confluent_consume(sluice3.bootstrap, name, len(sent))
    assert sorted(got) == sorted(sent)
    for node_id in (1, 2, 3):  # every broker got a listener and served connections
        assert f"listening for broker {node_id}" in sluice3.log()


def test_leader_change_while_clients_run_loses_and_duplicates_nothing(
        kafka_cluster3: KafkaCluster, sluice3: SluiceProcess) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient

    name = create_topic(sluice3.bootstrap, unique_name("failover"), partitions=3, replication=3)
    md = metadata_with_leaders(sluice3.bootstrap, name, 3)
    victim = md.topics[name].partitions[0].leader

    total = 6000
    sent = clients.values(total, "fo")
    errors: list[str] = []
    got: list[bytes] = []
    done_producing = threading.Event()
    known_brokers: set[str] = set()

    def on_stats(raw: str) -> None:  # every broker librdkafka has heard of, by "host:port/id"
        known_brokers.update(json.loads(raw)["brokers"])

    def produce() -> None:
        producer = Producer({"bootstrap.servers": sluice3.bootstrap, "enable.idempotence": True,
                             "acks": "all", "linger.ms": 5, "message.timeout.ms": 120000,
                             "statistics.interval.ms": 500, "stats_cb": on_stats})
        for i, v in enumerate(sent):
            producer.produce(name, v, on_delivery=lambda err, _m: err and errors.append(str(err)))
            if i % 200 == 0:
                producer.poll(0)
                time.sleep(0.02)  # spread the load over the leader change
        assert producer.flush(120) == 0
        done_producing.set()

    def consume() -> None:
        consumer = Consumer({"bootstrap.servers": sluice3.bootstrap, "group.id": unique_name("fo-g"),
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "isolation.level": "read_committed"})
        consumer.subscribe([name])
        deadline = time.monotonic() + 150
        try:
            while time.monotonic() < deadline and (len(got) < total or not done_producing.is_set()):
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    got.append(msg.value())
            end = time.monotonic() + 2  # keep reading: a duplicate would arrive now
            while time.monotonic() < end:
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    got.append(msg.value())
        finally:
            consumer.close()

    producer_thread = threading.Thread(target=produce)
    consumer_thread = threading.Thread(target=consume)
    producer_thread.start()
    consumer_thread.start()
    # records flow end to end before the leader goes away (else the test proves nothing about failover)
    wait_until(lambda: len(got) >= 200, 60, "records consumed before the leader is killed")
    kafka_cluster3.kill_node(victim)            # the leader of partition 0 goes away
    admin = AdminClient({"bootstrap.servers": sluice3.bootstrap})
    new_leader = victim
    deadline = time.monotonic() + 30
    while new_leader in (victim, -1) and time.monotonic() < deadline:
        time.sleep(0.5)
        new_leader = admin.list_topics(name, timeout=10).topics[name].partitions[0].leader
    assert new_leader not in (victim, -1), "no new leader was elected"
    # the clients run on the new leader (records consumed since the election, or all of them) ...
    elected_at = len(got)
    wait_until(lambda: len(got) > elected_at or len(got) >= total, 60, "records consumed after the election")
    kafka_cluster3.restart_node(victim)         # and comes back
    producer_thread.join(180)
    consumer_thread.join(180)

    after = AdminClient({"bootstrap.servers": sluice3.bootstrap}).list_topics(name, timeout=10)
    assert not errors, errors[:5]
    assert len(got) == total, f"consumed {len(got)} of {total}"
    assert sorted(got) == sorted(sent)         # exactly once: nothing lost, nothing twice
    assert sorted(after.brokers) == [1, 2, 3]
    # even while leaders moved (Produce v10+ carries the new leader's endpoint), the producer
    # never heard of a real broker address
    real = {f"127.0.0.1:{n.port}" for n in kafka_cluster3.nodes}
    assert known_brokers and not {b.split("/")[0] for b in known_brokers} & real, known_brokers
