"""Quota windows and a metered Sluice for the rate tests: the shortened window they all use (11 samples
of 500 ms; Kafka's `quota.window.size.seconds` is configurable the same way) and the periods rates
are judged over."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.harness.kafka import KafkaCluster, free_port
from tests.harness.metrics import Metrics
from tests.harness.sluice import SluiceProcess

KiB = 1024
MiB = 1024 * 1024
WINDOW = {"samples": 11, "size_ms": 500}
PERIOD_S = 11 * 0.5     # N x W: how often the windowed rate lets an over-quota client burst
RUN_S = 3 * PERIOD_S
WARMUP_S = 6.0          # past the first period


def quota_config(entries: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"quotas": {"window": WINDOW, "entries": entries, **extra}}


def start_sluice(kafka: KafkaCluster, tmp_path: Path, entries: list[dict[str, Any]],
                 **extra: Any) -> tuple[SluiceProcess, Metrics]:
    """Sluice in front of `kafka` with these quota entries and its metrics on a free port."""
    port = free_port()
    sluice = SluiceProcess(kafka.bootstrap, tmp_path / "sluice",
                           config={"metrics": {"port": port}, **quota_config(entries, **extra)}).start()
    return sluice, Metrics(port)
