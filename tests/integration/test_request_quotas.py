"""Request quotas and per-entry shadow against a real broker (issue 14).

* `request_rate`: a producer sending one small record per request (librdkafka, linger 0, one
  request in flight) is held to its requests/s over whole throttle periods.
* `request_percentage`: a client whose requests keep the upstream busy (back-to-back produce
  round trips, far over 1 % of one thread) is throttled on that quota, and its measured upstream
  time is brought down to the limit.
* per-entry `shadow`: a shadowed flood is counted (would-throttle) and not throttled, while its
  non-shadowed neighbour with the same quota is held to it.

The quota window is 11 x 500 ms (`test_quota_enforcement.WINDOW`).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.harness import load
from tests.harness.kafka import KafkaCluster
from tests.harness.quotas import RUN_S, WARMUP_S, start_sluice

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KiB = 1024
ONE_PER_REQUEST = {"linger.ms": 0, "max.in.flight.requests.per.connection": 1, "acks": 1}


def test_request_rate_holds_a_client_to_its_requests_per_second(kafka: KafkaCluster, topic: str,
                                                                 tmp_path: Path) -> None:
    limit = 40  # requests/s; unthrottled this client sends hundreds
    record = 100
    sluice, metrics = start_sluice(kafka, tmp_path, [{"client_id": "<default>", "request_rate": limit}])
    try:
        # batch.size below one record: every Produce request carries exactly one record
        timeline = load.confluent_flood(sluice.bootstrap, topic, RUN_S, record_size=record,
                                        client_id="chatty", batch_bytes=record, config=ONE_PER_REQUEST)
        per_s = timeline.rate(0, RUN_S) / record  # records/s = produce requests/s
        # Kafka's windowed rate over three whole periods; Metadata requests count too
        assert 0.5 * limit <= per_s <= 1.2 * limit, f"{per_s:.1f} requests/s against {limit}"
        throttled = metrics.value("sluice_quota_throttled_requests_total",
                                  client_id="chatty", kind="request_rate")
        assert throttled is not None and throttled > 0
        assert metrics.value("sluice_quota_limit", client_id="chatty", kind="request_rate") == limit
    finally:
        sluice.stop()


def test_request_percentage_trips_on_a_client_that_keeps_the_upstream_busy(kafka: KafkaCluster, topic: str,
                                                                          tmp_path: Path) -> None:
    limit = 1.0  # percent of one thread: 5 ms of upstream time per 500 ms sample
    sluice, metrics = start_sluice(kafka, tmp_path, [{"client_id": "<default>", "request_percentage": limit}])
    try:
        samples: list[float] = []
        stop = threading.Event()

        started = time.monotonic()

        def sample() -> None:  # every 0.5 s; what is read during the first period is not judged
            while not stop.is_set():
                value = metrics.value("sluice_quota_request_percentage", client_id="busy")
                if value is not None and time.monotonic() - started >= WARMUP_S:
                    samples.append(value)
                stop.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        load.confluent_flood(sluice.bootstrap, topic, WARMUP_S + RUN_S, record_size=1000,
                             client_id="busy", batch_bytes=1000, config=ONE_PER_REQUEST)
        stop.set()
        sampler.join(10)
        throttled = metrics.value("sluice_quota_throttled_requests_total", client_id="busy",
                                  kind="request_percentage")
        assert throttled is not None and throttled > 0, "request_percentage never throttled"
        assert metrics.value("sluice_quota_limit", client_id="busy", kind="request_percentage") == limit
        # held: past the first period the windowed upstream time stays near the limit (a throttled
        # client bursts once per period, so a sample may exceed it; the mean over the run does not
        # by much)
        assert samples, "no request_percentage samples"
        mean = sum(samples) / len(samples)
        assert mean <= 2.0 * limit, (mean, samples)
    finally:
        sluice.stop()


def test_per_entry_shadow_counts_a_flood_without_throttling_it(kafka: KafkaCluster, topic: str,
                                                                tmp_path: Path) -> None:
    quota = 128 * KiB
    sluice, metrics = start_sluice(kafka, tmp_path, [
        {"client_id": "shadowed", "producer_byte_rate": quota, "shadow": True},
        {"client_id": "enforced", "producer_byte_rate": quota}])
    try:
        results: dict[str, load.Timeline] = {}

        def run(name: str) -> None:
            results[name] = load.confluent_flood(sluice.bootstrap, topic, WARMUP_S + RUN_S,
                                                 client_id=name, batch_bytes=16 * KiB)

        threads = [threading.Thread(target=run, args=(n,)) for n in ("shadowed", "enforced")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        shadowed = results["shadowed"].rate(WARMUP_S, WARMUP_S + RUN_S)
        enforced = results["enforced"].rate(WARMUP_S, WARMUP_S + RUN_S)
        assert shadowed > 3 * quota, f"the shadowed flood was held back: {shadowed / quota:.2f} x quota"
        assert enforced <= 1.15 * quota, f"the neighbour was not held: {enforced / quota:.2f} x quota"
        would = metrics.value("sluice_quota_shadow_would_throttle_total",
                              client_id="shadowed", kind="produce")
        assert would is not None and would > 0  # counted
        assert not metrics.value("sluice_quota_throttled_requests_total",
                                 client_id="shadowed", kind="produce")
        enforced_throttled = metrics.value("sluice_quota_throttled_requests_total", client_id="enforced",
                                           kind="produce")
        assert enforced_throttled is not None and enforced_throttled > 0
        assert not metrics.value("sluice_quota_shadow_would_throttle_total",
                                 client_id="enforced", kind="produce")
    finally:
        sluice.stop()
