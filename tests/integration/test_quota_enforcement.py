"""Quotas hold against real clients and a real broker, through a real Sluice process.

The quota window is shortened to 11 samples of 500 ms (Kafka's `quota.window.size.seconds` is
configurable the same way). Kafka's windowed rate makes a client that is always over its quota
move in a sawtooth: a burst whenever old samples leave the window (every N x W = 5.5 s here),
then one request per throttle delay. So rates are measured from the start over three whole
periods (16.5 s), from what the broker acknowledged (producers) or what the consumer received,
and requests are kept small next to the quota (a 1 MiB batch against 256 KiB/s is all or
nothing within seconds).

librdkafka ignores throttle_time_ms (it does no KIP-219 back-off), so the confluent-kafka cases
prove that muting the channel holds a client back on its own.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import create_topic, unique_name
from tests.harness import clients, load
from tests.harness.fleet import group_rate
from tests.harness.kafka import KafkaCluster, free_port
from tests.harness.metrics import Metrics
from tests.harness.quotas import (
    PERIOD_S,
    RUN_S,
    WARMUP_S,
    KiB,
    MiB,
    quota_config,
    start_sluice,
)
from tests.harness.sluice import SluiceProcess
from tests.harness.tools import KafkaTools

pytestmark = [pytest.mark.integration, pytest.mark.slow]

@pytest.fixture
def throttling_sluice(kafka: KafkaCluster, tmp_path: Path, request: pytest.FixtureRequest
                      ) -> Iterator[tuple[SluiceProcess, Metrics]]:
    entries = request.param if hasattr(request, "param") else []
    port = free_port()
    sluice = SluiceProcess(kafka.bootstrap, tmp_path / "sluice",
                           config={"metrics": {"port": port}, **quota_config(entries)}).start()
    try:
        yield sluice, Metrics(port)
    finally:
        sluice.stop()


# ----------------------------------------------------------------------------- producers

# The top case is 16 MiB/s: at 32 MiB/s this test measured the machine, not Sluice. Within the
# whole suite on 2 cores it reached 0.766 x (24.5 MiB/s) with a 1 MiB client queue: librdkafka can
# have no more than its queue in flight, and 1 MiB over a loaded round trip of ~40 ms is ~25 MiB/s.
# The client's queue is now half a second of the quota (16 MiB/s: 8 MiB), and 32 MiB/s is measured
# beside the broker's own enforcement in `bench/bench_fidelity.py`, off the suite's load.
@pytest.mark.parametrize("quota", [256 * KiB, 1 * MiB, 8 * MiB, 16 * MiB],
                         ids=["256KiB", "1MiB", "8MiB", "16MiB"])
def test_librdkafka_producer_holds_its_quota(kafka: KafkaCluster, tmp_path: Path, quota: int) -> None:
    sluice, metrics = start_sluice(kafka, tmp_path, [{"client_id": "<default>", "producer_byte_rate": quota}])
    try:
        topic = create_topic(kafka.bootstrap, unique_name("qp"))
        batch_bytes = min(256 * KiB, quota // 8)
        queue_kbytes = max(4 * batch_bytes // 1024, quota // 2048)  # 4 batches, or 0.5 s of quota
        timeline = load.confluent_flood(sluice.bootstrap, topic, RUN_S, record_size=1000,
                                        client_id="ck-flood", batch_bytes=batch_bytes,
                                        config={"queue.buffering.max.kbytes": queue_kbytes})
        achieved = timeline.rate(0, RUN_S)
        # record bytes are a little less than request bytes (headers, batch overhead)
        assert 0.85 * quota <= achieved <= 1.15 * quota, f"{achieved / quota:.3f} x quota"
        throttled = metrics.value("sluice_quota_throttled_requests_total",
                                  client_id="ck-flood", kind="produce")
        assert throttled is not None and throttled > 0
        assert metrics.value("sluice_quota_limit", client_id="ck-flood", kind="produce") == quota
    finally:
        sluice.stop()


@pytest.mark.parametrize("quota", [256 * KiB, 8 * MiB], ids=["256KiB", "8MiB"])
def test_java_producer_holds_its_quota(kafka: KafkaCluster, tmp_path: Path, quota: int) -> None:
    sluice, _ = start_sluice(kafka, tmp_path, [{"client_id": "<default>", "producer_byte_rate": quota}])
    try:
        topic = create_topic(kafka.bootstrap, unique_name("qj"))
        tools = KafkaTools(sluice.bootstrap, workdir=tmp_path)
        # the perf tool's 5 s reports do not line up with the window: measure the log's growth
        # on the broker over three whole periods from the first append instead
        with load.WatermarkSampler(kafka.bootstrap, topic) as sampler:
            # batches sized for the rate, as the librdkafka test does: with Java's default 16 KiB
            # batches and 5 requests in flight (80 KiB a round trip) an 8 MiB/s flood needs a
            # round trip under 10 ms, and at load 14-24 the 8 MiB/s case reached only 0.60-0.65 x
            # the quota over whole cycles; 256 KiB batches (1.25 MiB a round trip) need one under
            # 150 ms, so the rate measured is Sluice's enforcement, not the producer's round trips
            tools.producer_perf(topic, int(quota * (RUN_S + PERIOD_S) / 1000), 1000,
                                props={"acks": "1", "client.id": "java-flood",
                                       "batch.size": str(min(256 * KiB, quota // 8)), "linger.ms": "20"})
        # over whole throttle cycles: Java waits out each throttle besides Sluice's mute, so under
        # load the periods stretch and a fixed span of three periods holds fewer bursts
        achieved = sampler.timeline(1000).cycle_rate(0, RUN_S + PERIOD_S, or_plain=True)
        records, span_s = sampler.records_between(0, RUN_S)
        print(f"java producer: {achieved / quota:.3f} x quota over whole cycles "
              f"({records * 1000 / span_s / quota:.3f} x over the first {span_s:.1f} s)")
        assert 0.85 * quota <= achieved <= 1.15 * quota, f"{achieved / quota:.3f} x quota"
    finally:
        sluice.stop()


def test_under_quota_client_keeps_its_throughput_next_to_a_flooder(kafka: KafkaCluster,
                                                                  tmp_path: Path) -> None:
    sluice, _ = start_sluice(kafka, tmp_path, [{"client_id": "<default>", "producer_byte_rate": 1 * MiB}])
    try:
        topic = create_topic(kafka.bootstrap, unique_name("fair"))
        results: dict[str, load.Timeline] = {}
        seconds = RUN_S

        def run(name: str, pace: float | None) -> None:
            results[name] = load.confluent_flood(sluice.bootstrap, topic, seconds, client_id=name,
                                                 rate_bytes_per_s=pace, batch_bytes=64 * KiB)

        polite = threading.Thread(target=run, args=("polite", 300 * KiB))
        flood = threading.Thread(target=run, args=("flood", None))
        polite.start()
        flood.start()
        polite.join(60)
        flood.join(60)
        assert results["polite"].rate(0, RUN_S) >= 0.95 * 300 * KiB    # unharmed
        assert results["flood"].rate(0, RUN_S) <= 1.15 * MiB           # held at its quota
    finally:
        sluice.stop()


# ----------------------------------------------------------------------------- consumers

def fill(kafka: KafkaCluster, topic: str, nbytes: int, record_size: int = 1000,
         batch_bytes: int = 16 * KiB) -> list[bytes]:
    """Pre-fill a topic directly. Small batches: a broker returns a whole first batch whatever
    the fetch size limit (KIP-74), so batch size bounds the size of each fetch response."""
    values = [f"{i:08d}".encode().ljust(record_size, b".") for i in range(nbytes // record_size)]
    clients.confluent_produce(kafka.bootstrap, topic, values, {"linger.ms": 20, "batch.size": batch_bytes})
    return values


@pytest.mark.parametrize("quota", [256 * KiB, 8 * MiB], ids=["256KiB", "8MiB"])
def test_librdkafka_consumer_holds_its_quota_and_loses_nothing(kafka: KafkaCluster, tmp_path: Path,
                                                              quota: int) -> None:
    sluice, metrics = start_sluice(kafka, tmp_path,
                                   [{"client_id": "<default>", "consumer_byte_rate": quota}])
    try:
        topic = create_topic(kafka.bootstrap, unique_name("qc"))
        produced = fill(kafka, topic, int(quota * 24), batch_bytes=min(256 * KiB, quota // 16))
        got: list[bytes] = []
        chunk = str(min(1 * MiB, quota // 8))
        timeline = load.confluent_drain(sluice.bootstrap, topic, RUN_S + 5, client_id="ck-drain",
                                        group=unique_name("g"), keep=got,
                                        config={"fetch.max.bytes": chunk, "max.partition.fetch.bytes": chunk,
                                                "message.max.bytes": chunk})
        achieved = timeline.rate_from_first(RUN_S)  # the group join does not count
        assert 0.85 * quota <= achieved <= 1.15 * quota, f"{achieved / quota:.3f} x quota"
        # throttled fetches were answered empty and fetched again: what arrived is an exact prefix
        assert got == produced[:len(got)]
        assert metrics.value("sluice_quota_throttled_requests_total", client_id="ck-drain", kind="fetch")
    finally:
        sluice.stop()


def test_java_consumer_holds_its_quota(kafka: KafkaCluster, tmp_path: Path) -> None:
    """Kafka's ConsumerPerformance through Sluice, judged on its progress reports (every 250 ms),
    not on the tool's own MB/sec: that one divides by the whole run, the group join included, so it
    measured the join's length as much as the quota (1.203-1.205 x in two loaded runs whose joins
    were short). A fresh sensor lets a client take about (N - 1) x W = 5 s of quota at once (the
    windowed rate of a new sensor is over at least that), so the first period is left out and the
    rate is judged over the rest: at least two whole periods of being held, where one period's
    burst moves the rate by a few per cent, and a fetch (1/8 of the quota) by about 2 %."""
    quota = 1 * MiB
    sluice, _ = start_sluice(kafka, tmp_path, [{"client_id": "<default>", "consumer_byte_rate": quota}])
    try:
        topic = create_topic(kafka.bootstrap, unique_name("qjc"))
        # the burst (about 5 MiB), the rest of the first period and two more, and 2 s to spare
        records = int(quota * (5 + 3 * PERIOD_S + 2) / 1000)
        fill(kafka, topic, records * 1000)
        tools = KafkaTools(sluice.bootstrap, workdir=tmp_path)
        chunk = str(quota // 8)
        progress = tools.consumer_perf_progress(topic, records, group=unique_name("jg"), timeout_ms=60000,
                                                interval_ms=250,
                                                props={"client.id": "java-drain", "fetch.max.bytes": chunk,
                                                       "max.partition.fetch.bytes": chunk})
        # the tool reports while it polls, so its last report can come a throttle delay or two
        # before its last record (22.0 of 23.5 MiB were seen)
        consumed_mib = progress[-1][1]
        assert consumed_mib >= 0.9 * records * 1000 / MiB, (consumed_mib, records)
        achieved, span_s = group_rate([progress], PERIOD_S)
        print(f"java consumer: {achieved / quota:.3f} x quota over {span_s:.1f} s")
        assert span_s >= 2 * PERIOD_S, span_s
        assert 0.85 * quota <= achieved <= 1.15 * quota, f"{achieved / quota:.3f} x quota over {span_s:.1f} s"
    finally:
        sluice.stop()


# ----------------------------------------------------------------------------- end to end

def test_consumed_equals_produced_under_throttling(kafka: KafkaCluster, tmp_path: Path) -> None:
    sluice, metrics = start_sluice(kafka, tmp_path, [
        {"client_id": "<default>", "producer_byte_rate": 512 * KiB, "consumer_byte_rate": 512 * KiB}])
    try:
        topic = create_topic(sluice.bootstrap, unique_name("e2e"), partitions=2)
        sent = [f"e2e-{i:06d}".encode().ljust(400, b"-") for i in range(8000)]   # ~3.2 MB
        clients.confluent_produce(sluice.bootstrap, topic, sent, {"client.id": "e2e-p"})
        got = clients.confluent_consume(sluice.bootstrap, topic, len(sent), config={"client.id": "e2e-c"},
                                        timeout_s=60)
        assert sorted(got) == sorted(sent) and len(got) == len(sent)
        # ~3.2 MB each way at 512 KiB/s: both sides were throttled, so the equality held under throttling
        produced = metrics.value("sluice_quota_throttled_requests_total", client_id="e2e-p", kind="produce")
        fetched = metrics.value("sluice_quota_throttled_requests_total", client_id="e2e-c", kind="fetch")
        assert produced is not None and produced > 0, "the producer was never throttled"
        assert fetched is not None and fetched > 0, "the consumer was never throttled"
    finally:
        sluice.stop()


def test_shadow_mode_measures_without_throttling(kafka: KafkaCluster, tmp_path: Path) -> None:
    quota = 256 * KiB
    sluice, metrics = start_sluice(kafka, tmp_path, [{"client_id": "<default>", "producer_byte_rate": quota}],
                                   shadow=True)
    try:
        topic = create_topic(kafka.bootstrap, unique_name("shadow"))
        timeline = load.confluent_flood(sluice.bootstrap, topic, WARMUP_S + 3, client_id="shadowed",
                                        batch_bytes=32 * KiB)
        assert timeline.rate(WARMUP_S) > 4 * quota                      # nothing was held back
        would = metrics.value("sluice_quota_shadow_would_throttle_total",
                              client_id="shadowed", kind="produce")
        assert would is not None and would > 0
        assert metrics.value("sluice_quota_throttled_requests_total",
                             client_id="shadowed", kind="produce") is None
        assert metrics.value("sluice_quota_violations_total", kind="produce", mode="shadow")
    finally:
        sluice.stop()


def test_sighup_reloads_quotas_without_dropping_connections(kafka: KafkaCluster, tmp_path: Path) -> None:
    sluice, metrics = start_sluice(kafka, tmp_path,
                                   [{"client_id": "<default>", "producer_byte_rate": 256 * KiB}])
    try:
        topic = create_topic(kafka.bootstrap, unique_name("hup"))
        stop = threading.Event()
        timeline = load.Timeline()
        worker = threading.Thread(target=lambda: load.confluent_flood(
            sluice.bootstrap, topic, 60, client_id="hup", stop=stop, batch_bytes=32 * KiB,
            timeline=timeline))

        worker.start()
        load.load_until(timeline, timeline.started + 2 * PERIOD_S)  # the slow window is covered
        before_connections = metrics.value("sluice_open_connections", listener="broker 1")
        config = yaml.safe_load(sluice.config_path.read_text())
        config["quotas"]["entries"][0]["producer_byte_rate"] = 2 * MiB
        sluice.config_path.write_text(yaml.safe_dump(config))
        reload_at = time.monotonic()
        sluice.signal(signal.SIGHUP)
        load.load_until(timeline, reload_at + 8)  # and the fast one
        # read while the producer is still connected: once it returns, librdkafka closes its
        # connections whenever the Producer is freed, which is the client's doing, not the reload's
        after_connections = metrics.value("sluice_open_connections", listener="broker 1")
        log_after_reload = sluice.log()
        stop.set()
        worker.join(30)
        slow = timeline.rate(0, 2 * PERIOD_S)
        fast = timeline.rate(reload_at - timeline.started + 0.5, reload_at - timeline.started + 8)
        assert slow <= 1.15 * 256 * KiB
        assert fast >= 3 * slow, (slow, fast)
        assert metrics.value("sluice_quota_limit", client_id="hup", kind="produce") == 2 * MiB
        assert "configuration reloaded" in log_after_reload
        after_reload = log_after_reload.split("configuration reloaded", 1)[1]
        assert "closed" not in after_reload and " lost: " not in after_reload  # what Sluice logs of a close
        assert before_connections is not None and before_connections >= 1
        assert after_connections == before_connections
    finally:
        sluice.stop()


def test_bad_reload_keeps_the_running_quotas(kafka: KafkaCluster, tmp_path: Path) -> None:
    sluice, metrics = start_sluice(kafka, tmp_path, [{"client_id": "<default>", "producer_byte_rate": 1000}])
    try:
        config = yaml.safe_load(sluice.config_path.read_text())
        config["quotas"]["entries"][0]["producer_byte_rate"] = -1
        sluice.config_path.write_text(yaml.safe_dump(config))
        sluice.signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "reload refused" not in sluice.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "quotas.entries[0].producer_byte_rate: must be > 0" in sluice.log()
        assert metrics.value("sluice_quota_configured", key="producer_byte_rate") == 1000
        assert sluice.process is not None and sluice.process.poll() is None
    finally:
        sluice.stop()


def test_metrics_and_health_endpoints(kafka: KafkaCluster, tmp_path: Path, topic: str) -> None:
    sluice, metrics = start_sluice(kafka, tmp_path, [{"user": "<default>", "request_rate": 1000}])
    try:
        clients.confluent_produce(sluice.bootstrap, topic, clients.values(50), {"client.id": "m"})
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics.port}/healthz", timeout=5) as r:
            assert r.status == 200
        text = metrics.text()
        assert 'sluice_requests_total{api="Produce"}' in text
        assert 'sluice_open_connections{listener="bootstrap"}' in text
        # a user-level quota: the sensor is tagged with the user only (Kafka's metric tags)
        assert metrics.value("sluice_quota_request_rate", user="ANONYMOUS", client_id="") is not None
        assert json.dumps(text)  # exposition text is plain ASCII/UTF-8
    finally:
        sluice.stop()
