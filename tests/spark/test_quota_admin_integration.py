"""The quota admin client and the apply step against a real Kafka broker.

The broker is the session's `kafka` fixture, shared with other tests: every quota here is on a
fresh client-id, and is removed at the end.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_analytics.jobs import apply, recommend
from spark_analytics.jobs.common import read_current_quotas
from spark_analytics.kafka_quota_client import (
    MATCH_EXACT,
    AlterResult,
    KafkaQuotaClient,
    QuotaAdminError,
    QuotaEntry,
    QuotaOp,
    SaslConfig,
)
from tests.conftest import create_topic, unique_name
from tests.harness.kafka import KafkaCluster
from tests.harness.tools import KafkaTools
from tests.harness.wait import eventually
from tests.spark.logs import T0, produce, write_logs

pytestmark = pytest.mark.integration
P, C = "producer_byte_rate", "consumer_byte_rate"


def entries_for(client: KafkaQuotaClient, user: str) -> list[QuotaEntry]:
    return client.describe([("user", MATCH_EXACT, user)])


@pytest.fixture
def user() -> Iterator[str]:
    yield unique_name("tune-user")


def test_describe_alter_validate_and_remove(kafka: KafkaCluster, user: str, tmp_path: Path) -> None:
    entity = f"user={user},client-id=<default>"
    with KafkaQuotaClient(kafka.bootstrap) as client:
        ok = [AlterResult(entity, 0, None)]
        assert client.alter({entity: [QuotaOp(P, 2048)]}, validate_only=True) == ok
        # a marker written after it: once the marker is visible, anything written before it would be
        # too (the controller applies quota changes in order)
        marker = f"user={user}-marker,client-id=<default>"
        assert client.alter({marker: [QuotaOp(P, 1024)]}) == [AlterResult(marker, 0, None)]
        eventually(lambda: entries_for(client, f"{user}-marker"), lambda e: bool(e))
        assert entries_for(client, user) == []  # validate_only wrote nothing

        assert client.alter({entity: [QuotaOp(P, 2048), QuotaOp(C, 4096)]}) == [AlterResult(entity, 0, None)]
        got = eventually(lambda: entries_for(client, user), lambda e: bool(e))
        assert got == [QuotaEntry(entity, {P: 2048.0, C: 4096.0})]

        assert client.alter({entity: [QuotaOp(P, 1.5)]}) == [
            AlterResult(entity, 42, "producer_byte_rate cannot be a fractional value.")]

        # `sluice tune describe` writes the --current-quotas format recommend reads back
        out = tmp_path / "q.json"
        assert apply.describe_main(["--bootstrap-server", kafka.bootstrap, "--out", str(out)]) == 0
        assert {"entity": entity, "values": {P: 2048.0, C: 4096.0}} in json.loads(out.read_text())
        assert QuotaEntry(entity, {P: 2048.0, C: 4096.0}) in read_current_quotas(out)

        assert client.alter({entity: [QuotaOp(P, None), QuotaOp(C, None)]}) == [AlterResult(entity, 0, None)]
        assert eventually(lambda: entries_for(client, user), lambda e: not e) == []


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_admin_principal(kafka: KafkaCluster, mechanism: str) -> None:
    admin = SaslConfig(mechanism, "admin", "admin-secret")
    with KafkaQuotaClient(kafka.sasl_bootstrap, sasl=admin) as client:
        assert isinstance(client.describe(), list)
    with pytest.raises(QuotaAdminError, match="SASL authentication failed"), KafkaQuotaClient(
            kafka.sasl_bootstrap, sasl=SaslConfig(mechanism, "admin", "wrong")):
        pass


def test_unreachable_bootstrap_is_an_error() -> None:
    with pytest.raises(QuotaAdminError, match="cannot connect to any bootstrap server"):
        KafkaQuotaClient("127.0.0.1:1", timeout_s=2).connect()


def _produce_for(bootstrap: str, topic: str, client_id: str, total_bytes: int) -> tuple[float, float]:
    """Send total_bytes in 8 KiB records as one client-id; (seconds taken, max throttle ms seen)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, client_id=client_id, acks=1, linger_ms=0,
                             batch_size=16384, max_request_size=65536)
    try:
        producer.send(topic, b"warm").get(timeout=30)
        t = time.monotonic()
        payload = b"x" * 8192
        futures = [producer.send(topic, payload) for _ in range(total_bytes // len(payload))]
        for f in futures:
            f.get(timeout=120)
        elapsed = time.monotonic() - t
        # kafka-python 3 records every response's throttle_time_ms in "throttle-time-max"
        throttles = [float(v) for group in producer.metrics().values() for k, v in group.items()
                     if k.endswith("throttle-time-max") and v == v]  # v == v drops NaN
        assert throttles, producer.metrics()
        return elapsed, max(throttles)
    finally:
        producer.close(timeout=10)


@pytest.mark.spark
@pytest.mark.slow
def test_recommend_then_apply_changes_the_quota_the_broker_enforces(
        spark: SparkSession, kafka: KafkaCluster, kafka_tools: KafkaTools, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Given: logs of a client (PLAINTEXT, so principal ANONYMOUS) producing 20,000 B/s for 20 s,
    # and a generous quota of 1,000,000 B/s on its (user, client-id) entity in the broker
    client_id = unique_name("tune-e2e")
    entity = f"user=ANONYMOUS,client-id={client_id}"
    write_logs(tmp_path / "logs", [produce(T0 + s * 1000, 20_000, principal="ANONYMOUS", client_id=client_id)
                                   for s in range(20)])
    topic = create_topic(kafka.bootstrap, unique_name("tune-e2e"))
    with KafkaQuotaClient(kafka.bootstrap) as admin:
        assert admin.alter({entity: [QuotaOp(P, 1_000_000)]})[0].ok
    try:
        eventually(lambda: _configs(kafka_tools, client_id), lambda out: "1000000.0" in out)

        # When: recommend against the live quotas, p95 x 1.5 with no step limit -> 30,000 B/s
        assert recommend.main(["--logs", str(tmp_path / "logs"), "--out", str(tmp_path / "plan"),
                               "--bootstrap-server", kafka.bootstrap, "--unmatched", "user-client-id",
                               "--headroom", "1.5", "--no-max-change", "--no-progress", "--no-plots"]) == 0
        plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
        mine = [e for e in plan["entries"] if e["entity"] == entity]
        assert [(e["current"], e["current_source"], e["recommended"], e["action"]) for e in mine] == [
            (1_000_000.0, "set on entity", 30_000, "decrease")]
        capsys.readouterr()

        # Then: a dry run and a validate-only run change nothing
        plan_args = ["--plan", str(tmp_path / "plan" / "plan.json"), "--bootstrap-server", kafka.bootstrap]
        assert apply.main(plan_args) == 0
        out = capsys.readouterr().out
        assert f"{entity}  producer_byte_rate       1,000,000          30,000  decrease -97%" in out
        assert "dry run: 1 change(s) not written; add --apply to write them" in out
        assert apply.main([*plan_args, "--validate-only"]) == 0
        assert f"validate-only: {entity}: ok" in capsys.readouterr().out
        # a marker written after them: once it is visible, anything they wrote would be too (the
        # controller applies quota changes in order)
        marker = f"user=ANONYMOUS,client-id={client_id}-marker"
        with KafkaQuotaClient(kafka.bootstrap) as admin:
            assert admin.alter({marker: [QuotaOp(P, 1024)]})[0].ok
        eventually(lambda: _configs(kafka_tools, f"{client_id}-marker"), lambda out: "1024.0" in out)
        assert "producer_byte_rate=1000000.0" in _configs(kafka_tools, client_id)

        # and --apply writes it, as kafka-configs sees it
        assert apply.main([*plan_args, "--apply"]) == 0
        assert f"apply: {entity}: ok" in capsys.readouterr().out
        described = eventually(lambda: _configs(kafka_tools, client_id), lambda o: "30000.0" in o)
        assert f"client-id '{client_id}' are producer_byte_rate=30000.0" in described

        # and the broker now holds that client near 30,000 B/s. Sending 480 KiB: a fresh sensor's
        # window is padded to 10 s, so about 10 s x 30,000 B passes at once and the rest, ~190 KB,
        # needs at least ~6 s more (measured: ~13 s). A quota 10x higher would let it all through
        # in well under a second, one 10x lower would take minutes. Another client-id, with no
        # quota, sends the same at once and is never throttled.
        total = 480 * 1024
        elapsed, throttle_ms = _produce_for(kafka.bootstrap, topic, client_id, total)
        free_elapsed, free_throttle_ms = _produce_for(kafka.bootstrap, topic, unique_name("free"), total)
        assert throttle_ms > 0 and free_throttle_ms == 0
        assert (total - 11 * 30_000) / 30_000 * 0.8 <= elapsed <= 3 * total / 30_000, elapsed
        assert free_elapsed < elapsed / 4, (free_elapsed, elapsed)
    finally:
        with KafkaQuotaClient(kafka.bootstrap) as admin:
            admin.alter({entity: [QuotaOp(P, None)]})


def _configs(tools: KafkaTools, client_id: str) -> str:
    return tools.configs("--describe", "--entity-type", "users", "--entity-name", "ANONYMOUS",
                         "--entity-type", "clients", "--entity-name", client_id).check().stdout
