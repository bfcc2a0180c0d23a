"""Several Sluice processes as one fleet (`fleet:`) in front of one cluster, and the loads the fleet
tests and the fleet benchmark drive through it: librdkafka producers, one per instance, and a Java
consumer group across the instances, with the rates they achieved."""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Any

from tests.harness import load
from tests.harness.kafka import KafkaCluster, free_port
from tests.harness.metrics import Metrics
from tests.harness.quotas import WINDOW, KiB, MiB
from tests.harness.sluice import SluiceProcess
from tests.harness.tools import KafkaTools
from tests.harness.topics import create_topic, unique_name
from tests.harness.wait import poll, wait_until


class Fleet:
    def __init__(self, members: list[tuple[SluiceProcess, Metrics]]) -> None:
        self.members = members

    @property
    def sluices(self) -> list[SluiceProcess]:
        return [s for s, _ in self.members]

    def metrics(self, i: int) -> Metrics:
        return self.members[i][1]

    def stop(self) -> None:
        for sluice, _ in self.members:
            sluice.stop()


def start_fleet(kafka: KafkaCluster, tmp_path: Path, n: int, entries: list[dict[str, Any]],
                fleet: dict[str, Any] | None = None, wait_members: int | None = None) -> Fleet:
    fleet_id = unique_name("fleet")
    store_topic = unique_name("_sluice_quotas")
    members = []
    try:
        for i in range(n):
            port = free_port()
            config = {"metrics": {"port": port}, "instance": f"sluice-{i}",
                      "quotas": {"window": WINDOW, "entries": entries},
                      "store": {"type": "kafka", "topic": store_topic},
                      "fleet": {"id": fleet_id, "topic": f"{fleet_id}-reports", **(fleet or {})}}
            members.append((SluiceProcess(kafka.bootstrap, tmp_path / f"sluice-{i}", config=config).start(),
                            Metrics(port)))
        want = n if wait_members is None else wait_members
        for _, metrics in members:
            wait_until(lambda m=metrics: m.value("sluice_fleet_members") == want, 30,  # type: ignore[misc]
                       f"{want} fleet members")
    except BaseException:
        for sluice, _ in members:
            sluice.stop()
        raise
    return Fleet(members)


def flood_through(fleet: Fleet, topic: str, seconds: float, stops: list[threading.Event] | None = None,
                  batch_bytes: int = 64 * KiB, partitions: list[int] | None = None) -> list[load.Timeline]:
    """One librdkafka producer per instance, all with client id `fleet-app`, started together; a
    producer whose `stops` event is set goes away at once (drops what is in flight, closes).
    `partitions`: the partition each producer writes to (by default they spread their records)."""
    timelines = [load.Timeline() for _ in fleet.sluices]

    def flood(i: int, sluice: SluiceProcess, timeline: load.Timeline) -> None:
        load.confluent_flood(sluice.bootstrap, topic, seconds, client_id="fleet-app",
                             batch_bytes=batch_bytes, timeline=timeline,
                             config={"log_level": 2},  # the killed instance's would log every retry
                             stop=None if stops is None else stops[i], abandon_on_stop=True,
                             partition=None if partitions is None else partitions[i])

    load.run_together([functools.partial(flood, i, s, t)
                       for i, (s, t) in enumerate(zip(fleet.sluices, timelines, strict=True))], seconds + 60)
    return timelines


def total_rate(timelines: list[load.Timeline], start_s: float, end_s: float) -> float:
    """The sum of each producer's rate over its own whole throttle cycles in the range (over the
    range itself for a producer held to so small a share that it trickles instead of bursting)."""
    return sum(t.cycle_rate(start_s, end_s, or_plain=True) for t in timelines)


def java_consumer_progress(bootstraps: list[str], topic: str, records: int, group: str, chunk_bytes: int,
                           workdir: Path) -> list[list[tuple[float, float]]]:
    """Kafka's ConsumerPerformance, one per bootstrap, in one group with client id `fleet-app`:
    each one's progress reports (epoch seconds, MiB consumed so far), every 250 ms."""
    progress: list[list[tuple[float, float]]] = [[] for _ in bootstraps]

    def consume(i: int) -> None:
        (workdir / f"c{i}").mkdir(parents=True, exist_ok=True)
        tools = KafkaTools(bootstraps[i], workdir=workdir / f"c{i}")
        progress[i] = tools.consumer_perf_progress(
            topic, records // len(bootstraps), group=group, timeout_ms=60000, interval_ms=250,
            props={"client.id": "fleet-app", "fetch.max.bytes": str(chunk_bytes),
                   "max.partition.fetch.bytes": str(chunk_bytes)})

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(len(bootstraps))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert all(progress), "a consumer reported no progress"
    return progress


def group_rate(progress: list[list[tuple[float, float]]], skip_s: float) -> tuple[float, float]:
    """The group's bytes per second while all its consumers ran, after the first `skip_s` (a fresh
    client's burst), and the span that was measured. A Java consumer fetching small chunks is held
    by many short throttles rather than a few long mutes, so a plain rate over several periods is
    steady; summed over the group at the same instants it does not depend on how each consumer's
    sawtooth lines up with the span."""
    start = max(rows[0][0] for rows in progress) + skip_s
    end = min(rows[-1][0] for rows in progress)

    def consumed_mib(rows: list[tuple[float, float]], at: float) -> float:
        return max((mib for stamp, mib in rows if stamp <= at), default=0.0)

    got_mib = sum(consumed_mib(rows, end) - consumed_mib(rows, start) for rows in progress)
    return got_mib * MiB / (end - start), end - start


def filled_topic(kafka: KafkaCluster, partitions: int, nbytes: int) -> str:
    topic = create_topic(kafka.bootstrap, unique_name("fleet-c"), partitions=partitions)
    load.confluent_flood(kafka.bootstrap, topic, 120, client_id="filler", batch_bytes=256 * KiB,
                         stop=after_records(kafka.bootstrap, topic, nbytes // 1000))
    return topic


def after_records(bootstrap: str, topic: str, records: int) -> threading.Event:
    """An event set once `topic` holds `records` records (polled on the broker)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    done = threading.Event()

    def watch() -> None:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "fleet-watch"})

        def filled() -> bool:
            try:
                meta = consumer.list_topics(topic, timeout=5).topics[topic]
                return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1]
                           for p in meta.partitions) >= records
            except KafkaException:  # a new topic's leader not known yet (NOT_LEADER_FOR_PARTITION,
                return False        # once in a loaded run): ask again, do not end the watch

        try:
            if poll(filled, 300, interval_s=0.2):
                done.set()
        finally:
            consumer.close()

    threading.Thread(target=watch, daemon=True).start()
    return done
