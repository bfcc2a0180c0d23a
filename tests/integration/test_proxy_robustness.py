"""Bad input, broken upstreams, TLS to the brokers and draining on SIGTERM, against real Kafka."""

from __future__ import annotations

import signal
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol.apis import ApiKey
from tests.conftest import create_topic, unique_name
from tests.harness import clients
from tests.harness.kafka import KafkaCluster
from tests.harness.rawclient import RawKafkaSocket, fetch_request_v12, metadata_request
from tests.harness.sluice import SluiceProcess
from tests.harness.tls import TestCA
from tests.harness.wait import poll as until

pytestmark = pytest.mark.integration


# ----------------------------------------------------------------------------- bad frames

@pytest.mark.parametrize(("garbage", "reason"), [
    (struct.pack(">i", -7), "negative"),                              # size prefix below zero
    (struct.pack(">i", 200 * 1024 * 1024) + b"x" * 16, "exceeds"),    # over max_frame_bytes
    (struct.pack(">i", 3) + b"\x00\x12\x00", "truncated"),            # a 3-byte request header
])
def test_malformed_frame_closes_only_that_connection(sluice: SluiceProcess, topic: str,
                                                     garbage: bytes, reason: str) -> None:
    stop = threading.Event()
    produced: list[int] = []

    def steady_producer() -> None:  # another client, busy the whole time
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": sluice.bootstrap, "linger.ms": 1})
        i = 0
        while not stop.is_set():
            p.produce(topic, f"steady-{i}".encode(), on_delivery=lambda e, m: e or produced.append(1))
            p.poll(0.01)
            i += 1
        assert p.flush(30) == 0

    worker = threading.Thread(target=steady_producer)
    worker.start()
    try:
        # the other client is connected and delivering before the bad frame (slow under load: poll)
        assert until(lambda: len(produced) >= 10, 60.0), "the steady producer never delivered"
        with RawKafkaSocket(sluice.bootstrap) as bad:
            bad.send_raw(garbage)
            assert bad.at_eof(5.0), "Sluice kept a connection with a malformed frame open"
            before = len(produced)
            # it keeps delivering after the bad connection was closed
            assert until(lambda: len(produced) >= before + 10, 30.0), "the other client was disturbed"
    finally:
        stop.set()
        worker.join(30)
    assert sluice.wait_for_log("malformed") and sluice.wait_for_log(reason), sluice.log()


def test_unknown_api_key_passes_through_to_the_broker(sluice: SluiceProcess) -> None:
    # Sluice does not decode what it need not: an api key it does not know goes to the broker,
    # which closes the connection as Kafka does for unknown requests.
    with RawKafkaSocket(sluice.bootstrap) as raw:
        payload = struct.pack(">hhih", 999, 0, 1, 3) + b"raw"
        raw.send_raw(struct.pack(">i", len(payload)) + payload)
        assert raw.at_eof(10.0)
    with RawKafkaSocket(sluice.bootstrap) as ok:  # and Sluice serves the next client normally
        ok.send(metadata_request())
        correlation_id, body = ok.recv(ApiKey.METADATA, 12)
        assert correlation_id == 1 and len(body.brokers) == 1


# ----------------------------------------------------------------------------- upstream failure

@pytest.fixture
def own_kafka(tmp_path: Path) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(tmp_path / "own", 1).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_broker_failure_reaches_the_client_as_a_closed_connection(own_kafka: KafkaCluster,
                                                                  tmp_path: Path) -> None:
    with SluiceProcess(own_kafka.bootstrap, tmp_path / "s") as sluice:
        raw = RawKafkaSocket(sluice.bootstrap)
        raw.send(metadata_request())
        raw.recv(ApiKey.METADATA, 12)
        in_flight = RawKafkaSocket(sluice.bootstrap)
        in_flight.send(metadata_request())
        in_flight.recv(ApiKey.METADATA, 12)
        own_kafka.kill_node(1)
        assert raw.at_eof(5.0), "client socket hung after the broker died"
        assert in_flight.at_eof(5.0)
        own_kafka.restart_node(1)
        deadline = time.monotonic() + 30
        while True:  # the client reconnects through the same Sluice once the broker is back
            try:
                with RawKafkaSocket(sluice.bootstrap) as again:
                    again.send(metadata_request())
                    assert again.recv(ApiKey.METADATA, 12)[0] == 1
                    break
            except (ConnectionError, OSError):
                assert time.monotonic() < deadline
                time.sleep(0.5)
        assert "upstream bootstrap closed" in sluice.log() or "lost" in sluice.log()


def test_unreachable_upstream_closes_the_client_with_a_reason(tmp_path: Path) -> None:
    from tests.harness.kafka import free_port

    with SluiceProcess(f"127.0.0.1:{free_port()}", tmp_path / "s") as sluice, \
            RawKafkaSocket(sluice.bootstrap) as raw:
        raw.send(metadata_request())
        assert raw.at_eof(15.0)
        assert sluice.wait_for_log("cannot connect upstream"), sluice.log()


# ----------------------------------------------------------------------------- drain

def test_sigterm_drains_in_flight_requests_then_exits(kafka: KafkaCluster, tmp_path: Path,
                                                      topic: str) -> None:
    sluice = SluiceProcess(kafka.bootstrap, tmp_path / "s").start()
    try:
        with RawKafkaSocket(sluice.bootstrap) as raw:
            sent_at = time.monotonic()
            correlation_id = raw.send(fetch_request_v12(topic, max_wait_ms=2000))  # a long poll
            sluice.signal(signal.SIGTERM)  # at once: whether Sluice has forwarded it yet or not
            got_id, body = raw.recv(ApiKey.FETCH, 12)      # the in-flight fetch is still answered
            waited = time.monotonic() - sent_at
            assert got_id == correlation_id
            assert body.error_code == 0
            assert waited >= 1.5                           # it really waited for the broker
            assert raw.at_eof(5.0)                         # then Sluice closed the connection
        assert sluice.process is not None
        assert sluice.process.wait(20) == 0
        with pytest.raises(OSError):
            RawKafkaSocket(sluice.bootstrap, timeout_s=2)  # no longer accepting
        assert sluice.wait_for_log("draining "), sluice.log()[-2000:]  # the one connection: open or queued
    finally:
        sluice.stop()


# ----------------------------------------------------------------------------- upstream TLS

def test_upstream_tls_with_a_client_certificate(tls_kafka: tuple[KafkaCluster, TestCA],
                                                tmp_path: Path) -> None:
    cluster, ca = tls_kafka
    client = ca.issue("sluice-client", "sluice")
    config = {"upstream": {"bootstrap": cluster.ssl_bootstrap, "tls": {
        "enabled": True, "ca_file": str(ca.cert_path), "cert_file": str(client.cert),
        "key_file": str(client.key)}}}
    with SluiceProcess(cluster.ssl_bootstrap, tmp_path / "s", config=config) as sluice:
        name = create_topic(sluice.bootstrap, unique_name("tls"))
        sent = clients.values(300, "tls")
        clients.confluent_produce(sluice.bootstrap, name, sent)   # plaintext to Sluice, TLS beyond
        assert clients.confluent_consume(sluice.bootstrap, name, 300) == sent


def test_upstream_tls_without_the_required_client_certificate_fails_cleanly(
        tls_kafka: tuple[KafkaCluster, TestCA], tmp_path: Path) -> None:
    cluster, ca = tls_kafka
    config = {"upstream": {"bootstrap": cluster.ssl_bootstrap,
                           "tls": {"enabled": True, "ca_file": str(ca.cert_path)}}}
    with SluiceProcess(cluster.ssl_bootstrap, tmp_path / "s", config=config) as sluice, \
            RawKafkaSocket(sluice.bootstrap) as raw:
        raw.send(metadata_request())
        assert raw.at_eof(15.0), "client hung while the broker refused Sluice's TLS"


def test_bad_tls_config_fails_at_start_naming_the_key(tmp_path: Path) -> None:
    import subprocess
    import sys

    cfg = tmp_path / "bad.yaml"
    cfg.write_text("upstream:\n  bootstrap: 127.0.0.1:9\n  tls:\n    enabled: true\n"
                   "    ca_file: /nonexistent/ca.pem\n")
    done = subprocess.run([sys.executable, "-m", "proxy", "proxy", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2
    assert "upstream.tls.ca_file" in done.stderr and "file not found" in done.stderr
