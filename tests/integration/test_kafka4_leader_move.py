"""Fetch v16+ through Sluice on three brokers: KIP-951's leader endpoints are Sluice's, never a broker's.

A topic with two partitions on brokers 1 and 2, both led by broker 1; partition 0 moves to brokers
2 and 3 (a consumer may fetch from a follower, so broker 1 must stop being a replica for it to
answer NOT_LEADER_OR_FOLLOWER). Then:

* a raw Fetch v16 to Sluice's listener for broker 1, for both partitions, is answered
  NOT_LEADER_OR_FOLLOWER for partition 0 with broker 2's endpoint, and that endpoint is Sluice's
  listener for broker 2: both when the response is small (rewritten whole) and when partition 1's
  records make it large enough to stream (its tag section rewritten in place, at the same length);
* Kafka's Java consumer (Fetch v18 through Sluice), consuming across the move, gets every record
  produced before and after it, and its debug log, which records every address it connects to or
  learns from metadata, never names a broker's real port.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import unique_name
from tests.harness import clients
from tests.harness.kafka import KafkaCluster, _die_with_parent, java_command
from tests.harness.lines import read_lines
from tests.harness.rawclient import RawKafkaSocket, metadata_request
from tests.harness.sluice import SluiceProcess
from tests.harness.tools import KafkaTools
from tests.harness.wait import poll, wait_until
from tests.integration.test_kafka4_clients import api_versions

pytestmark = pytest.mark.integration

STREAMED_RECORDS = 200                  # x 1 KiB in partition 1: a response above the 64 KiB streaming bound


def create_led_by_broker_1(bootstrap: str, name: str) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(name, num_partitions=2, replica_assignment=[[1, 2], [1, 2]])
    futures = admin.create_topics([new], operation_timeout=30)
    futures[name].result(timeout=60)
    return name


def move_partition_0_to_brokers_2_and_3(cluster: KafkaCluster, topic: str, workdir: Path) -> None:
    tools = KafkaTools(cluster.bootstrap, workdir=workdir)
    plan = workdir / "order.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": topic, "partition": 0, "replicas": [2, 3], "log_dirs": ["any", "any"]}]}))
    reassign = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"
    tools.run(reassign, "--bootstrap-server", cluster.bootstrap, "--reassignment-json-file", str(plan),
              "--execute").check()
    wait_until(lambda: "is completed" in tools.run(reassign, "--bootstrap-server", cluster.bootstrap,
                                                   "--reassignment-json-file", str(plan), "--verify").stdout,
               60, "the reassignment to complete", interval_s=1.0)


def metadata(address: str, topic: str) -> tuple[dict[int, tuple[str, int]], uuid.UUID, dict[int, int]]:
    """(brokers by id, the topic's id, leader by partition) as `address` answers."""
    with RawKafkaSocket(address) as raw:
        raw.send(metadata_request([topic]))
        _, body = raw.recv(3, 12)
    brokers = {int(b.node_id): (b.host, int(b.port)) for b in body.brokers}
    (t,) = body.topics
    return brokers, t.topic_id, {int(p.partition_index): int(p.leader_id) for p in t.partitions}


def fetch_v16(address: str, topic_id: uuid.UUID, partitions: list[int]) -> Any:
    from kio.schema.fetch.v16 import request as r

    request = r.FetchRequest(
        cluster_id=None, max_wait=dt.timedelta(milliseconds=100), min_bytes=1, max_bytes=4 << 20,
        isolation_level=0, session_id=0, session_epoch=-1,
        topics=(r.FetchTopic(topic_id=topic_id, partitions=tuple(
            r.FetchPartition(partition=p, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                             log_start_offset=-1, partition_max_bytes=1 << 20) for p in partitions)),),
        forgotten_topics_data=(), rack_id="")
    with RawKafkaSocket(address) as raw:
        raw.send(request, client_id="leader-move-raw")
        frame = raw.recv_frame()
    from protocol.encode import decode_response_body

    return len(frame), decode_response_body(frame, 1, 16)


def wait_for_leader(address: str, topic: str, partition: int, leader: int) -> None:
    wait_until(lambda: metadata(address, topic)[2][partition] == leader, 60,
               f"partition {partition} to move to broker {leader}", interval_s=0.5)


class JavaConsumer:
    """Kafka's console consumer with its client debug log in a file."""

    def __init__(self, bootstrap: str, topic: str, workdir: Path) -> None:
        self.log_path = workdir / "consumer-debug.log"
        config = workdir / "log4j2-debug.properties"
        config.write_text("\n".join([
            "appender.f.type = File", "appender.f.name = F", f"appender.f.fileName = {self.log_path}",
            "appender.f.layout.type = PatternLayout", "appender.f.layout.pattern = %p %m (%c)%n",
            "rootLogger.level = INFO", "rootLogger.appenderRef.f.ref = F",
            "logger.c.name = org.apache.kafka.clients", "logger.c.level = DEBUG", ""]))
        cmd = java_command("org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", bootstrap,
                           "--topic", topic, "--from-beginning", "--group", unique_name("move"),
                           jvm_options=[f"-Dlog4j2.configurationFile={config}"])
        self.values: list[str] = []
        self.process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                        preexec_fn=_die_with_parent)
        assert self.process.stdout is not None
        read_lines(self.process.stdout, lambda line: self.values.append(line.rstrip("\n")))

    def wait_for(self, values: set[str], timeout_s: float) -> bool:
        return poll(lambda: values <= set(self.values), timeout_s, interval_s=0.3)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def test_consumers_follow_a_leader_move_through_sluice(kafka_cluster3: KafkaCluster, tmp_path: Path) -> None:
    sluice = SluiceProcess(kafka_cluster3.bootstrap, tmp_path / "sluice").start()
    consumer: JavaConsumer | None = None
    try:
        assert api_versions(sluice.bootstrap)[1][1] == 18  # Fetch v16+ advertised
        topic = create_led_by_broker_1(kafka_cluster3.bootstrap, unique_name("move"))
        before = {f"before-{i}" for i in range(50)}
        clients.confluent_produce(kafka_cluster3.bootstrap, topic, sorted(v.encode() for v in before))
        consumer = JavaConsumer(sluice.bootstrap, topic, tmp_path)
        assert consumer.wait_for(before, 90), consumer.values[-5:]

        proxied, topic_id, leaders = metadata(sluice.bootstrap, topic)
        assert leaders == {0: 1, 1: 1}
        move_partition_0_to_brokers_2_and_3(kafka_cluster3, topic, tmp_path)
        wait_for_leader(kafka_cluster3.nodes[0].bootstrap, topic, 0, 2)
        # partition 1 (still on broker 1) gets enough records to make the next response stream
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": kafka_cluster3.bootstrap})
        for i in range(STREAMED_RECORDS):
            producer.produce(topic, b"p1-%05d-" % i + b"z" * 1024, partition=1)
        assert producer.flush(30) == 0

        real_ports = {node.port for node in kafka_cluster3.nodes}
        old_leader = f"{proxied[1][0]}:{proxied[1][1]}"  # Sluice's listener for broker 1
        for partitions in ([0], [0, 1]):  # small (rewritten whole), then large (streamed)
            size, body = fetch_v16(old_leader, topic_id, partitions)
            errors = {int(p.partition_index): int(p.error_code) for p in body.responses[0].partitions}
            assert errors[0] == 6, errors  # NOT_LEADER_OR_FOLLOWER
            assert [(int(e.node_id), e.host, int(e.port)) for e in body.node_endpoints] == [
                (2, proxied[2][0], proxied[2][1])], (partitions, body.node_endpoints)
            assert proxied[2][1] not in real_ports
            if partitions == [0, 1]:
                assert size > 64 * 1024, size  # this one streamed through Sluice

        after = {f"after-{i}" for i in range(50)}
        clients.confluent_produce(kafka_cluster3.bootstrap, topic, sorted(v.encode() for v in after))
        assert consumer.wait_for(after, 90), consumer.values[-5:]
    finally:
        if consumer is not None:
            consumer.stop()
        sluice.stop()
    log = consumer.log_path.read_text()
    assert "Initiating connection to node" in log  # the debug log is the client's own
    leaked = [line for line in log.splitlines() if any(f":{port}" in line for port in real_ports)]
    assert not leaked, leaked[:3]
