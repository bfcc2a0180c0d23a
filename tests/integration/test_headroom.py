"""Headroom against a real broker through a real Sluice process (issue 14).

A librdkafka producer floods against a 256 KiB/s client-id quota while another client id is
idle. The quota window is 11 samples of 300 ms (3.3 s whole), so an idle sensor drains in 3.3 s.
`GET /quotas/usage`, `sluice_quota_headroom_ratio` and `sluice quotas describe --usage` (the CLI,
as a process) must tell the same story as enforcement: the held producer runs at its limit
(headroom ratio near 0 over a whole window, a little below: Kafka's rate of a held client
sits at or above the bound), the idle one has all of it (ratio 1), and the limit
shown is exactly `sluice_quota_limit`.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import create_topic, unique_name
from tests.harness import load
from tests.harness.kafka import REPO, KafkaCluster, free_port
from tests.harness.metrics import Metrics
from tests.harness.sluice import SluiceProcess
from tests.harness.wait import Sampler, eventually, wait_until

pytestmark = [pytest.mark.integration]

KiB = 1024
QUOTA = 256 * KiB
WINDOW_S = 11 * 0.3   # samples x size: the whole rate window
#: The held producer's mean headroom ratio over one whole window, sampled every 100 ms. Kafka's
#: windowed rate of a client that is always over its quota is at or *above* the bound most of the
#: time: while the oldest retained sample is younger than (N - 1) x W the window is padded to
#: (N - 1) x W plus the time into the current sample, so a throttle lowers the rate less than its
#: formula assumes and each admitted request adds to it, until old samples leave the window and
#: the rate drops (the sawtooth of test_quota_enforcement; docs/kafka-quota-semantics.md 2.3).
#: Measured here (16 KiB requests, one in flight): means of -0.11 to -0.14, single readings from
#: -0.25 to +0.85 (the drop). An idle client reads 1, one at half its
#: quota 0.5; the bounds below leave 0.1 of margin on the measured means.
HELD_MIN, HELD_MAX = -0.25, 0.1


def usage(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/quotas/usage", timeout=5) as r:
        doc: dict[str, Any] = json.loads(r.read())
    return doc


def entry(doc: dict[str, Any], client_id: str) -> dict[str, Any] | None:
    return next((e for e in doc["entries"] if e["client_id"] == client_id and e["kind"] == "produce"), None)


def test_held_producer_has_no_headroom_idle_one_all_and_describe_agrees_with_metrics(
        kafka: KafkaCluster, tmp_path: Path) -> None:
    port = free_port()
    sluice = SluiceProcess(kafka.bootstrap, tmp_path / "sluice", config={
        "metrics": {"port": port},
        "quotas": {"window": {"samples": 11, "size_ms": 300},
                   "entries": [{"client_id": "<default>", "producer_byte_rate": QUOTA}]}}).start()
    metrics = Metrics(port)
    stop = threading.Event()
    flood = threading.Thread()
    try:
        topic = create_topic(kafka.bootstrap, unique_name("headroom"))
        load.confluent_flood(sluice.bootstrap, topic, 1.0, client_id="idle", rate_bytes_per_s=20 * KiB,
                             record_size=1000)  # a trickle for a second, then nothing
        flood = threading.Thread(target=load.confluent_flood, args=(sluice.bootstrap, topic, 40.0),
                                 kwargs={"client_id": "flood", "batch_bytes": 16 * KiB, "stop": stop,
                                         "config": {"max.in.flight.requests.per.connection": 1}},
                                 daemon=True)
        flood.start()
        wait_until(lambda: (metrics.value("sluice_quota_throttled_requests_total", client_id="flood") or 0)
                   > 0, 15, "the flood to be throttled")

        def flood_ratios() -> tuple[float, float, float | None]:
            """(when, the ratio in /quotas/usage, sluice_quota_headroom_ratio)"""
            found = entry(usage(port), "flood")
            assert found is not None
            return (time.monotonic(), float(found["headroom_ratio"]),
                    metrics.value("sluice_quota_headroom_ratio", client_id="flood", kind="produce"))

        with Sampler(flood_ratios, interval_s=0.1) as sampler:
            wait_until(lambda: len(sampler.samples) > 1
                       and sampler.samples[-1][0] - sampler.samples[0][0] >= WINDOW_S, 10,
                       "a whole window of samples")
        ratios = [r for _, r, _ in sampler.samples]
        mean = statistics.fmean(ratios)
        assert HELD_MIN <= mean <= HELD_MAX, f"mean {mean:.3f} over {len(ratios)}: {ratios}"
        exported = [m for _, _, m in sampler.samples]
        assert None not in exported, exported
        mean = statistics.fmean(m for m in exported if m is not None)
        assert HELD_MIN <= mean <= HELD_MAX, f"metric mean {mean:.3f}: {exported}"

        # the idle client: its last trickle leaves the window within 3.3 s, then exactly 1
        idle = eventually(lambda: entry(usage(port), "idle"),
                          lambda e: e is not None and e["headroom_ratio"] == 1.0, timeout_s=10)
        assert idle is not None and idle["rate"] == 0.0 and idle["headroom"] == QUOTA, idle
        assert metrics.value("sluice_quota_headroom_ratio", client_id="idle", kind="produce") == 1.0

        # the CLI, as an operator runs it, reads the same process: limits are sluice_quota_limit's
        described = subprocess.run(
            [sys.executable, "-m", "proxy", "quotas", "describe", "--usage",
             "--url", f"http://127.0.0.1:{port}", "--names", "client-id=flood", "--output", "json"],
            cwd=REPO, capture_output=True, text=True, timeout=30, check=True)
        (row,) = json.loads(described.stdout)["entries"]
        assert (row["client_id"], row["unit"]) == ("flood", "bytes/s")
        limit_metric = metrics.value("sluice_quota_limit", client_id="flood", kind="produce",
                                     broker=row["broker"])
        assert row["limit"] == limit_metric == QUOTA
        assert row["headroom"] == pytest.approx(row["limit"] - row["rate"])
        assert row["headroom_ratio"] == pytest.approx(row["headroom"] / row["limit"])
        assert row["entity"] == {"client-id": None} and row["share"] == 1.0
        table = subprocess.run(
            [sys.executable, "-m", "proxy", "quotas", "describe", "--usage", "--url",
             f"http://127.0.0.1:{port}"],
            cwd=REPO, capture_output=True, text=True, timeout=30, check=True).stdout
        assert any(line.split()[3:5] == ["idle", "-"] and line.split()[8] == "1.000"
                   for line in table.splitlines()), table
    finally:
        stop.set()
        if flood.is_alive():
            flood.join(15)
        sluice.stop()
