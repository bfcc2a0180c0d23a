"""A per-broker port that cannot be bound does not break Metadata (issue 14): Sluice logs it once,
serves the broker on another port, shows it in /metrics, and clients produce through it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.harness.kafka import KafkaCluster, free_port
from tests.harness.metrics import Metrics
from tests.harness.sluice import SluiceProcess

pytestmark = [pytest.mark.integration]


def produce(bootstrap: str, topic: str, count: int) -> int:
    delivered = []
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": "bind-test",
                         "message.timeout.ms": 30_000})
    for i in range(count):
        producer.produce(topic, f"m{i}".encode(),
                         on_delivery=lambda err, _msg: delivered.append(err is None))
    left = producer.flush(40)
    assert left == 0, f"{left} messages not delivered"
    return sum(delivered)


def test_an_unbindable_broker_port_keeps_metadata_working(kafka: KafkaCluster, topic: str,
                                                          tmp_path: Path) -> None:
    node_id = kafka.nodes[0].node_id
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)  # another process holds the broker's deterministic port
    wanted = blocker.getsockname()[1]
    metrics_port = free_port()
    try:
        with SluiceProcess(kafka.bootstrap, tmp_path / "sluice",
                           config={"broker_port_base": wanted - node_id,
                                   "metrics": {"port": metrics_port}}) as sluice:
            assert produce(sluice.bootstrap, topic, 20) == 20
            assert produce(sluice.bootstrap, topic, 5) == 5  # a second client, more Metadata
            metrics = Metrics(metrics_port)
            assert metrics.value("sluice_broker_listener_bind_failed", broker=str(node_id),
                                 wanted_port=str(wanted)) == 1.0
            served = metrics.value("sluice_broker_listener_port", broker=str(node_id))
            assert served is not None and served not in (0.0, float(wanted))
            assert sluice.wait_for_log("cannot listen for broker", 10)
            assert sluice.log().count("cannot listen for broker") == 1, sluice.log()[-3000:]
            assert f"listening on port {int(served)} instead" in sluice.log()
    finally:
        blocker.close()
