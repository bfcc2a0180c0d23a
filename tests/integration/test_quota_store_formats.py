"""Every quota store round-trips every entity type and quota key Sluice knows, and a record it
cannot read is an error naming it (issues 26 and 28). The Kafka store against a real broker;
SQLite and memory beside it, so the three are held to one standard.

What a round trip is: the YAML seed (`reconcile_seed`), changes as AlterClientQuotas writes them
(`apply`), a restart (the store opened again) and another instance reading it (a second store on
the same medium while the first is open).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from proxy.admin.store import (
    KafkaStore,
    MemoryStore,
    QuotaStore,
    SqliteStore,
    StoreError,
    encode_entity,
    encode_record_key,
    reconcile_seed,
)
from quotas import DEFAULT, QuotaEntity
from quotas.entity import ENTITY_TYPES, QuotaKind
from quotas.table import (
    BPS_KEYS,
    BROKER_BPS_KEYS,
    BURST_MS_KEY,
    EACH_CLIENT_ID_KEY,
    KNOWN_KEYS,
    SHADOW_KEY,
    SHARES_KEY,
    TOKEN_BUCKET_KEY,
    QuotaChange,
    QuotaTable,
)
from tests.conftest import create_topic, unique_name
from tests.harness.kafka import KafkaCluster
from tests.harness.wait import eventually

pytestmark = pytest.mark.integration

#: Every entity shape Sluice holds: Kafka's three (with defaults) and Sluice's four.
ENTITIES = [
    QuotaEntity(user="rt-alice"), QuotaEntity(user=DEFAULT), QuotaEntity(client_id="rt-app"),
    QuotaEntity(client_id=DEFAULT), QuotaEntity(user="rt-alice", client_id="rt-app"),
    QuotaEntity(user=DEFAULT, client_id=DEFAULT), QuotaEntity(client_id_prefix="rt-etl-"),
    QuotaEntity(user="rt-alice", client_id_prefix="rt-etl-"), QuotaEntity(topic="rt-topic"),
    QuotaEntity(topic_prefix="rt-logs-"),
]

#: A valid value of every quota key Sluice knows.
VALUES = {QuotaKind.PRODUCE.value: 1_048_576.0, QuotaKind.FETCH.value: 2_097_152.0,
          QuotaKind.REQUEST_PERCENTAGE.value: 250.0, QuotaKind.REQUEST_RATE.value: 500.0,
          QuotaKind.PRODUCER_RECORD_RATE.value: 1000.0, QuotaKind.CONSUMER_RECORD_RATE.value: 2000.0,
          SHADOW_KEY: 1.0, TOKEN_BUCKET_KEY: 1.0, BURST_MS_KEY: 800.0, EACH_CLIENT_ID_KEY: 1.0,
          # the quota-native draft's units: bps (one budget across every broker), broker_bps
          **{key: 4_194_304.0 for key in BPS_KEYS}, **{key: 3_145_728.0 for key in BROKER_BPS_KEYS},
          SHARES_KEY: 3.0}  # and its shares of contested bandwidth


def keys_for(entity: QuotaEntity) -> dict[str, float]:
    values = dict(VALUES)
    if entity.client_id_prefix is None:
        values.pop(EACH_CLIENT_ID_KEY)  # a setting of prefix entities only
    if entity.is_topic:
        values.pop(QuotaKind.REQUEST_PERCENTAGE.value)  # not attributable to a topic
        for key in (*BPS_KEYS, *BROKER_BPS_KEYS):      # a topic's budgets are the topic's own
            values.pop(key)
    if (entity.is_topic or entity.client_id_prefix is not None or entity.user is DEFAULT
            or entity.client_id is DEFAULT):
        values.pop(SHARES_KEY)                          # a fair share's callers are named
    return values


def test_the_shapes_cover_every_entity_type_and_key() -> None:
    """A new entity type or key must be added here, or the round trips below do not cover it."""
    assert {t for e in ENTITIES for t, _n in e.to_kafka()} == set(ENTITY_TYPES)
    assert set(VALUES) == set(KNOWN_KEYS)


def full_table() -> QuotaTable:
    return QuotaTable((e, keys_for(e)) for e in ENTITIES)


Opener = Callable[[], QuotaStore]


@pytest.fixture(params=["kafka", "sqlite", "memory"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Opener]]:
    opened: list[QuotaStore] = []
    if request.param == "kafka":
        kafka: KafkaCluster = request.getfixturevalue("kafka")
        topic = unique_name("sluice-quotas-rt")

        def make() -> QuotaStore:
            return KafkaStore(kafka.bootstrap, topic, instance=unique_name("rt"))
    elif request.param == "sqlite":
        def make() -> QuotaStore:
            return SqliteStore(tmp_path / "q.db")
    else:
        memory = MemoryStore()

        def make() -> QuotaStore:
            return memory  # one process's memory: what "another instance" means for it

    def tracked() -> QuotaStore:
        store = make()
        opened.append(store)
        return store

    yield request.param, tracked
    for store in opened:
        store.close()


def test_every_store_round_trips_every_entity_type_and_key(opener: tuple[str, Opener]) -> None:
    kind, open_store = opener
    seed = full_table()
    first = open_store()
    assert reconcile_seed(first, seed, "rt-1").table == seed                 # the YAML seed
    changes = [QuotaChange(e, QuotaKind.REQUEST_RATE.value, 700.0) for e in ENTITIES]
    changes += [QuotaChange(QuotaEntity(client_id="rt-app"), QuotaKind.PRODUCE.value, None)]
    want = seed.apply(changes)
    assert first.apply(changes) == want                                     # AlterClientQuotas
    other = open_store()                                                    # another instance
    assert eventually(other.load, lambda t: t == want, timeout_s=10) == want
    if kind != "memory":                                                    # a restart
        first.close()
        assert open_store().load() == want


# ------------------------------------------------------------------------ the Kafka store's records

def produce(bootstrap: str, topic: str, records: list[tuple[str, bytes | None]]) -> None:
    """Records written as another program (or an older Sluice) would, creating the topic first."""
    if topic not in Producer({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics:
        create_topic(bootstrap, topic, config={"cleanup.policy": "compact"})
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for key, value in records:
        producer.produce(topic, key=key.encode(), value=value)
    assert producer.flush(10) == 0


def test_one_record_per_entity_and_key(kafka: KafkaCluster) -> None:
    """The record layout that lets concurrent writers of different keys both stand."""
    from confluent_kafka import Consumer, TopicPartition

    topic = unique_name("sluice-quotas-layout")
    store = KafkaStore(kafka.bootstrap, topic, instance="layout")
    app = QuotaEntity(client_id="app")
    try:
        store.apply([QuotaChange(app, "producer_byte_rate", 1024.0), QuotaChange(app, "request_rate", 5.0)])
        store.apply([QuotaChange(app, "request_rate", None)])
    finally:
        store.close()
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": unique_name("g"),
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen: list[tuple[str, bytes | None]] = []
    while (msg := consumer.poll(10)) is not None and msg.error() is None:
        seen.append((msg.key().decode(), msg.value()))
    consumer.close()
    assert seen == [(encode_record_key(app, "producer_byte_rate"), b"1024.0"),
                    (encode_record_key(app, "request_rate"), b"5.0"),
                    (encode_record_key(app, "request_rate"), None)]


def test_the_old_format_is_read_and_rewritten_per_key(kafka: KafkaCluster) -> None:
    """A topic written by the store before one record per key: its entity records are read (all of
    an entity's keys in one record, a tombstone removing them) and rewritten as one record per key."""
    topic = unique_name("sluice-quotas-old")
    alice, app = QuotaEntity(user="alice"), QuotaEntity(client_id="app")
    produce(kafka.bootstrap, topic, [
        (encode_entity(alice), json.dumps({"producer_byte_rate": 1024.0, "request_rate": 5.0}).encode()),
        (encode_entity(app), json.dumps({"consumer_byte_rate": 2048.0}).encode()),
        (encode_entity(app), None),
        (encode_entity(alice), json.dumps({"producer_byte_rate": 4096.0}).encode())])
    store = KafkaStore(kafka.bootstrap, topic, instance="old")
    try:
        assert store.load() == {alice: {"producer_byte_rate": 4096.0}}
    finally:
        store.close()
    # the old records are gone (tombstoned); the new one per key holds the value
    again = KafkaStore(kafka.bootstrap, topic, instance="old-2")
    try:
        assert again.load() == {alice: {"producer_byte_rate": 4096.0}}
        assert not again._legacy
    finally:
        again.close()


@pytest.mark.parametrize(("key", "value", "why"), [
    ('{"group":"g1"}', b'{"producer_byte_rate": 1.0}', "unsupported entity type 'group'"),
    ('[{"client-id":"x"},"bogus"]', b"1.0", "Invalid configuration key bogus"),
    ('[{"client-id":"x"},"producer_byte_rate"]', b"-5", "must be greater than 0"),
    ('[{"client-id":"x"},"producer_byte_rate"]', b"fast", "is not JSON"),
    ("not json", b"1", "the key is not JSON"),
])
def test_a_record_the_store_cannot_read_refuses_the_start_naming_it(kafka: KafkaCluster, key: str,
                                                                    value: bytes, why: str) -> None:
    topic = unique_name("sluice-quotas-bad")
    produce(kafka.bootstrap, topic, [(encode_record_key(QuotaEntity(user="ok"), "request_rate"), b"5.0"),
                                     (key, value)])
    with pytest.raises(StoreError) as raised:
        KafkaStore(kafka.bootstrap, topic, instance="bad")
    assert f"record {key}" in str(raised.value) and why in str(raised.value)


def test_a_record_it_cannot_read_later_is_listed_until_replaced(kafka: KafkaCluster) -> None:
    topic = unique_name("sluice-quotas-later")
    store = KafkaStore(kafka.bootstrap, topic, instance="later")
    bad = '[{"topic":"t"},"bogus_rate"]'
    try:
        produce(kafka.bootstrap, topic, [(bad, b"1.0")])
        listed = eventually(store.unreadable, lambda u: bad in u, timeout_s=10)
        assert "Invalid configuration key bogus_rate" in listed[bad]
        produce(kafka.bootstrap, topic, [(bad, None)])  # an operator deletes it
        assert eventually(store.unreadable, lambda u: not u, timeout_s=10) == {}
    finally:
        store.close()


def test_a_batch_is_all_or_nothing_for_every_reader(kafka: KafkaCluster) -> None:
    """A batch is one transaction: a reader never sees part of it (read_committed), and an aborted
    one is never seen at all."""
    topic = unique_name("sluice-quotas-txn")
    writer = KafkaStore(kafka.bootstrap, topic, instance="txn-w")
    reader = KafkaStore(kafka.bootstrap, topic, instance="txn-r")
    seen: list[QuotaTable] = []
    reader.subscribe(seen.append)
    try:
        batch = [QuotaChange(QuotaEntity(client_id=f"txn-{i}"), "request_rate", float(i + 1))
                 for i in range(50)]
        want = QuotaTable().apply(batch)
        writer.apply(batch)
        assert eventually(reader.load, lambda t: t == want, timeout_s=10) == want
        # the reader notifies on its own thread after its table is updated: wait for the notice
        notified = eventually(lambda: list(seen), lambda got: len(got) > 0, timeout_s=10)
        assert [len(t) for t in notified] == [50]  # one notification, with the whole batch
    finally:
        writer.close()
        reader.close()


def test_an_aborted_batch_is_never_seen_and_does_not_hold_a_reader_back(kafka: KafkaCluster) -> None:
    """Another writer's aborted transaction: a store opened afterwards reads past it to the end and
    applies none of it; a committed record after it applies."""
    topic = unique_name("sluice-quotas-abort")
    KafkaStore(kafka.bootstrap, topic, instance="abort-create").close()  # the topic, as Sluice makes it
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": unique_name("abort")})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, key=encode_record_key(QuotaEntity(user="aborted"), "request_rate").encode(),
                     value=b"5.0")
    producer.flush(10)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, key=encode_record_key(QuotaEntity(user="committed"), "request_rate").encode(),
                     value=b"6.0")
    producer.commit_transaction(30)
    store = KafkaStore(kafka.bootstrap, topic, instance="abort-read", load_timeout_s=20)
    try:
        assert store.load() == {QuotaEntity(user="committed"): {"request_rate": 6.0}}
    finally:
        store.close()


def test_a_committed_batch_not_read_back_in_time_is_not_a_failure(kafka: KafkaCluster,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """`apply` waits write_timeout_ms for its batch to be read back; a batch that is committed but
    not read back by then (here: this instance's reader is stopped) is answered as written, with
    the table it will make, and logged, never raised as an error: it is in the log and will apply."""
    topic = unique_name("sluice-quotas-slow")
    store = KafkaStore(kafka.bootstrap, topic, instance="slow", write_timeout_ms=3000)
    other = KafkaStore(kafka.bootstrap, topic, instance="slow-other")
    change = QuotaChange(QuotaEntity(user="late"), "request_rate", 9.0)
    try:
        store._closed.set()   # the reader stops: nothing this instance writes is read back
        store._thread.join(10)
        assert store.apply([change]) == {QuotaEntity(user="late"): {"request_rate": 9.0}}
        assert "not read back yet" in caplog.text
        assert eventually(other.load, lambda t: bool(t), timeout_s=10) == {
            QuotaEntity(user="late"): {"request_rate": 9.0}}
    finally:
        store.close()
        other.close()
