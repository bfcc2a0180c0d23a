"""Access logs from real traffic through Sluice, checked against the schema shared with Spark."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from contracts.access_log import FIELD_NAMES, validate_record
from tests.conftest import create_topic, unique_name
from tests.harness import clients
from tests.harness.kafka import KafkaCluster, free_port
from tests.harness.sluice import SluiceProcess
from tests.harness.wait import eventually

pytestmark = pytest.mark.integration


def read_records(root: Path) -> list[dict[str, Any]]:
    """The records of every file, Parquet (the default) or JSON lines."""
    import pyarrow.parquet as pq

    records = []
    for path in sorted(root.rglob("*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line]
    for path in sorted(root.rglob("*.parquet")):
        records += pq.read_table(path).to_pylist()
    return records


def run_traffic(kafka: KafkaCluster, tmp_path: Path, config: dict[str, Any], produce: int = 300,
                client_id: str = "al-client", value_size: int = 0
                ) -> tuple[list[dict[str, Any]], str, SluiceProcess]:
    logs = tmp_path / "logs"
    sluice = SluiceProcess(kafka.bootstrap, tmp_path / "s",
                           config={"instance": "sluice-test", "access_log": {"dir": str(logs), **config.pop(
                               "access_log", {})}, **config}).start()
    try:
        topic = create_topic(sluice.bootstrap, unique_name("al"), partitions=2)
        sent = [f"al-{i}".encode().ljust(value_size, b".") for i in range(produce)]
        # every record to a random partition (not librdkafka's sticky batches): both partitions get some
        clients.confluent_produce(sluice.bootstrap, topic, sent,
                                  {"client.id": client_id, "sticky.partitioning.linger.ms": 0})
        got = clients.confluent_consume(sluice.bootstrap, topic, produce, config={"client.id": client_id})
        assert sorted(got) == sorted(sent)
    finally:
        assert sluice.stop() == 0  # SIGTERM: the writer flushes and closes its files
    return read_records(logs), topic, sluice


def test_every_record_follows_the_shared_schema(kafka: KafkaCluster, tmp_path: Path) -> None:
    records, _, _ = run_traffic(kafka, tmp_path, {})
    assert records
    for record in records:
        assert list(record) == list(FIELD_NAMES)
        assert validate_record(record) == [], record
    files = list((tmp_path / "logs").rglob("*.parquet"))  # the default format
    assert files
    assert all(re.fullmatch(r"date=\d{4}-\d{2}-\d{2}", f.parent.parent.name) for f in files)
    assert all(re.fullmatch(r"hour=\d{2}", f.parent.name) for f in files)
    assert all(f.name.startswith("sluice-test-") for f in files)


def test_produce_and_fetch_records_carry_partitions_and_counts(kafka: KafkaCluster, tmp_path: Path) -> None:
    records, topic, _ = run_traffic(kafka, tmp_path, {}, produce=300)
    produce = [r for r in records if r["api_name"] == "Produce"]
    fetch = [r for r in records if r["api_name"] == "Fetch"]
    assert produce and fetch
    def produced(requests: list[dict[str, Any]]) -> int:
        return sum(t["records"] for r in requests for t in r["topics"] if t["topic"] == topic)

    fetched = sum(t["records"] or 0 for r in fetch for t in (r["topics"] or []) if t["topic"] == topic)
    # Every request is logged as it crossed the wire: one the broker refused (NOT_LEADER_OR_FOLLOWER
    # while a new topic's leader settles, seen under load) is logged, and the client sends its
    # records again. So the accepted requests carry each record once, the refused ones the rest.
    accepted = produced([r for r in produce if not r["error_codes"]])
    refused = produced([r for r in produce if r["error_codes"]])
    assert accepted <= 300 <= accepted + refused, (accepted, refused)
    assert refused > 0 or accepted == 300
    assert fetched == 300
    assert {t["partition"] for r in produce for t in r["topics"]} == {0, 1}
    for r in produce + fetch:
        assert r["client_id"] == "al-client"
        assert r["principal"] == "ANONYMOUS"
        assert r["broker_id"] == 1
        assert r["upstream_latency_ms"] is not None and r["upstream_latency_ms"] >= 0
    software = {r["client_software_name"] for r in records}
    assert any((s and "librdkafka" in s) or (s and "confluent" in s) for s in software), software


def test_throttled_requests_name_the_quota_that_matched(kafka: KafkaCluster, tmp_path: Path) -> None:
    quotas = {"quotas": {"window": {"samples": 11, "size_ms": 200},
                         "entries": [{"client_id": "slow-one", "producer_byte_rate": 20_000}]}}
    records, _, _ = run_traffic(kafka, tmp_path, quotas, produce=2000, client_id="slow-one", value_size=100)
    produce = [r for r in records if r["api_name"] == "Produce"]
    throttled = [r for r in produce if r["throttle_time_ms"] > 0]
    assert throttled
    assert {r["quota_entity"] for r in produce} == {"client-id=slow-one"}
    assert {r["quota_kind"] for r in produce} == {"producer_byte_rate"}
    assert {r["quota_limit"] for r in produce} == {20_000.0}
    assert not any(r["shadow"] for r in produce)


def test_shadow_decisions_are_logged(kafka: KafkaCluster, tmp_path: Path) -> None:
    quotas = {"quotas": {"window": {"samples": 11, "size_ms": 200}, "shadow": True,
                         "entries": [{"client_id": "<default>", "producer_byte_rate": 5_000}]}}
    records, _, _ = run_traffic(kafka, tmp_path, quotas, produce=2000, client_id="shadowed", value_size=100)
    produce = [r for r in records if r["api_name"] == "Produce"]
    assert all(r["shadow"] and r["throttle_time_ms"] == 0 for r in produce)
    assert any(r["would_throttle_ms"] > 0 for r in produce)


def test_error_codes_are_recorded(kafka: KafkaCluster, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    with SluiceProcess(kafka.bootstrap, tmp_path / "s", config={"access_log": {"dir": str(logs)}}) as sluice:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": sluice.bootstrap})
        bad = admin.create_topics([NewTopic("bad topic name!", 1, 1)])   # INVALID_TOPIC_EXCEPTION (17)
        with pytest.raises(Exception):  # noqa: B017 - KafkaException
            bad["bad topic name!"].result(20)
    records = read_records(logs)
    create = [r for r in records if r["api_name"] == "CreateTopics"]
    assert create and 17 in create[0]["error_codes"]


def test_parquet_and_kafka_topic_outputs(kafka: KafkaCluster, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    sink_topic = create_topic(kafka.bootstrap, unique_name("access-log"))
    logs = tmp_path / "logs"
    config = {"access_log": {"dir": str(logs), "format": "parquet", "kafka_bootstrap": kafka.bootstrap,
                             "kafka_topic": sink_topic}}
    with SluiceProcess(kafka.bootstrap, tmp_path / "s", config=config) as sluice:
        topic = create_topic(sluice.bootstrap, unique_name("pq"))
        clients.confluent_produce(sluice.bootstrap, topic, clients.values(50), {"client.id": "pq"})
    files = list(logs.rglob("*.parquet"))
    assert files
    table = pq.read_table(files[0])
    assert table.column_names == list(FIELD_NAMES)
    rows = table.to_pylist()
    assert any(r["api_name"] == "Produce" and r["client_id"] == "pq" for r in rows)
    from_topic = [json.loads(v) for v in clients.confluent_consume(kafka.bootstrap, sink_topic, len(rows),
                                                                   timeout_s=30)]
    assert len(from_topic) == len(rows)
    assert all(validate_record(r) == [] for r in from_topic)


def test_no_record_is_dropped_under_load(kafka: KafkaCluster, tmp_path: Path) -> None:
    port = free_port()
    logs = tmp_path / "logs"
    with SluiceProcess(kafka.bootstrap, tmp_path / "s",
                       config={"access_log": {"dir": str(logs)}, "metrics": {"port": port}}) as sluice:
        topic = create_topic(sluice.bootstrap, unique_name("load"))
        clients.confluent_produce(sluice.bootstrap, topic, [b"x" * 100] * 50_000,
                                  {"client.id": "load", "linger.ms": 0, "batch.size": 1000})
        import urllib.request

        def scrape() -> str:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()

        def written_s(text: str) -> float:
            found = re.search(r"^sluice_access_log_records_written_total (\S+)", text, re.M)
            return float(found.group(1)) if found else 0.0

        # the writer flushes about once a second: wait for its records rather than for a second
        text = eventually(scrape, lambda t: written_s(t) > 100, 30.0)
    dropped = re.search(r"^sluice_access_log_records_dropped_total (\S+)", text, re.M)
    written = re.search(r"^sluice_access_log_records_written_total (\S+)", text, re.M)
    assert dropped and written
    assert float(dropped.group(1)) == 0
    assert float(written.group(1)) > 100
