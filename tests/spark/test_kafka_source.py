"""Access logs read from a Kafka topic through Spark's Kafka source, against a real broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from contracts.access_log import dumps_record, example_record
from spark_analytics.jobs import recommend
from spark_analytics.schema import read_access_logs_from_kafka
from tests.harness.kafka import KafkaCluster
from tests.spark.logs import T0, produce

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_logs_from_a_topic(spark: SparkSession, kafka: KafkaCluster, topic: str, tmp_path: Path) -> None:
    from confluent_kafka import Producer

    records = [produce(T0 + s * 1000, 1000 * (s + 1), principal="dana", client_id="d1") for s in range(3)]
    records.append(example_record(ts_ms=T0 + 500, shadow=True, would_throttle_ms=9, error_codes=[87]))
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for r in records:
        producer.produce(topic, value=dumps_record(r).encode())
    producer.produce(topic, value=b"not a record")  # dropped: no ts_ms
    producer.produce(topic, key=b"tombstone", value=None)  # dropped: no value
    assert producer.flush(30) == 0

    df = read_access_logs_from_kafka(spark, kafka.bootstrap, topic)
    got = sorted((r.asDict(recursive=True) for r in df.collect()), key=lambda r: r["ts_ms"])
    assert got == sorted(records, key=lambda r: r["ts_ms"])  # type: ignore[arg-type, return-value]

    since = read_access_logs_from_kafka(spark, kafka.bootstrap, topic, since_ms=T0 + 1000)
    assert sorted(r["ts_ms"] for r in since.collect()) == [T0 + 1000, T0 + 2000]

    # the recommend job takes the same input from the topic
    assert recommend.main(["--kafka-bootstrap", kafka.bootstrap, "--kafka-topic", topic,
                           "--out", str(tmp_path / "plan"), "--headroom", "1", "--no-plots",
                           "--no-progress"]) == 0
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    dana = [(e["entity"], e["p50"], e["recommended"]) for e in plan["entries"] if e["entity"] == "user=dana"]
    assert dana == [("user=dana", 2000.0, 2900)]  # p95 of 1000, 2000, 3000 = 2900
