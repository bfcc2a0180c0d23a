"""Kafka's own delivery checkers (`VerifiableProducer`, `VerifiableConsumer` from kafka-tools, the
tools Kafka's system tests use) as background processes, plus fault helpers: freezing a broker
with SIGSTOP and finding a partition's leader.

Both tools print one JSON event a line. The producer reports each acknowledged record
(`producer_send_success`: partition, offset, value); the consumer with `--verbose` reports each
record it consumed (`record_data`). `acked` and `consumed` collect them as (partition, offset,
value) for the "every acknowledged record is consumed" check.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

from tests.harness.kafka import KafkaCluster, _die_with_parent, java_command
from tests.harness.lines import read_lines
from tests.harness.wait import wait_until

Record = tuple[int, int, str]  # (partition, offset, value)


class VerifiableTool:
    """One of the two tools, run in the background; its JSON events are parsed as they arrive."""

    def __init__(self, main: str, args: list[str], workdir: Path, config: Mapping[str, str],
                 config_flag: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.name = main.rsplit(".", 1)[1]
        config_path = workdir / f"{self.name}.properties"
        config_path.write_text("".join(f"{k}={v}\n" for k, v in config.items()))
        self._cmd = java_command(main, *args, config_flag, str(config_path))
        self.events: list[dict[str, object]] = []
        self.stderr_path = workdir / f"{self.name}.stderr"
        self.process: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def start(self) -> VerifiableTool:
        with self.stderr_path.open("w") as err:
            self.process = subprocess.Popen(self._cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                                            preexec_fn=_die_with_parent)
        assert self.process.stdout is not None
        read_lines(self.process.stdout, self._line)
        return self

    def _line(self, line: str) -> None:
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                with self._lock:
                    self.events.append(event)

    def of(self, name: str) -> list[dict[str, object]]:
        with self._lock:
            return [e for e in self.events if e.get("name") == name]

    def records(self, name: str) -> list[Record]:
        return [(int(e["partition"]), int(e["offset"]), str(e["value"]))  # type: ignore[call-overload]
                for e in self.of(name)]

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (the tools then print their final events and exit), SIGKILL after `timeout_s`."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode

    def wait(self, timeout_s: float) -> int | None:
        assert self.process is not None
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stderr_tail(self, chars: int = 3000) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""


def verifiable_producer(bootstrap: str, topic: str, workdir: Path, *, max_messages: int,
                        throughput: int, config: Mapping[str, str] | None = None) -> VerifiableTool:
    """Idempotent, acks=all: values are "0", "1", ... in send order."""
    props = {"enable.idempotence": "true", "acks": "all", "retries": "2147483647",  # the tool sets 0
             "delivery.timeout.ms": "120000",
             "request.timeout.ms": "15000", "retry.backoff.ms": "100", "reconnect.backoff.max.ms": "1000",
             "linger.ms": "5", "metadata.recovery.rebootstrap.trigger.ms": "5000"} | dict(config or {})
    return VerifiableTool("org.apache.kafka.tools.VerifiableProducer",
                          ["--bootstrap-server", bootstrap, "--topic", topic,
                           "--max-messages", str(max_messages), "--throughput", str(throughput),
                           "--acks", "-1"],
                          workdir, props, "--producer.config")


def verifiable_consumer(bootstrap: str, topic: str, group: str, workdir: Path,
                        config: Mapping[str, str] | None = None) -> VerifiableTool:
    """Commits after each batch (no auto-commit); `--verbose` reports every record."""
    props = {"request.timeout.ms": "15000", "reconnect.backoff.max.ms": "1000",
             "metadata.recovery.rebootstrap.trigger.ms": "5000",
             "client.id": "verifiable-consumer"} | dict(config or {})
    return VerifiableTool("org.apache.kafka.tools.VerifiableConsumer",
                          ["--bootstrap-server", bootstrap, "--topic", topic, "--group-id", group,
                           "--reset-policy", "earliest", "--verbose", "--session-timeout", "30000"],
                          workdir, props, "--consumer.config")


# ----------------------------------------------------------------------------- faults

def partition_leader(bootstrap: str, topic: str, partition: int, timeout_s: float = 10.0) -> int:
    """The partition's leader as the cluster reports it (-1 while none)."""
    from confluent_kafka.admin import AdminClient

    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=timeout_s)
    return int(meta.topics[topic].partitions[partition].leader)


def wait_for_leader(bootstrap: str, topic: str, partition: int, not_in: set[int],
                    timeout_s: float = 60.0) -> int:
    """Poll until the partition has a leader outside `not_in`; its id (AssertionError at the deadline)."""
    found: list[int] = []

    def elected() -> bool:
        try:
            leader = partition_leader(bootstrap, topic, partition)
        except Exception:  # a broker going away: ask again
            return False
        found[:] = [leader]
        return leader >= 0 and leader not in not_in

    wait_until(elected, timeout_s, f"a leader for {topic}-{partition} outside {not_in}")
    return found[0]


def wait_for_full_isr(bootstrap: str, topic: str, replicas: int, timeout_s: float = 90.0) -> None:
    """Poll until every partition's in-sync replica set is whole again (a restarted broker caught up):
    only then may another broker die without writes stopping at min.insync.replicas."""
    from confluent_kafka.admin import AdminClient

    def whole() -> bool:
        try:
            meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
        except Exception:  # a broker going away: ask again
            return False
        return all(len(p.isrs) == replicas for p in meta.topics[topic].partitions.values())

    wait_until(whole, timeout_s, f"{topic}: the in-sync replicas to recover")


@contextlib.contextmanager
def frozen(cluster: KafkaCluster, node_id: int) -> Iterator[None]:
    """SIGSTOP a broker (it hangs mid-request: sockets stay open, nothing is answered); SIGCONT on exit."""
    process = cluster.node(node_id).process
    assert process is not None and process.poll() is None, f"node {node_id} is not running"
    os.killpg(process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(process.pid, signal.SIGCONT)
