"""Small produce/consume helpers for each real client the tests use.

Each helper produces a list of values and reads them back, so a test can assert that exactly what
was produced was consumed. They take a bootstrap address, so the same helper proves a broker
directly and, later, the same broker through Sluice.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

DEFAULT_TIMEOUT_S = 60.0


def values(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}-{i:06d}".encode() for i in range(n)]


# --------------------------------------------------------------------------- confluent-kafka

def produce_when_queued(producer: Any, topic: str, value: bytes, on_delivery: Any,
                        poll_s: float = 0.1) -> None:
    """`producer.produce(topic, value)`, serving delivery reports for up to `poll_s` at a time while
    librdkafka's local queue is full (BufferError) until the record is queued."""
    while True:
        try:
            producer.produce(topic, value, on_delivery=on_delivery)
            return
        except BufferError:
            producer.poll(poll_s)


def confluent_produce(bootstrap: str, topic: str, payloads: Sequence[bytes],
                      config: Mapping[str, object] | None = None) -> None:
    from confluent_kafka import Producer

    errors: list[str] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **(config or {})})

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    for p in payloads:
        produce_when_queued(producer, topic, p, on_delivery)
    remaining = producer.flush(DEFAULT_TIMEOUT_S)
    assert remaining == 0, f"{remaining} messages not delivered"
    assert not errors, errors[:5]


def confluent_consume(bootstrap: str, topic: str, count: int, group: str | None = None,
                      config: Mapping[str, object] | None = None,
                      timeout_s: float = DEFAULT_TIMEOUT_S) -> list[bytes]:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group or f"g-{topic}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         **(config or {})})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append(msg.value())
    finally:
        consumer.close()
    return got


# --------------------------------------------------------------------------- kafka-python

def kafka_python_produce(bootstrap: str, topic: str, payloads: Sequence[bytes],
                         **config: object) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, **config)
    futures = [producer.send(topic, p) for p in payloads]
    producer.flush(timeout=DEFAULT_TIMEOUT_S)
    for f in futures:
        f.get(timeout=DEFAULT_TIMEOUT_S)
    producer.close()


def kafka_python_consume(bootstrap: str, topic: str, count: int, group: str | None = None,
                         timeout_s: float = DEFAULT_TIMEOUT_S, **config: object) -> list[bytes]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group or f"g-{topic}",
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             consumer_timeout_ms=int(timeout_s * 1000), **config)
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        for msg in consumer:
            got.append(msg.value)
            if len(got) >= count or time.monotonic() > deadline:
                break
    finally:
        consumer.close()
    return got


# --------------------------------------------------------------------------- aiokafka

async def aiokafka_produce(bootstrap: str, topic: str, payloads: Sequence[bytes],
                           **config: object) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **config)
    await producer.start()
    try:
        batch = [await producer.send(topic, p) for p in payloads]
        await asyncio.gather(*batch)
    finally:
        await producer.stop()


async def aiokafka_consume(bootstrap: str, topic: str, count: int, group: str | None = None,
                           timeout_s: float = DEFAULT_TIMEOUT_S, **config: object) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group or f"g-{topic}",
                                auto_offset_reset="earliest", enable_auto_commit=False, **config)
    await consumer.start()
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < count and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                got.extend(r.value for r in records if r.value is not None)
    finally:
        await consumer.stop()
    return got


# --------------------------------------------------------------------------- kcat (librdkafka CLI)

def kcat(bootstrap: str, *args: str, stdin: bytes | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
         config: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    cmd = ["kcat", "-b", bootstrap]
    for k, v in (config or {}).items():
        cmd += ["-X", f"{k}={v}"]
    return subprocess.run([*cmd, *args], input=stdin, capture_output=True, timeout=timeout_s,
                          check=False)


def kcat_produce(bootstrap: str, topic: str, payloads: Sequence[bytes],
                 config: Mapping[str, str] | None = None) -> None:
    done = kcat(bootstrap, "-P", "-t", topic, stdin=b"\n".join(payloads) + b"\n", config=config)
    assert done.returncode == 0, done.stderr.decode(errors="replace")


def kcat_consume(bootstrap: str, topic: str, count: int,
                 config: Mapping[str, str] | None = None) -> list[bytes]:
    done = kcat(bootstrap, "-C", "-t", topic, "-o", "beginning", "-c", str(count), "-e", config=config)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return [line for line in done.stdout.split(b"\n") if line]
