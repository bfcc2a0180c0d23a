"""`make demo`: a local Kafka, a client using it, and (as Sluice grows) throttling to look at.

Starts a single-node Kafka 4.x from the Maven classpath, produces and consumes through it with
librdkafka, prints what happened, and stops everything again.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from tests.conftest import create_topic
from tests.harness import clients
from tests.harness.kafka import KafkaCluster, kafka_version


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="sluice-demo-"))
    print(f"== starting Apache Kafka {kafka_version()} (KRaft, one node) from Maven Central jars")
    with KafkaCluster(root, 1) as kafka:
        print(f"   broker up in {kafka.start_seconds:.1f}s at {kafka.bootstrap}")
        topic = create_topic(kafka.bootstrap, "demo")
        sent = clients.values(10_000, "demo")
        t0 = time.monotonic()
        clients.confluent_produce(kafka.bootstrap, topic, sent)
        got = clients.confluent_consume(kafka.bootstrap, topic, len(sent))
        dt = time.monotonic() - t0
        print(f"== confluent-kafka produced and consumed {len(got)} records in {dt:.2f}s")
        if got != sent:
            print("!! consumed records differ from produced ones", file=sys.stderr)
            return 1
    print("== stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
