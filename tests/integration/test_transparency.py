"""Every real client works through Sluice unchanged and never learns a broker's real address.

The compatibility matrix: confluent-kafka (librdkafka), kcat, kafka-python, aiokafka and Kafka's
Java tools, each creating topics, producing, consuming, in consumer groups, with idempotent and
transactional producers and committed offsets, all through a real `sluice proxy` process in front
of a real Kafka 4.x broker.
"""

from __future__ import annotations

import re
import threading
import time

import pytest

from protocol import fastpath
from tests.conftest import create_topic, unique_name
from tests.harness import clients
from tests.harness.kafka import KafkaCluster
from tests.harness.rawclient import RawKafkaSocket
from tests.harness.sluice import SluiceProcess
from tests.harness.tools import KafkaTools

pytestmark = pytest.mark.integration

N = 500


def broker_ports(kafka: KafkaCluster) -> set[int]:
    return {n.port for n in kafka.nodes} | {n.sasl_port for n in kafka.nodes if n.sasl_port}


# ----------------------------------------------------------------------------- addresses

def test_metadata_only_names_sluice(kafka: KafkaCluster, sluice: SluiceProcess) -> None:
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": sluice.bootstrap}).list_topics(timeout=10)
    advertised = {(b.host, b.port) for b in md.brokers.values()}
    assert [b.id for b in md.brokers.values()] == [1]
    (host, port), = advertised
    assert host == "127.0.0.1"
    assert port not in broker_ports(kafka)
    assert port != int(sluice.bootstrap.rsplit(":", 1)[1])


def test_kcat_metadata_listing_shows_no_broker_port(kafka: KafkaCluster, sluice: SluiceProcess,
                                                    topic: str) -> None:
    done = clients.kcat(sluice.bootstrap, "-L", "-t", topic)
    assert done.returncode == 0, done.stderr
    listing = done.stdout.decode()
    ports = {int(p) for p in re.findall(r"at 127\.0\.0\.1:(\d+)", listing)}
    assert ports and not ports & broker_ports(kafka), listing
    assert f'topic "{topic}" with 1 partitions' in listing


def test_find_coordinator_is_rewritten(kafka: KafkaCluster, sluice: SluiceProcess, topic: str) -> None:
    # a consumer group needs FindCoordinator; kafka-python would fail to reach a raw broker port
    # only if it were handed one, so check the coordinator it was given
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=sluice.bootstrap, group_id=unique_name("fc"),
                             auto_offset_reset="earliest", consumer_timeout_ms=3000)
    try:
        consumer.poll(timeout_ms=3000)
        coordinator_id = consumer._coordinator.coordinator_id
        assert coordinator_id is not None
        node = consumer._client.cluster.broker_metadata(coordinator_id)
        assert node.port not in broker_ports(kafka)
    finally:
        consumer.close()


# ----------------------------------------------------------------------------- confluent-kafka

def test_confluent_topic_create_produce_consume(sluice: SluiceProcess) -> None:
    name = create_topic(sluice.bootstrap, unique_name("ck"), partitions=3)
    sent = clients.values(N, "ck")
    clients.confluent_produce(sluice.bootstrap, name, sent)
    got = clients.confluent_consume(sluice.bootstrap, name, N)
    assert sorted(got) == sorted(sent) and len(got) == N


def test_confluent_idempotent_producer(sluice: SluiceProcess, topic: str) -> None:
    sent = clients.values(N, "idem")
    clients.confluent_produce(sluice.bootstrap, topic, sent, {"enable.idempotence": True, "acks": "all"})
    assert clients.confluent_consume(sluice.bootstrap, topic, N) == sent


def test_confluent_transactional_producer(sluice: SluiceProcess, topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": sluice.bootstrap, "transactional.id": unique_name("tx")})
    producer.init_transactions(30)
    producer.begin_transaction()
    for v in clients.values(50, "aborted"):
        producer.produce(topic, v)
    producer.abort_transaction(30)
    producer.begin_transaction()
    committed = clients.values(50, "committed")
    for v in committed:
        producer.produce(topic, v)
    producer.commit_transaction(30)
    got = clients.confluent_consume(sluice.bootstrap, topic, 50,
                                    config={"isolation.level": "read_committed"}, timeout_s=20)
    assert got == committed


def test_confluent_committed_offsets_read_back(sluice: SluiceProcess, topic: str) -> None:
    from confluent_kafka import Consumer, TopicPartition

    clients.confluent_produce(sluice.bootstrap, topic, clients.values(100))
    group = unique_name("offsets")
    consumer = Consumer({"bootstrap.servers": sluice.bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    seen = 0
    deadline = time.monotonic() + 30
    while seen < 40 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            seen += 1
    consumer.commit(offsets=[TopicPartition(topic, 0, 40)], asynchronous=False)
    consumer.close()
    reader = Consumer({"bootstrap.servers": sluice.bootstrap, "group.id": group})
    (tp,) = reader.committed([TopicPartition(topic, 0)], timeout=10)
    reader.close()
    assert tp.offset == 40


def test_confluent_consumer_group_rebalance_consumes_everything_once(sluice: SluiceProcess) -> None:
    from confluent_kafka import Consumer

    name = create_topic(sluice.bootstrap, unique_name("rebal"), partitions=4)
    sent = clients.values(2000, "rb")
    group = unique_name("rebal-g")
    got: list[bytes] = []
    lock = threading.Lock()
    stop = threading.Event()
    assigned: list[int] = []

    def run_consumer(tag: int) -> None:
        consumer = Consumer({"bootstrap.servers": sluice.bootstrap, "group.id": group,
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
        consumer.subscribe([name], on_assign=lambda c, ps: assigned.append(tag))
        try:
            while not stop.is_set():
                msg = consumer.poll(0.2)
                if msg is None or msg.error() is not None:
                    continue
                with lock:
                    got.append(msg.value())
                consumer.commit(message=msg, asynchronous=False)
        finally:
            consumer.close()

    first = threading.Thread(target=run_consumer, args=(1,))
    first.start()
    clients.confluent_produce(sluice.bootstrap, name, sent[:1000])
    deadline = time.monotonic() + 30
    while len(got) < 500 and time.monotonic() < deadline:
        time.sleep(0.1)
    second = threading.Thread(target=run_consumer, args=(2,))  # joining forces a rebalance
    second.start()
    clients.confluent_produce(sluice.bootstrap, name, sent[1000:])
    deadline = time.monotonic() + 60
    while len(got) < len(sent) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # any duplicate would show up now
    stop.set()
    first.join(20)
    second.join(20)
    assert 2 in assigned, "the second consumer never got partitions"
    assert sorted(got) == sorted(sent)


# ----------------------------------------------------------------------------- other clients

def test_kcat_produce_consume(sluice: SluiceProcess, topic: str) -> None:
    sent = clients.values(N, "kcat")
    clients.kcat_produce(sluice.bootstrap, topic, sent)
    assert clients.kcat_consume(sluice.bootstrap, topic, N) == sent
    # ...through the data plane this run selects: the compiled one, or the pure one under SLUICE_PURE_PYTHON=1
    assert f"data plane: {fastpath.describe()}" in sluice.log()


def test_kafka_python_produce_consume_in_a_group(sluice: SluiceProcess, topic: str) -> None:
    sent = clients.values(N, "kp")
    clients.kafka_python_produce(sluice.bootstrap, topic, sent, acks="all")
    group = unique_name("kp-g")
    assert clients.kafka_python_consume(sluice.bootstrap, topic, N, group=group) == sent


async def test_aiokafka_produce_consume_commit(sluice: SluiceProcess, topic: str) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    sent = clients.values(N, "aio")
    await clients.aiokafka_produce(sluice.bootstrap, topic, sent, enable_idempotence=True)
    group = unique_name("aio-g")
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=sluice.bootstrap, group_id=group,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + 30
        while len(got) < N and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                got.extend(r.value for r in records if r.value is not None)
        await consumer.commit()
        committed = await consumer.committed(TopicPartition(topic, 0))
    finally:
        await consumer.stop()
    assert got == sent
    assert committed == N


def test_java_tools_through_sluice(sluice: SluiceProcess, tmp_path_factory: pytest.TempPathFactory) -> None:
    tools = KafkaTools(sluice.bootstrap, workdir=tmp_path_factory.mktemp("java"))
    name = unique_name("java")
    tools.topics("--create", "--topic", name, "--partitions", "2", "--replication-factor", "1").check()
    listed = tools.topics("--describe", "--topic", name).check().stdout
    assert "PartitionCount: 2" in listed
    produced = tools.producer_perf(name, 20000, 200, props={"client.id": "java-perf"})
    assert produced.records == 20000
    consumed = tools.consumer_perf(name, 20000, group=unique_name("java-g"))
    assert consumed.records == 20000


def test_kafka_configs_for_topics_passes_through_to_the_broker(
        sluice: SluiceProcess, kafka_tools: KafkaTools, topic: str,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    # DescribeConfigs/IncrementalAlterConfigs are the broker's business: Sluice forwards them
    # (client quotas, by contrast, Sluice answers itself: see test_quota_admin.py)
    tools = KafkaTools(sluice.bootstrap, workdir=tmp_path_factory.mktemp("cfg"))
    tools.configs("--alter", "--add-config", "retention.ms=3600000", "--entity-type", "topics",
                  "--entity-name", topic).check()
    direct = kafka_tools.configs("--describe", "--entity-type", "topics", "--entity-name", topic).check()
    assert "retention.ms=3600000" in direct.stdout


def test_api_versions_are_capped_for_what_sluice_rewrites(sluice: SluiceProcess) -> None:
    from kio.schema.api_versions.v3.request import ApiVersionsRequest

    from protocol.apis import ApiKey
    from protocol.rewrite import PARSEABLE_MAX_VERSIONS

    with RawKafkaSocket(sluice.bootstrap) as raw:
        raw.send(ApiVersionsRequest(client_software_name="sluice-test", client_software_version="1"))
        _, body = raw.recv(ApiKey.API_VERSIONS, 3)
    versions = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
    assert versions[ApiKey.FETCH][1] == 18              # v16+ endpoints are rewritten (issue 15)
    assert versions[ApiKey.PRODUCE][1] <= PARSEABLE_MAX_VERSIONS[ApiKey.PRODUCE]
    assert versions[ApiKey.SHARE_FETCH] == (1, 2) and versions[ApiKey.SHARE_ACKNOWLEDGE] == (1, 2)
    assert versions[ApiKey.METADATA][1] >= 12           # nothing else was lowered needlessly
