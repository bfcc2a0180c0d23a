"""Share-group members (KIP-932) as real clients: Kafka's Java `KafkaShareConsumer` (a small program,
`tests/share/ShareGroupMember.java`, run from the broker's Maven jars) and librdkafka's share
consumer (confluent-kafka >= 2.16, in a thread).

Both take at most 100 records a poll (the librdkafka one fewer if its `config` says so), accept and
commit every record explicitly and report it only once its acknowledgement succeeded. With
`leave_after` set, a member leaves on the batch that brings it to that many records: it accepts
the batch up to `leave_after` (all but its last record at most), reports the rest as held, and
closes, so the broker releases those to the rest of the group. It so leaves as soon as it has been
given at least `leave_after` records, however the broker splits them into batches
(`split_for_leaving`).
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.harness.kafka import REPO, _die_with_parent, java_command
from tests.harness.lines import read_lines
from tests.harness.wait import poll

SHARE_MEMBER_JAVA = REPO / "tests" / "share" / "ShareGroupMember.java"


@dataclass(frozen=True)
class Delivery:
    partition: int
    offset: int
    delivery_count: int
    value: str


@dataclass
class MemberLog:
    """What a member reported: records accepted (acknowledged), records held when it left."""

    accepted: list[Delivery] = field(default_factory=list)
    held: list[Delivery] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    throttle_max_ms: int | None = None
    ready: bool = False
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, line: str) -> None:
        kind, _, rest = line.partition(" ")
        with self.lock:
            if kind in ("acc", "held"):
                p, o, dc, value = rest.split(" ", 3)
                delivery = Delivery(int(p), int(o), int(dc), value)
                (self.accepted if kind == "acc" else self.held).append(delivery)
            elif kind == "ack-error":
                self.errors.append(rest)
            elif kind == "throttle-max":
                self.throttle_max_ms = int(rest)
            elif kind == "ready":
                self.ready = True
            elif kind == "closed":
                self.closed = True

    def count(self) -> int:
        with self.lock:
            return len(self.accepted)


class JavaShareMember:
    """`KafkaShareConsumer` in its own JVM."""

    def __init__(self, bootstrap: str, group: str, topic: str, client_id: str, leave_after: int = -1) -> None:
        cmd = java_command(str(SHARE_MEMBER_JAVA), bootstrap, group, topic, client_id, str(leave_after))
        self.log = MemberLog()
        self.output: list[str] = []
        self.process = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, preexec_fn=_die_with_parent)
        assert self.process.stdout is not None
        read_lines(self.process.stdout, self._line)

    def _line(self, line: str) -> None:
        self.output.append(line)
        if not line.startswith("["):  # log4j lines start with the date
            self.log.add(line.rstrip("\n"))

    def stop(self, timeout_s: float = 60.0) -> None:
        if self.process.poll() is None and self.process.stdin is not None:
            try:
                self.process.stdin.write("stop\n")
                self.process.stdin.flush()
            except BrokenPipeError:
                pass
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        if self.process.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()

    def wait_closed(self, timeout_s: float) -> bool:
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def tail(self, lines: int = 40) -> str:
        return "".join(self.output[-lines:])


class ConfluentShareMember:
    """librdkafka's share consumer (confluent-kafka's `ShareConsumer`) in a thread."""

    def __init__(self, bootstrap: str, group: str, topic: str, client_id: str, leave_after: int = -1,
                 config: dict[str, Any] | None = None) -> None:
        self.log = MemberLog()
        self._stop = threading.Event()
        self.failure: BaseException | None = None
        self._config = dict(config or {})  # over the defaults below (e.g. a smaller max.poll.records)
        self._args = (bootstrap, group, topic, client_id, leave_after)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._consume(*self._args)
        except BaseException as exc:  # reported by the test through `failure`
            self.failure = exc

    def _consume(self, bootstrap: str, group: str, topic: str, client_id: str, leave_after: int) -> None:
        from confluent_kafka import ShareConsumer

        consumer: Any = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group,
                                       "client.id": client_id, "share.acknowledgement.mode": "explicit",
                                       "max.poll.records": 100, **self._config})
        try:
            consumer.subscribe([topic])
            self.log.add("ready")
            while not self._stop.is_set():
                batch = [m for m in consumer.poll(0.5) if m.error() is None]
                if not batch:
                    continue
                take = split_for_leaving(self.log.count(), len(batch), leave_after)
                batch, held = batch[:take], batch[take:]
                if batch:
                    self._accept(consumer, batch)
                if held:
                    for m in held:
                        self.log.add(f"held {_describe(m)}")
                    break  # close without acknowledging them: the broker releases them to the group
        finally:
            consumer.close()
            self.log.add("closed")

    def _accept(self, consumer: Any, batch: list[Any]) -> None:
        for m in batch:
            consumer.acknowledge(m)
        result = consumer.commit_sync()
        failed = {tp.partition for tp, err in result.items() if err is not None}
        for tp, err in result.items():
            if err is not None:
                self.log.add(f"ack-error {tp} {err}")
        for m in batch:
            if m.partition() not in failed:
                self.log.add(f"acc {_describe(m)}")

    def stop(self, timeout_s: float = 60.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def wait_closed(self, timeout_s: float) -> bool:
        self._thread.join(timeout_s)
        return not self._thread.is_alive()


def split_for_leaving(accepted: int, batch_size: int, leave_after: int) -> int:
    """How many of the next batch a member accepts; it holds the rest and leaves when any are held.
    A member that leaves after `leave_after` records (`leave_after` < 0: never) takes the whole
    batch while that keeps it below the count; the batch that brings it to at least `leave_after`
    is split, with at least one record held, so a batch ending exactly at the count does not make
    the member wait for another."""
    if leave_after < 0 or accepted + batch_size < leave_after:
        return batch_size
    return max(0, min(leave_after - accepted, batch_size - 1))


def _describe(message: Any) -> str:
    count = message.delivery_count() if hasattr(message, "delivery_count") else -1
    value = message.value().decode() if message.value() is not None else ""
    return f"{message.partition()} {message.offset()} {count if count is not None else -1} {value}"


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    return poll(condition, timeout_s)
