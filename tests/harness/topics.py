"""Uniquely named topics on a real cluster (what `topic_factory` in tests/conftest.py makes), for tests
and benchmarks alike."""

from __future__ import annotations

import uuid
from typing import Any

from tests.harness.wait import eventually

__all__ = ["create_topic", "metadata_with_leaders", "unique_name"]


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap: str, name: str, partitions: int = 1, replication: int = 1,
                 config: dict[str, str] | None = None) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, replication, config=config or {})],
                                  operation_timeout=30)
    futures[name].result(timeout=60)
    return name


def metadata_with_leaders(bootstrap: str, name: str, partitions: int) -> Any:
    """The topic's metadata once every partition has a leader in it. A new topic reaches each
    broker's metadata a little after CreateTopics returns (KRaft brokers follow the controller's
    log), so the broker that answers may not know it yet: ask again until it does."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})

    def complete(md: Any) -> bool:
        topic = md.topics.get(name)
        return (topic is not None and len(topic.partitions) == partitions
                and all(p.leader >= 0 for p in topic.partitions.values()))

    return eventually(lambda: admin.list_topics(name, timeout=10), complete, timeout_s=30)
