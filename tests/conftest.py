"""Session-scoped real Kafka fixtures.

- `kafka`: one KRaft node with a PLAINTEXT listener and a SASL_PLAINTEXT listener (PLAIN,
  SCRAM-SHA-256, SCRAM-SHA-512; users from `tests.harness.kafka.DEFAULT_USERS`).
- `kafka_cluster3`: three KRaft nodes on loopback with a static controller quorum.
- `topic` / `topic_factory`: a fresh, uniquely named topic per test on the single node.

Set SLUICE_KAFKA_BOOTSTRAP to run the single-node tests against a cluster you already run.
When a test that used a broker fails, every node's last WARN and ERROR lines are attached to the report
(the whole logs stay under pytest's base temporary directory).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.kafka import KafkaCluster
from tests.harness.sluice import SluiceProcess
from tests.harness.tools import KafkaTools, sasl_properties
from tests.harness.wait import eventually

_CLUSTERS: list[KafkaCluster] = []


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka1"), 1, sasl=True)
    _CLUSTERS.append(cluster)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kafka_cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka3"), 3)
    _CLUSTERS.append(cluster)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kafka_tools(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> KafkaTools:
    return KafkaTools(kafka.bootstrap, workdir=tmp_path_factory.mktemp("tools"))


@pytest.fixture(scope="session")
def kafka_admin_tools(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> KafkaTools:
    """Kafka's tools over the SASL listener as the `admin` user."""
    return KafkaTools(kafka.sasl_bootstrap, sasl_properties("admin", "admin-secret"),
                      workdir=tmp_path_factory.mktemp("admin-tools"))


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


@pytest.fixture
def topic_factory(kafka: KafkaCluster, request: pytest.FixtureRequest) -> Callable[..., str]:
    base = request.node.name.split("[")[0].replace("_", "-")[:40]

    def make(partitions: int = 1, **config: str) -> str:
        return create_topic(kafka.bootstrap, unique_name(base), partitions, 1, config or None)

    return make


@pytest.fixture
def topic(topic_factory: Callable[..., str]) -> str:
    return topic_factory()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    names = getattr(item, "fixturenames", ())
    uses_kafka = any(name.startswith(("kafka", "sluice")) for name in names)
    if report.failed and report.when == "call":  # type: ignore[attr-defined]
        for name in names:
            proc = getattr(item, "funcargs", {}).get(name)
            if isinstance(proc, SluiceProcess):
                report.sections.append((f"{name} log", proc.log()[-8000:]))  # type: ignore[attr-defined]
    if report.failed and uses_kafka:  # type: ignore[attr-defined]
        for cluster in _CLUSTERS:
            if cluster.nodes:
                report.sections.append(  # type: ignore[attr-defined]
                    (f"kafka {cluster.root.name} logs", cluster.problems(20)))
    return report


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


if os.environ.get("SLUICE_KAFKA_BOOTSTRAP"):
    # Bring-your-own cluster: tests that only need "a broker" use it instead of starting one.
    class _External(KafkaCluster):
        def __init__(self, bootstrap: str) -> None:
            super().__init__(Path("/nonexistent"), 1)
            self._bootstrap = bootstrap

        @property
        def bootstrap(self) -> str:
            return self._bootstrap

    @pytest.fixture(scope="session")  # type: ignore[no-redef]
    def kafka() -> Iterator[KafkaCluster]:
        yield _External(os.environ["SLUICE_KAFKA_BOOTSTRAP"])


@pytest.fixture
def sluice(kafka: KafkaCluster, tmp_path: Path) -> Iterator[SluiceProcess]:
    """Sluice in front of the single-node cluster, as a real `python -m proxy proxy` process."""
    proc = SluiceProcess(kafka.bootstrap, tmp_path / "sluice").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def sluice3(kafka_cluster3: KafkaCluster, tmp_path: Path) -> Iterator[SluiceProcess]:
    """Sluice in front of the three-node cluster."""
    proc = SluiceProcess(kafka_cluster3.bootstrap, tmp_path / "sluice3").start()
    try:
        yield proc
    finally:
        proc.stop()
