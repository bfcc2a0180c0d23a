"""Real Kafka and real Sluice for the benchmarks, started as the tests start them (`tests/harness/`):
KRaft nodes from the Maven-resolved jars, Sluice as `python -m proxy proxy` processes, Kafka's Java
tools, unique topics."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path

from tests.harness.kafka import (
    REPO,
    KafkaCluster,
    KafkaNode,
    RunningCluster,
    _die_with_parent,
    free_port,
    java_command,
)
from tests.harness.load import Timeline, WatermarkSampler, confluent_flood
from tests.harness.metrics import Metrics
from tests.harness.sluice import READY, SluiceProcess
from tests.harness.tools import KafkaTools, parse_producer_perf
from tests.harness.topics import create_topic, unique_name

die_with_parent = _die_with_parent  # for the child processes a benchmark starts itself


@contextlib.contextmanager
def kafka_cluster(workdir: Path, bootstrap: str | None = None, nodes: int = 1,
                  broker_properties: Mapping[str, str] | None = None) -> Iterator[KafkaCluster]:
    """The cluster at `bootstrap` when given (the benchmark uses unique topics and its own client ids
    there), else a new one under `workdir`, stopped on exit."""
    if bootstrap is not None:
        yield RunningCluster(bootstrap)
        return
    cluster = KafkaCluster(workdir / "kafka", nodes, broker_properties=dict(broker_properties or {}),
                           quick_start=False)  # a benchmark's own broker runs on the full JIT
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()

__all__ = ["READY", "REPO", "KafkaCluster", "KafkaNode", "KafkaTools", "Metrics", "RunningCluster",
           "SluiceProcess", "Timeline", "WatermarkSampler", "confluent_flood", "create_topic",
           "die_with_parent", "free_port", "java_command", "kafka_cluster", "parse_producer_perf",
           "unique_name"]
