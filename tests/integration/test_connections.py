"""The connection inventory against real Kafka through a real Sluice process (issue 14).

A librdkafka producer over its quota (SASL PLAIN, user alice) and an idle AdminClient (SCRAM, user
bob) both show in `GET /connections` with their principal, client id and client software; the
producer's connection with throttle time and the quota entity that matched. The endpoint wants
its bearer token, and neither the token nor a SASL password appears in what it or the process
prints. `sluice connections` filters the same list.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.conftest import create_topic, unique_name
from tests.harness import load
from tests.harness.kafka import KafkaCluster, free_port
from tests.harness.sluice import SluiceProcess
from tests.harness.wait import eventually

pytestmark = [pytest.mark.integration]

TOKEN = "conn-inventory-Tok3n-9f2c"
PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret"}
QUOTA_BYTES_PER_S = 32 * 1024


def sasl(mechanism: str, user: str) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": mechanism, "sasl.username": user,
            "sasl.password": PASSWORDS[user]}


def get(port: int, token: str | None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/connections")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def by_client(body: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for conn in json.loads(body)["connections"]:
        out.setdefault(conn["client_id"] or "", []).append(conn)
    return out


def test_connections_list_a_throttled_producer_and_an_idle_admin(kafka: KafkaCluster, tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient

    from proxy.ops.connections_cli import connections as connections_command

    port = free_port()
    config = {"metrics": {"port": port},
              "connections_endpoint": {"enabled": True, "token_env": "SLUICE_CONNECTIONS_TOKEN"},
              "quotas": {"window": {"samples": 11, "size_ms": 500},
                         "entries": [{"user": "alice", "producer_byte_rate": QUOTA_BYTES_PER_S}]}}
    topic = create_topic(kafka.bootstrap, unique_name("conns"))
    stop = threading.Event()
    with SluiceProcess(kafka.sasl_bootstrap, tmp_path / "sluice", config=config,
                       env={"SLUICE_CONNECTIONS_TOKEN": TOKEN}).start() as sluice:
        admin = AdminClient({"bootstrap.servers": sluice.bootstrap, "client.id": "conn-admin",
                             **sasl("SCRAM-SHA-256", "bob")})
        assert topic in admin.list_topics(timeout=10).topics   # then it sits idle
        flood = threading.Thread(target=load.confluent_flood, kwargs={
            "bootstrap": sluice.bootstrap, "topic": topic, "seconds": 30.0, "client_id": "conn-flood",
            "record_size": 1000, "batch_bytes": 8 * 1024, "stop": stop, "abandon_on_stop": True,
            "config": sasl("PLAIN", "alice")}, daemon=True)
        flood.start()
        try:
            def throttled_producer(body: str) -> bool:
                clients = by_client(body)
                return (any(c["throttle_ms"] > 0 for c in clients.get("conn-flood", []))
                        and "conn-admin" in clients)

            body = eventually(lambda: get(port, TOKEN)[1], throttled_producer, timeout_s=20.0,
                              interval_s=0.25)
            assert throttled_producer(body), body
            clients = by_client(body)
            producer = max(clients["conn-flood"], key=lambda c: c["throttle_ms"])
            assert producer["principal"] == "alice"
            assert producer["listener"] == "broker 1" and producer["broker_id"] == 1
            assert producer["produce_bytes_per_s"] > 0 and producer["produce_requests_per_s"] > 0
            assert {"kind": "producer_byte_rate", "entity": {"user": "alice"}} in producer["quota"]
            assert producer["client_address"].startswith("127.0.0.1:")
            for conn in clients["conn-flood"] + clients["conn-admin"]:
                software = f"{conn['client_software_name']} {conn['client_software_version']}"
                assert "rdkafka" in software, software    # librdkafka (via confluent-kafka-python)
                assert conn["worker"] is None and conn["connected_ms"] >= 0
            for conn in clients["conn-admin"]:
                assert conn["principal"] == "bob"
                assert conn["throttle_ms"] == 0 and not conn["muted"] and conn["quota"] == []
                assert conn["produce_bytes_per_s"] == 0

            assert get(port, None)[0] == 401
            assert get(port, "not-the-token")[0] == 401

            result = CliRunner().invoke(connections_command, [
                "--url", f"http://127.0.0.1:{port}", "--throttled", "--output", "json"],
                env={"SLUICE_CONNECTIONS_TOKEN": TOKEN})
            assert result.exit_code == 0, result.output
            listed = {c["client_id"] for c in json.loads(result.output)["connections"]}
            assert listed == {"conn-flood"}
            table = CliRunner().invoke(connections_command, ["--url", f"http://127.0.0.1:{port}"],
                                       env={"SLUICE_CONNECTIONS_TOKEN": TOKEN})
            assert table.exit_code == 0 and "conn-admin" in table.output and "bob" in table.output

            printed = body + result.output + table.output + sluice.log()
            for secret in (TOKEN, *PASSWORDS.values()):
                assert secret not in printed
        finally:
            stop.set()
            flood.join(15)


def test_with_workers_the_supervisor_lists_every_workers_connections(kafka: KafkaCluster,
                                                                     tmp_path: Path) -> None:
    """`--workers 2`: connections spread over the workers by the kernel all show in the supervisor's
    /connections, each naming its worker."""
    from confluent_kafka.admin import AdminClient

    port = free_port()
    config = {"metrics": {"port": port},
              "connections_endpoint": {"enabled": True, "token_env": "SLUICE_CONNECTIONS_TOKEN"}}
    with SluiceProcess(kafka.bootstrap, tmp_path / "sluice", config=config, workers=2,
                       env={"SLUICE_CONNECTIONS_TOKEN": TOKEN}).start() as sluice:
        ids = [f"conn-w{i}" for i in range(8)]
        admins = [AdminClient({"bootstrap.servers": sluice.bootstrap, "client.id": cid}) for cid in ids]
        for admin in admins:
            admin.list_topics(timeout=10)

        def all_listed(body: str) -> bool:
            return set(ids) <= set(by_client(body))

        body = eventually(lambda: get(port, TOKEN)[1], all_listed, timeout_s=15.0, interval_s=0.25)
        assert all_listed(body), body
        doc = json.loads(body)
        assert "unavailable_workers" not in doc
        workers = {c["worker"] for c in doc["connections"] if c["client_id"] in ids}
        assert workers <= {0, 1} and workers, workers
        assert get(port, None)[0] == 401
        del admins
