"""Nothing lost under faults, against the three-node cluster through Sluice (issue 16).

* Kafka's own VerifiableProducer (idempotent, acks=all) and VerifiableConsumer run through Sluice
  while partition leaders are SIGKILLed and restarted, twice, and Sluice itself is restarted once
  with SIGTERM on the same ports: every acknowledged record is consumed; duplicates are counted and
  reported (the consumer may re-read what it had not committed when its group rebalanced).
  Sluice opens a broker's listener when a Metadata response names that broker, so a restarted
  Sluice would refuse clients that reconnect straight to a broker port until some client
  bootstraps again: the test bootstraps once after the restart, as any new client would.
* A broker that hangs (SIGSTOP) mid-request: its clients time out, clients of the other brokers are
  served meanwhile, the hung connections that clients give up on are released (the open
  connections gauge comes back to where it was), and after SIGCONT clients are served again.
"""

from __future__ import annotations

import socket
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from protocol.apis import ApiKey
from tests.conftest import create_topic, unique_name
from tests.harness.kafka import KafkaCluster, free_port
from tests.harness.rawclient import RawKafkaSocket, metadata_request
from tests.harness.sluice import SluiceProcess
from tests.harness.verifiable import (
    frozen,
    verifiable_consumer,
    verifiable_producer,
    wait_for_full_isr,
    wait_for_leader,
)
from tests.harness.wait import poll as until

pytestmark = [pytest.mark.integration, pytest.mark.slow]


_T0 = time.monotonic()
# Partitions whose leader is SIGKILLed and restarted, one after the other (the next only once the
# restarted node is back in every ISR: min.insync.replicas=2 of 3).
LEADER_KILLS = (0, 1)


def phase(what: str) -> None:
    print(f"[{time.monotonic() - _T0:7.1f} s] {what}", flush=True)


def port_run(count: int) -> int:
    """A port P with P..P+count-1 all free: Sluice's bootstrap and per-broker listeners (P+1+id),
    the same again after a restart."""
    for _ in range(50):
        base = free_port()
        socks = []
        try:
            for p in range(base, base + count):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no run of free ports")


def open_connections(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("sluice_open_connections{"))


@pytest.fixture
def fixed_port_sluice(kafka_cluster3: KafkaCluster, tmp_path: Path) -> Iterator[Callable[[], SluiceProcess]]:
    """Sluice in front of the three nodes on fixed ports; call it again to start it anew on them."""
    base = port_run(5)
    config = {"listen": f"127.0.0.1:{base}", "metrics": {"port": free_port()}}
    running: list[SluiceProcess] = []

    def start() -> SluiceProcess:
        proc = SluiceProcess(kafka_cluster3.bootstrap, tmp_path / f"sluice-{len(running)}", config=config)
        running.append(proc.start())
        return proc

    try:
        yield start
    finally:
        for proc in running:
            proc.stop()


def test_every_acknowledged_record_is_consumed_through_leader_kills_and_a_sluice_restart(
        kafka_cluster3: KafkaCluster, fixed_port_sluice: Callable[[], SluiceProcess], tmp_path: Path) -> None:
    cluster = kafka_cluster3
    topic = create_topic(cluster.bootstrap, unique_name("faults"), partitions=3, replication=3,
                         config={"min.insync.replicas": "2"})
    sluice = fixed_port_sluice()
    # runs until stopped after the last fault (a fixed count ran out while a broker restarted under load)
    producer = verifiable_producer(sluice.bootstrap, topic, tmp_path / "producer", max_messages=10_000_000,
                                   throughput=150).start()
    consumer = verifiable_consumer(sluice.bootstrap, topic, unique_name("faults-g"),
                                   tmp_path / "consumer").start()
    kills: list[int] = []
    restarted_sluice = False
    try:
        def acked_count() -> int:
            return len(producer.records("producer_send_success"))

        until(lambda: acked_count() >= 300 or not producer.running(), 90)
        assert acked_count() >= 300, producer.stderr_tail()

        for partition in LEADER_KILLS:  # SIGKILL a partition's leader, wait for a new one, restart it
            leader = wait_for_leader(cluster.bootstrap, topic, partition, not_in=set())
            phase(f"killing node {leader}, the leader of partition {partition}")
            acked_before = len(producer.records("producer_send_success"))
            cluster.kill_node(leader)
            kills.append(leader)
            wait_for_leader(cluster.bootstrap, topic, partition, not_in={leader})
            assert until(lambda n=acked_before: acked_count() > n + 100, 60), \
                f"the producer made no progress with a leader down: {producer.stderr_tail(1500)}"
            phase(f"restarting node {leader}")
            cluster.restart_node(leader)
            wait_for_full_isr(cluster.bootstrap, topic, 3)
            phase(f"node {leader} is back and in sync")

        # Sluice itself: SIGTERM (it drains), then a new process on the same ports
        acked_before = len(producer.records("producer_send_success"))
        phase("SIGTERM to Sluice")
        assert sluice.stop() == 0
        sluice = fixed_port_sluice()
        restarted_sluice = True
        # A restarted Sluice opens a broker's listener only when a Metadata response names the broker
        # (see the module's docstring): one bootstrap, as any new client would do, opens them all.
        with RawKafkaSocket(sluice.bootstrap) as raw:
            raw.send(metadata_request())
            raw.recv(ApiKey.METADATA, 12)
        assert until(lambda: len(producer.records("producer_send_success")) > acked_before + 100, 60), (
            f"the producer did not come back through the restarted Sluice ({acked_before} acked before, "
            f"{acked_count()} now, running: {producer.running()}): {producer.stderr_tail(2500)}\n"
            f"Sluice: {sluice.log()[-2500:]}")

        phase("Sluice restarted and the producer through it again; stopping the producer")
        producer.stop()  # SIGTERM: it flushes, every record sent gets its outcome
        phase("producer done; waiting for the consumer")
        acked = set(producer.records("producer_send_success"))
        errors = producer.of("producer_send_error")

        def consumed_all() -> bool:
            return acked <= set(consumer.records("record_data"))

        assert until(consumed_all, 120, 0.5), (
            f"{len(acked - set(consumer.records('record_data')))} acknowledged records never consumed; "
            f"consumer: {consumer.stderr_tail()}")
    finally:
        producer.stop()
        consumer.stop()

    consumed = consumer.records("record_data")
    counts = Counter(consumed)
    duplicates = sum(n - 1 for n in counts.values())
    values = Counter(value for _, _, value in acked)
    print(f"\nfaults: {len(acked)} acknowledged, {len(errors)} send errors, "
          f"{len(consumed)} consumed, {duplicates} duplicate deliveries to the consumer, "
          f"leaders killed: {kills}, Sluice restarted: {restarted_sluice}")
    assert len(kills) == len(LEADER_KILLS) and restarted_sluice
    assert acked <= set(consumed)                          # nothing acknowledged was lost
    assert max(values.values()) == 1                       # idempotence: no value written twice
    # a duplicate delivery is only the re-read of an offset already consumed, never new data
    assert {(p, o) for p, o, _ in consumed} == {(p, o) for p, o, _ in counts}


def test_a_hung_broker_times_out_its_clients_only_and_its_connections_are_released(
        kafka_cluster3: KafkaCluster, fixed_port_sluice: Callable[[], SluiceProcess]) -> None:
    cluster = kafka_cluster3
    sluice = fixed_port_sluice()
    metrics_port = int(sluice.config["metrics"]["port"])
    with RawKafkaSocket(sluice.bootstrap) as raw:  # Sluice opens a broker's listener when it learns of it
        raw.send(metadata_request())
        brokers = raw.recv(ApiKey.METADATA, 12)[1].brokers
    listener = {int(b.node_id): f"{b.host}:{b.port}" for b in brokers}
    assert sorted(listener) == [1, 2, 3]
    hung_id = 3
    others = [n for n in listener if n != hung_id]

    def served(bootstrap: str, timeout_s: float) -> bool:
        with RawKafkaSocket(bootstrap, timeout_s=timeout_s) as raw:
            raw.send(metadata_request())
            return raw.recv(ApiKey.METADATA, 12)[0] == 1

    for node_id in listener:  # every broker answers through its listener first
        assert served(listener[node_id], 30)
    assert until(lambda: open_connections(metrics_port) == 0, 30), open_connections(metrics_port)

    hung: list[RawKafkaSocket] = []
    with frozen(cluster, hung_id):
        stopped = time.monotonic()
        for _ in range(5):  # requests in flight to a broker that will not answer
            raw = RawKafkaSocket(listener[hung_id], timeout_s=10)
            raw.send(metadata_request())
            hung.append(raw)
        for index, raw in enumerate(hung):  # each client sees a timeout
            raw.sock.settimeout(2.0)
            try:
                correlation_id, answer = raw.recv(ApiKey.METADATA, 12)
            except TimeoutError:
                continue
            after_s = time.monotonic() - stopped
            pytest.fail(f"client {index} of the hung broker {hung_id} was answered {after_s:.1f} s "
                        f"after SIGSTOP (correlation id {correlation_id}, brokers "
                        f"{sorted((int(b.node_id), b.port) for b in answer.brokers)}, controller "
                        f"{int(answer.controller_id)}); broker {hung_id}: {process_state(cluster, hung_id)}, "
                        f"listeners {listener}, broker ports {[(n.node_id, n.port) for n in cluster.nodes]}\n"
                        f"Sluice: {sluice.log()[-3000:]}")
        # Sluice holds the hung connections, and meanwhile serves everyone else
        assert until(lambda: open_connections(metrics_port) >= 5, 10), open_connections(metrics_port)
        started = time.monotonic()
        for node_id in others:
            for _ in range(3):
                assert served(listener[node_id], 5)
        assert time.monotonic() - started < 30
        # clients give up: Sluice drops their connections (and its upstream ones) though the broker hangs
        for raw in hung:
            raw.close()
        assert until(lambda: open_connections(metrics_port) == 0, 20), (
            f"{open_connections(metrics_port)} connections still open after the clients left")
    # after SIGCONT the broker's clients are served again
    assert until(lambda: _try(lambda: served(listener[hung_id], 5)), 60), "the resumed broker is not served"
    assert until(lambda: open_connections(metrics_port) == 0, 20)
    assert sluice.process is not None and sluice.process.poll() is None


def process_state(cluster: KafkaCluster, node_id: int) -> str:
    """The node's pid and its State line in /proc (`T (stopped)` while frozen)."""
    process = cluster.node(node_id).process
    if process is None:
        return "no process"
    try:
        status = Path(f"/proc/{process.pid}/status").read_text()
    except OSError as exc:
        return f"pid {process.pid}: {exc}"
    state = next((line for line in status.splitlines() if line.startswith("State:")), "no State line")
    return f"pid {process.pid}, {state}"


def _try(probe: Callable[[], bool]) -> bool:
    try:
        return probe()
    except (OSError, TimeoutError, ConnectionError):
        return False
