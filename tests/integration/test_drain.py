"""SIGTERM drains without dropping what clients sent, against real Kafka, on the deployed shape:
a supervisor and two workers (SO_REUSEPORT) behind a PROXY-protocol v2 listener.

A drain answers every request a client has sent, however far Sluice had got with it when the signal
came (in the kernel's accept queue, before the PROXY header was read, read while the connection's
upstream was still connecting, or forwarded), also requests that arrive during the drain; each
connection closes between requests."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from protocol.apis import ApiKey
from protocol.proxy_protocol import encode_v2
from tests.conftest import create_topic, unique_name
from tests.harness.kafka import KafkaCluster
from tests.harness.rawclient import RawKafkaSocket, fetch_request_v12, metadata_request
from tests.harness.sluice import SluiceProcess
from tests.harness.wait import poll

pytestmark = [pytest.mark.integration]

CONNECTIONS = 8
LONG_POLL_MS = 3000  # an empty topic: the broker answers a Fetch after max_wait_ms
LATE_POLL_MS = 8000  # the drain begins (its log line read here) well before the broker answers
DRAINING = re.compile(r"draining \d+ connection\(s\)")  # the first line of a drain


def start(kafka: KafkaCluster, tmp_path: Path, workers: int | None = 2) -> SluiceProcess:
    config = {"proxy_protocol": "v2", "drain_timeout_ms": 30_000}
    return SluiceProcess(kafka.bootstrap, tmp_path / "sluice", config=config, workers=workers).start()


def connect(sluice: SluiceProcess, client_port: int) -> RawKafkaSocket:
    host, port = sluice.bootstrap.rsplit(":", 1)
    raw = RawKafkaSocket(sluice.bootstrap, timeout_s=30)
    raw.send_raw(encode_v2(("127.0.0.1", client_port), (host, int(port))))
    return raw


def assert_drained_cleanly(sluice: SluiceProcess) -> None:
    """Exit 0, every worker on its own: none closed connections at the drain timeout or was killed."""
    assert sluice.process is not None and sluice.process.wait(60) == 0, sluice.log()[-3000:]
    log = sluice.log()
    assert all(f"worker {i} exited with status 0" in log for i in range(sluice.workers or 0)), log[-3000:]
    assert "drain timeout" not in log, log[-3000:]


def test_requests_sent_just_before_sigterm_are_answered(kafka: KafkaCluster, tmp_path: Path) -> None:
    """Connect, send a PROXY header and a long poll, and SIGTERM at once, with no pause between:
    the signal meets each connection wherever it is, and every one is answered, then closed."""
    idle = create_topic(kafka.bootstrap, unique_name("drain-idle"))
    sluice = start(kafka, tmp_path)
    conns: list[RawKafkaSocket] = []
    try:
        sent = []
        for i in range(CONNECTIONS):
            conns.append(connect(sluice, 41000 + i))
            sent.append(conns[-1].send(fetch_request_v12(idle, max_wait_ms=LONG_POLL_MS)))
        sluice.signal(signal.SIGTERM)
        for i, (raw, correlation_id) in enumerate(zip(conns, sent, strict=True)):
            try:
                got_id, body = raw.recv(ApiKey.FETCH, 12)
            except ConnectionError as exc:
                raise AssertionError(f"connection {i} closed with its Fetch unanswered:\n"
                                     f"{sluice.log()[-4000:]}") from exc
            assert (got_id, body.error_code) == (correlation_id, 0)
            assert raw.at_eof(10.0)  # then closed, between requests
        assert_drained_cleanly(sluice)
    finally:
        for raw in conns:
            raw.close()
        sluice.stop()


def test_a_request_that_arrives_during_the_drain_is_answered(kafka: KafkaCluster, tmp_path: Path) -> None:
    """A client pipelines a request behind its long poll after the drain has begun (as a client
    that has not yet seen the close does): it is answered, in order, and the connection closes after it.
    One process: what a connection does while draining is the same in every worker."""
    idle = create_topic(kafka.bootstrap, unique_name("drain-late"))
    sluice = start(kafka, tmp_path, workers=None)
    try:
        with connect(sluice, 42000) as raw:
            fetch_id = raw.send(fetch_request_v12(idle, max_wait_ms=LATE_POLL_MS))
            sluice.signal(signal.SIGTERM)
            assert poll(lambda: DRAINING.search(sluice.log()) is not None, 30), sluice.log()[-3000:]
            metadata_id = raw.send(metadata_request())
            got_fetch, _ = raw.recv(ApiKey.FETCH, 12)
            got_metadata, _ = raw.recv(ApiKey.METADATA, 12)
            assert (got_fetch, got_metadata) == (fetch_id, metadata_id)
            assert raw.at_eof(10.0)
        assert_drained_cleanly(sluice)
    finally:
        sluice.stop()
