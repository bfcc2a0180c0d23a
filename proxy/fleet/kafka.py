"""Usage reports over a Kafka topic (the `fleet:` section): Pulsar's resource-group pattern with
Kafka as the channel.

One partition, so every member reads every report in one order; time-based retention (a report is
worth one interval, so nothing needs compaction). Each member produces with acks=1 and no retries
(a lost report is replaced by the next one) and reads, from one silence period back (so a member
that joins hears the fleet at once), with a consumer that never joins a group. A background thread
polls the consumer; `drain` hands over what arrived. The channel counts as down when a produce
fails or when nothing, not even this member's own report, has come back for `silence_ms`; it is
then retried in the background (reconnecting at least every third of `silence_ms`, so the members
come back together) and comes back by itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from proxy.fleet.exchange import ExchangeError, Inbox

log = logging.getLogger("sluice.fleet")


class KafkaExchange(Inbox):
    def __init__(self, bootstrap: str, topic: str, *, member: str, silence_ms: int,
                 retention_ms: int = 60_000, replication_factor: int = -1,
                 kafka_config: Mapping[str, str] | None = None, setup_timeout_s: float = 5.0) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self._member = member
        self._silence_s = silence_ms / 1000
        self._retention_ms = retention_ms
        self._replication_factor = replication_factor
        # librdkafka backs off reconnecting up to 10 s by default: after the exchange's broker
        # returns, one member could then come back seconds after the others, which would time it
        # out (member_timeout_ms after their own return) and take its share. Retrying at least
        # every third of the silence period brings every member back within it.
        backoff_ms = str(max(100, silence_ms // 3))
        self._common = {"bootstrap.servers": bootstrap, "reconnect.backoff.ms": "100",
                        "reconnect.backoff.max.ms": backoff_ms, **(kafka_config or {})}
        self._setup_timeout_s = setup_timeout_s
        super().__init__()
        self._last_received = 0.0
        self._last_produce_error = 0.0
        self._ready = threading.Event()
        self._closed = threading.Event()
        self._producer: Any = None
        self._consumer: Any = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ Exchange

    def start(self) -> None:
        """Start the background thread; it sets the topic up (and retries until it can)."""
        try:
            import confluent_kafka  # noqa: F401
        except ImportError:
            raise ExchangeError("fleet: the Kafka exchange needs confluent-kafka "
                                "(pip install confluent-kafka)") from None
        self._thread = threading.Thread(target=self._run, name="fleet-exchange", daemon=True)
        self._thread.start()

    def publish(self, payload: bytes) -> None:
        if not self._ready.is_set():
            return
        try:
            self._producer.produce(self.topic, value=payload, key=self._member.encode(),
                                   on_delivery=self._delivered)
            self._producer.poll(0)
        except Exception as exc:  # BufferError, KafkaException: never let a report hurt the proxy
            self._failed(f"cannot publish a usage report: {exc}")


    @property
    def connected(self) -> bool:
        now = time.monotonic()
        return (self._ready.is_set() and now - self._last_received <= self._silence_s
                and now - self._last_produce_error > self._silence_s)

    def describe(self) -> str:
        return f"kafka topic {self.topic} on {self.bootstrap}"

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._producer is not None:
            self._producer.flush(1)

    # ------------------------------------------------------------------ internals

    def _failed(self, why: str) -> None:
        self._errors += 1
        self._last_produce_error = time.monotonic()
        log.debug("fleet exchange: %s", why)

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self._failed(f"usage report not delivered: {err}")

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                self._setup()
                break
            except Exception as exc:
                self._errors += 1
                log.warning("fleet exchange %s unreachable (%s); retrying", self.describe(), exc)
                self._closed.wait(min(5.0, max(1.0, self._silence_s)))
        if self._closed.is_set():
            return
        self._ready.set()
        log.info("fleet exchange: %s", self.describe())
        while not self._closed.is_set():
            try:
                msg = self._consumer.poll(0.1)
            except Exception as exc:
                self._errors += 1
                log.debug("fleet exchange consumer: %s", exc)
                continue
            if msg is None:
                continue
            if msg.error() is not None:
                self._errors += 1
                log.debug("fleet exchange consumer: %s", msg.error())
                continue
            value = msg.value()
            if value is None:
                continue
            self._last_received = time.monotonic()
            self._inbox.append(value)
        self._consumer.close()

    def _setup(self) -> None:
        from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, Producer, TopicPartition
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient({**self._common, "socket.timeout.ms": 3000})
        metadata = admin.list_topics(timeout=self._setup_timeout_s)
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None:
            futures = admin.create_topics(
                [NewTopic(self.topic, num_partitions=1, replication_factor=self._replication_factor,
                          config={"cleanup.policy": "delete", "retention.ms": str(self._retention_ms)})],
                operation_timeout=self._setup_timeout_s)
            try:
                futures[self.topic].result(timeout=self._setup_timeout_s)
                log.info("created the fleet topic %s (1 partition, retention %d ms)", self.topic,
                         self._retention_ms)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
        client_id = f"sluice-fleet-{self._member}"
        self._producer = Producer({**self._common, "acks": 1, "linger.ms": 0, "retries": 0,
                                   "message.timeout.ms": max(1000, int(self._silence_s * 1000)),
                                   "client.id": client_id})
        self._consumer = Consumer({**self._common, "group.id": f"sluice-fleet-{self._member}",
                                   "enable.auto.commit": False, "enable.partition.eof": False,
                                   "fetch.wait.max.ms": 50, "fetch.error.backoff.ms": 100,
                                   "client.id": client_id})
        # start one silence period back, not at the end: a member that (re)joins reads every live
        # member's latest report in its first round instead of one interval later
        since_ms = int(time.time() * 1000 - self._silence_s * 1000)
        try:
            (found,) = self._consumer.offsets_for_times([TopicPartition(self.topic, 0, since_ms)],
                                                        timeout=self._setup_timeout_s)
            start = found.offset if found.error is None and found.offset >= 0 else OFFSET_END
        except KafkaException:
            start = OFFSET_END
        self._consumer.assign([TopicPartition(self.topic, 0, start)])
        self._last_received = time.monotonic()  # give our first report time to come back
