"""Real Kafka and real Sluice for the benchmarks, started as the tests start them (`tests/harness/`):
KRaft nodes from the Maven-resolved jars, Sluice as `python -m proxy proxy` processes, Kafka's Java
tools, unique topics."""

from __future__ import annotations

from tests.harness.kafka import REPO, KafkaCluster, KafkaNode, _die_with_parent, free_port, java_command
from tests.harness.load import Timeline, WatermarkSampler, confluent_flood
from tests.harness.metrics import Metrics
from tests.harness.sluice import READY, SluiceProcess
from tests.harness.tools import KafkaTools, parse_producer_perf
from tests.harness.topics import create_topic, unique_name

die_with_parent = _die_with_parent  # for the child processes a benchmark starts itself

__all__ = ["READY", "REPO", "KafkaCluster", "KafkaNode", "KafkaTools", "Metrics", "SluiceProcess", "Timeline",
           "WatermarkSampler", "confluent_flood", "create_topic", "die_with_parent", "free_port",
           "java_command", "parse_producer_perf", "unique_name"]
