"""The harness itself, proved before any proxy exists: every real client produces to and consumes
from the real broker directly, and the three-node and SASL set-ups really work."""

from __future__ import annotations

import pytest

from tests.conftest import create_topic, metadata_with_leaders, unique_name
from tests.harness import clients
from tests.harness.kafka import KafkaCluster, kafka_version
from tests.harness.tools import KafkaTools

pytestmark = pytest.mark.integration

N = 200


def test_confluent_kafka_round_trip(kafka: KafkaCluster, topic: str) -> None:
    sent = clients.values(N, "ck")
    clients.confluent_produce(kafka.bootstrap, topic, sent)
    assert clients.confluent_consume(kafka.bootstrap, topic, N) == sent


def test_kafka_python_round_trip(kafka: KafkaCluster, topic: str) -> None:
    sent = clients.values(N, "kp")
    clients.kafka_python_produce(kafka.bootstrap, topic, sent)
    assert clients.kafka_python_consume(kafka.bootstrap, topic, N) == sent


async def test_aiokafka_round_trip(kafka: KafkaCluster, topic: str) -> None:
    sent = clients.values(N, "aio")
    await clients.aiokafka_produce(kafka.bootstrap, topic, sent)
    assert await clients.aiokafka_consume(kafka.bootstrap, topic, N) == sent


def test_kcat_round_trip(kafka: KafkaCluster, topic: str) -> None:
    sent = clients.values(N, "kcat")
    clients.kcat_produce(kafka.bootstrap, topic, sent)
    assert clients.kcat_consume(kafka.bootstrap, topic, N) == sent


def test_java_perf_tools_round_trip(kafka_tools: KafkaTools, topic: str) -> None:
    produced = kafka_tools.producer_perf(topic, 5000, 100, props={"client.id": "perf-harness"})
    assert produced.records == 5000
    consumed = kafka_tools.consumer_perf(topic, 5000, group=unique_name("perf-g"))
    assert consumed.records == 5000


def test_kafka_configs_sets_and_describes_a_broker_quota(kafka_tools: KafkaTools) -> None:
    user = unique_name("quota-user")
    kafka_tools.configs("--alter", "--add-config", "producer_byte_rate=1048576",
                        "--entity-type", "users", "--entity-name", user).check()
    out = kafka_tools.configs("--describe", "--entity-type", "users", "--entity-name", user).check()
    assert f"user-principal '{user}'" in out.stdout
    assert "producer_byte_rate=1048576.0" in out.stdout


def test_log_dirs_tool_reports_the_topic(kafka_tools: KafkaTools, kafka: KafkaCluster, topic: str) -> None:
    clients.confluent_produce(kafka.bootstrap, topic, clients.values(10))
    report = kafka_tools.log_dirs([topic])
    brokers = report["brokers"]
    assert isinstance(brokers, list)
    partitions = [p for b in brokers for d in b["logDirs"] for p in d["partitions"]]
    assert [p["partition"] for p in partitions] == [f"{topic}-0"]
    assert partitions[0]["size"] > 0


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_listener_authenticates_users(kafka: KafkaCluster, topic: str, mechanism: str) -> None:
    sasl = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
            "sasl.username": "alice", "sasl.password": "alice-secret"}
    sent = clients.values(20, mechanism)
    clients.confluent_produce(kafka.sasl_bootstrap, topic, sent, sasl)
    assert clients.confluent_consume(kafka.sasl_bootstrap, topic, 20, config=sasl) == sent


def test_sasl_listener_rejects_a_wrong_password(kafka: KafkaCluster) -> None:
    done = clients.kcat(kafka.sasl_bootstrap, "-L", timeout_s=30, config={
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "alice", "sasl.password": "wrong", "metadata.request.timeout.ms": "5000"})
    assert done.returncode != 0
    assert b"Authentication failed" in done.stderr


def test_three_node_cluster_spreads_leaders(kafka_cluster3: KafkaCluster) -> None:
    name = create_topic(kafka_cluster3.bootstrap, unique_name("spread"), partitions=6, replication=3)
    md = metadata_with_leaders(kafka_cluster3.bootstrap, name, 6)
    assert sorted(md.brokers) == [1, 2, 3]
    leaders = {p.leader for p in md.topics[name].partitions.values()}
    assert leaders == {1, 2, 3}
    sent = clients.values(300, "c3")
    clients.confluent_produce(kafka_cluster3.bootstrap, name, sent, {"acks": "all"})
    assert sorted(clients.confluent_consume(kafka_cluster3.bootstrap, name, 300)) == sorted(sent)


def test_pinned_version_is_the_one_running(kafka: KafkaCluster) -> None:
    assert f"Kafka version: {kafka_version()}" in kafka.nodes[0].log_text()
