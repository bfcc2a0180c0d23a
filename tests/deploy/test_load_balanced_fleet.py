"""The compose example's shape, run for real without containers: deploy/compose/sluice.yaml (fleet,
Kafka quota store, `workers: 2`, `proxy_protocol: v2`) on two Sluice instances that listen on the
same ports at 127.0.0.2 and 127.0.0.3 (as two containers would), and deploy/compose/haproxy.cfg
(Debian's haproxy, `send-proxy-v2`) in front of them at 127.0.0.1, the one advertised host.

haproxy connects to the instances from its own address, 127.0.0.9 (`source`), and clients connect
from 127.0.0.1 or 127.0.0.7, so what Sluice sees is either the client's address (from the PROXY
header) or plainly the load balancer's. While idempotent producers run, one instance is drained
(SIGTERM): its /healthz answers 503, haproxy takes it out and sends new connections to the other,
and the producers lose and duplicate nothing. Each instance's output (stdout and stderr: its
supervisor's and workers' logs) is kept in tmp_path/<instance>/sluice.log and printed, with
haproxy's, when the test fails."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from protocol.apis import ApiKey
from protocol.proxy_protocol import encode_v2
from tests.conftest import create_topic, unique_name
from tests.harness import clients, haproxy
from tests.harness.kafka import KafkaCluster, free_port
from tests.harness.rawclient import RawKafkaSocket, fetch_request_v12, metadata_request
from tests.harness.sluice import SluiceProcess
from tests.harness.wait import eventually, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "compose"
INSTANCES = {"sluice-1": "127.0.0.2", "sluice-2": "127.0.0.3"}
LB_SOURCE = haproxy.SOURCE     # haproxy's address towards the instances
REFUSED_CLIENT = "127.0.0.7"   # a client whose address a per-IP limit refuses
PRODUCERS = 4
NEW_CONNECTIONS = 6
ROUND_S = 0.01                 # one record from each producer per round


def read_records(root: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in sorted(root.rglob("*.jsonl"))
            for line in path.read_text().splitlines()]


def broker_ids(bootstrap: str) -> list[int]:
    from confluent_kafka.admin import AdminClient

    return sorted(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).brokers)


def healthz(host: str, port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return -1


LOG_TAIL_LINES = 400


@contextlib.contextmanager
def logs_shown_on_failure(sluices: Mapping[str, SluiceProcess], lb: list[haproxy.Haproxy]) -> Iterator[None]:
    """On a failure, print every Sluice instance's log (its file under tmp_path, and its last
    lines) and haproxy's, so that the failure explains itself (pytest shows what a failed test
    printed)."""
    try:
        yield
    except BaseException:
        for name, sluice in sluices.items():
            lines = sluice.log().splitlines()
            print(f"===== {name}: {sluice.workdir / 'sluice.log'} ({len(lines)} lines, the last "
                  f"{LOG_TAIL_LINES}) =====")
            print("\n".join(lines[-LOG_TAIL_LINES:]))
        for proxy in lb:
            print("===== haproxy =====")
            print("\n".join(proxy.log().splitlines()[-LOG_TAIL_LINES:]))
        raise


class Producers:
    """Idempotent producers sending numbered records until stopped; every delivery report kept."""

    def __init__(self, address: str, topic: str) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self.producers = [Producer({"bootstrap.servers": address, "client.id": f"lb-{i}", "linger.ms": 5,
                                    "enable.idempotence": True, "acks": "all", "message.timeout.ms": 120_000})
                          for i in range(PRODUCERS)]  # opened together: leastconn spreads them
        self.sent: list[bytes] = []
        self.delivered: list[bytes] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _report(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.delivered.append(msg.value())

    def _run(self) -> None:
        # paced by a schedule, not a pause after each round: round n is due at start + n x ROUND_S
        # (about 400 records/s in all: load, not a flood), late rounds are sent at once, and stop()
        # ends the wait for the next one
        start, n = time.monotonic(), 0
        while not self._stop.is_set():
            for i, producer in enumerate(self.producers):
                value = f"p{i}-{n}".encode()
                producer.produce(self.topic, value, on_delivery=self._report)
                self.sent.append(value)
                producer.poll(0)
            n += 1
            self._stop.wait(max(0.0, start + n * ROUND_S - time.monotonic()))

    def __enter__(self) -> Producers:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for producer in self.producers:
            assert producer.flush(120) == 0

    def __exit__(self, *exc: object) -> None:
        if not self._stop.is_set():
            self.stop()


def test_two_instances_behind_haproxy_see_clients_and_drain_without_loss(kafka: KafkaCluster,
                                                                          tmp_path: Path) -> None:
    sluices: dict[str, SluiceProcess] = {}
    balancers: list[haproxy.Haproxy] = []
    with logs_shown_on_failure(sluices, balancers):
        drain_one_of_two(kafka, tmp_path, sluices, balancers)


def drain_one_of_two(kafka: KafkaCluster, tmp_path: Path, sluices: dict[str, SluiceProcess],
                     balancers: list[haproxy.Haproxy]) -> None:
    bootstrap_port, broker_port, metrics_port = free_port(), free_port(), free_port()
    logs = tmp_path / "logs"
    base = yaml.safe_load((COMPOSE / "sluice.yaml").read_text())
    assert base["workers"] == 2 and base["proxy_protocol"] == "v2"
    fleet = unique_name("lbfleet")
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(haproxy.config(INSTANCES, bootstrap_port, broker_port, metrics_port))

    (node_id,) = broker_ids(kafka.bootstrap)  # asked of the broker: also a SLUICE_KAFKA_BOOTSTRAP cluster's
    address = f"127.0.0.1:{bootstrap_port}"
    try:
        for name, host in INSTANCES.items():
            config = base | {
                "listen": f"{host}:{bootstrap_port}", "advertised_host": "127.0.0.1",
                "broker_port_base": broker_port - node_id,
                "upstream": {"bootstrap": kafka.bootstrap}, "instance": name,
                "metrics": {"host": host, "port": metrics_port},
                "access_log": {"dir": str(logs), "format": "json"},
                "store": base["store"] | {"topic": f"{fleet}-quotas"},
                "fleet": base["fleet"] | {"id": fleet, "topic": f"{fleet}-reports"},
                # haproxy's own address and the refused client's may not connect: only a client
                # address read from the PROXY header gets through
                "limits": {"max_connections_per_ip_overrides": {LB_SOURCE: 0, REFUSED_CLIENT: 0}},
            }
            sluices[name] = SluiceProcess(kafka.bootstrap, tmp_path / name, config=config)
            sluices[name].start(timeout_s=120)
        lb = haproxy.Haproxy(cfg)
        balancers.append(lb)
        wait_until(lambda: haproxy.listening(address), 30, "haproxy listening")
        wait_until(lambda: all(healthz(h, metrics_port) == 200 for h in INSTANCES.values()), 30, "healthy")

        # the per-IP limit sees the client's address: 127.0.0.7 is refused, 127.0.0.1 is served
        with RawKafkaSocket(address, source_host=REFUSED_CLIENT) as refused:
            refused.send(metadata_request())
            assert refused.at_eof(15.0)
        assert eventually(lambda: any(f"connection from {REFUSED_CLIENT} refused" in s.log()
                                      for s in sluices.values()), bool), \
            [s.log()[-1500:] for s in sluices.values()]

        topic = create_topic(kafka.bootstrap, unique_name("lb"))
        idle = create_topic(kafka.bootstrap, unique_name("lb-idle"))  # a fetch on it waits max_wait_ms
        with Producers(address, topic) as producers:
            wait_until(lambda: len(producers.delivered) >= 400, 60, "deliveries before the drain")

            # drain sluice-1 with a long poll in flight on it (sent straight to it, PROXY header first),
            # so that the drain lasts a few seconds
            with RawKafkaSocket(f"{INSTANCES['sluice-1']}:{broker_port}") as held:
                held.send_raw(encode_v2(("127.0.0.1", 40000), (INSTANCES["sluice-1"], broker_port)))
                correlation_id = held.send(fetch_request_v12(idle, max_wait_ms=6000))
                delivered_at_drain = len(producers.delivered)
                sluices["sluice-1"].signal(signal.SIGTERM)
                assert eventually(lambda: healthz(INSTANCES["sluice-1"], metrics_port), lambda s: s == 503,
                                  10, 0.02) == 503
                wait_until(lambda: "sluice/sluice-1 is DOWN" in lb.log(), 10, "haproxy takes sluice-1 out")
                # new connections now: every one goes to sluice-2
                new_ports = []
                for _ in range(NEW_CONNECTIONS):
                    with RawKafkaSocket(address) as conn:
                        new_ports.append(conn.sock.getsockname()[1])
                        conn.send(metadata_request())
                        conn.recv(ApiKey.METADATA, 12)
                got_id, _body = held.recv(ApiKey.FETCH, 12)   # the drained instance answered it
                assert got_id == correlation_id
            assert sluices["sluice-1"].process is not None
            assert sluices["sluice-1"].process.wait(60) == 0, sluices["sluice-1"].log()[-3000:]
            wait_until(lambda: len(producers.delivered) >= delivered_at_drain + 400, 60,
                       "deliveries after the drain")
            producers.stop()
        assert not producers.errors, producers.errors[:5]
        assert len(producers.delivered) == len(producers.sent)
    finally:
        for sluice in sluices.values():
            sluice.stop()
        for lb in balancers:
            lb.stop()

    # nothing lost, nothing twice: what Kafka holds is exactly what was sent
    got = clients.confluent_consume(kafka.bootstrap, topic, len(producers.sent), config={"client.id": "lb-c"})
    counts = Counter(got)
    assert set(counts) == set(producers.sent) and max(counts.values()) == 1

    records = read_records(logs)
    produce = [r for r in records if r["api_name"] == "Produce"]
    assert {r["instance"] for r in produce} == set(INSTANCES)  # both instances carried produce traffic
    assert {r["broker_id"] for r in produce} == {node_id}        # on the per-broker port, through haproxy
    # the access log has the client's address, never the load balancer's
    hosts = Counter(r["client_address"].rsplit(":", 1)[0] for r in records)
    assert set(hosts) == {"127.0.0.1"}, hosts
    fresh = [r for r in records if int(r["client_address"].rsplit(":", 1)[1]) in new_ports
             and r["api_name"] == "Metadata"]
    assert len(fresh) >= NEW_CONNECTIONS and {r["instance"] for r in fresh} == {"sluice-2"}, fresh
