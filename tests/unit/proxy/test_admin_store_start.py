"""KafkaStore's start on a topic whose leader is not known yet (a narrow unit test over a fake
consumer; the store itself is proved against real Kafka in tests/integration/test_quota_admin.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from proxy.admin.store import KafkaStore, StoreError


class FlakyConsumer:
    """`get_watermark_offsets` fails with `error` `failures` times, then answers (0, 7)."""

    def __init__(self, error: int, failures: int) -> None:
        self.error, self.failures, self.calls = error, failures, 0

    def get_watermark_offsets(self, _tp: Any, timeout: float) -> tuple[int, int]:
        self.calls += 1
        if self.calls <= self.failures:
            raise KafkaException(KafkaError(self.error))
        return 0, 7


def store_with(consumer: FlakyConsumer) -> KafkaStore:
    store = object.__new__(KafkaStore)  # only what _end_offset reads
    store.topic, store._timeout_s, store._consumer = "quotas", 1.0, consumer
    return store


def test_a_leader_not_known_yet_is_retried_until_it_is() -> None:
    consumer = FlakyConsumer(KafkaError.NOT_LEADER_FOR_PARTITION, failures=2)
    assert store_with(consumer)._end_offset(0, time.monotonic() + 10) == 7
    assert consumer.calls == 3


def test_past_the_deadline_the_error_is_a_store_error_naming_the_topic() -> None:
    consumer = FlakyConsumer(KafkaError.LEADER_NOT_AVAILABLE, failures=1_000)
    with pytest.raises(StoreError, match="quota store topic quotas"):
        store_with(consumer)._end_offset(0, time.monotonic() + 0.5)


def test_an_error_that_is_not_transient_is_not_retried() -> None:
    consumer = FlakyConsumer(KafkaError.TOPIC_AUTHORIZATION_FAILED, failures=1)
    with pytest.raises(StoreError, match="quota store topic quotas"):
        store_with(consumer)._end_offset(0, time.monotonic() + 10)
    assert consumer.calls == 1
