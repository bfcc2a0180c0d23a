"""One budget across several Sluice processes (`fleet:`), against real Kafka through real Sluice
processes with real clients.

Windows are 11 x 500 ms (a period of 5.5 s) as in `test_quota_enforcement`. A saturating
librdkafka producer moves in Kafka's sawtooth (about one window's quota in a burst, then a mute),
so producer rates are judged over whole throttle cycles (`Timeline.cycle_rate`) after the first
period (Kafka lets a fresh client burst; that is the broker's behaviour with or without a fleet),
from what the broker acknowledged; a consumer group's rate from the consumer tool's progress
reports, after the first period. Members report every 500 ms and leave after 1.5 s of silence.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import create_topic, unique_name
from tests.harness import load
from tests.harness.kafka import KafkaCluster, free_port
from tests.harness.sluice import SluiceProcess
from tests.harness.tools import KafkaTools
from tests.harness.wait import Sampler, poll, wait_until
from tests.integration.test_pluggable_quotas import spread_topic
from tests.integration.test_quota_enforcement import PERIOD_S, RUN_S, WINDOW, KiB, Metrics, MiB

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUOTA = MiB
# the nine producers of the workers test send 16 KiB batches: what each may land past the budget
BATCH_OF_NINE = 16 * KiB


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


@pytest.fixture
def fleet3(kafka: KafkaCluster, tmp_path: Path) -> Iterator[Fleet]:
    fleet = start_fleet(kafka, tmp_path, 3, [{"client_id": "fleet-app", "producer_byte_rate": QUOTA,
                                              "consumer_byte_rate": QUOTA}])
    try:
        yield fleet
    finally:
        fleet.stop()


def flood_through(fleet: Fleet, topic: str, seconds: float, stops: list[threading.Event] | None = None,
                  batch_bytes: int = 64 * KiB, partitions: list[int] | None = None) -> list[load.Timeline]:
    """One librdkafka producer per instance, all with client id `fleet-app`, started together; a
    producer whose `stops` event is set goes away at once (drops what is in flight, closes).
    `partitions`: the partition each producer writes to (by default they spread their records)."""
    timelines = [load.Timeline() for _ in fleet.sluices]
    failures: list[BaseException] = []

    def flood(i: int, sluice: SluiceProcess, timeline: load.Timeline) -> None:
        try:
            load.confluent_flood(sluice.bootstrap, topic, seconds, client_id="fleet-app",
                                 batch_bytes=batch_bytes, timeline=timeline,
                                 config={"log_level": 2},  # the killed instance's would log every retry
                                 stop=None if stops is None else stops[i], abandon_on_stop=True,
                                 partition=None if partitions is None else partitions[i])
        except BaseException as e:  # raised again in the test's own thread
            failures.append(e)

    threads = [threading.Thread(target=flood, args=(i, s, t))
               for i, (s, t) in enumerate(zip(fleet.sluices, timelines, strict=True))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)
    if failures:
        raise failures[0]
    return timelines


def total_rate(timelines: list[load.Timeline], start_s: float, end_s: float) -> float:
    """The sum of each producer's rate over its own whole throttle cycles in the range (over the
    range itself for a producer held to so small a share that it trickles instead of bursting)."""
    return sum(t.cycle_rate(start_s, end_s, or_plain=True) for t in timelines)


# ------------------------------------------------------------------------------------ budget

def test_three_instances_hold_one_produce_budget(fleet3: Fleet, kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_name("fleet-p"))
    with Sampler(lambda: [fleet3.metrics(i).value("sluice_fleet_share", client_id="fleet-app",
                                                  kind="producer_byte_rate") for i in range(3)]) as seen:
        timelines = flood_through(fleet3, topic, PERIOD_S + RUN_S)
    total = total_rate(timelines, PERIOD_S, PERIOD_S + RUN_S)
    each = ", ".join(f"{tl.cycle_rate(PERIOD_S, PERIOD_S + RUN_S, or_plain=True) / MiB:.2f}"
                     for tl in timelines)
    print(f"three instances, one client id: {each} = {total / MiB:.3f} MiB/s (quota 1)")
    # without the fleet each instance would admit a whole quota: about 3 MiB/s
    assert 0.9 * QUOTA <= total <= 1.1 * QUOTA, f"{total / QUOTA:.3f} x quota"
    # while the producers ran, every instance held a part of the budget (a share exists only while
    # its group is in use, so it is read during the flood)
    assert any(all(s is not None and 0 < s < 1 for s in sample) for sample in seen.samples), seen.samples


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
                         stop=_after_records(kafka.bootstrap, topic, nbytes // 1000))
    return topic


def test_a_java_consumer_group_through_three_instances_holds_one_fetch_budget(
        fleet3: Fleet, kafka: KafkaCluster, tmp_path: Path) -> None:
    # A Java consumer under Kafka's windowed fetch quota runs somewhat below the quota (a throttled
    # fetch is emptied whole and waited out, chunk included): the same-run baseline is one consumer
    # through one Sluice without a fleet, fetching an eighth of its quota at a time; each fleet
    # member's consumer fetches an eighth of its third.
    nbytes = int(QUOTA * (PERIOD_S + 2 * RUN_S))  # about 38 s at the quota: several whole cycles
    baseline_sluice = SluiceProcess(kafka.bootstrap, tmp_path / "baseline", config={
        "quotas": {"window": WINDOW, "entries": [{"client_id": "fleet-app", "consumer_byte_rate": QUOTA}]}}
    ).start()
    try:
        baseline, baseline_span_s = group_rate(java_consumer_progress(
            [baseline_sluice.bootstrap], filled_topic(kafka, 1, nbytes), nbytes // 1000,
            unique_name("base-jg"), QUOTA // 8, tmp_path / "b"), PERIOD_S)
    finally:
        baseline_sluice.stop()
    total, span_s = group_rate(java_consumer_progress(
        [s.bootstrap for s in fleet3.sluices], filled_topic(kafka, 3, nbytes), nbytes // 1000,
        unique_name("fleet-jg"), QUOTA // 24, tmp_path / "f"), PERIOD_S)
    print(f"java consumers: one through one Sluice {baseline / MiB:.3f} MiB/s over {baseline_span_s:.1f} s; "
          f"a group through three instances {total / MiB:.3f} MiB/s over {span_s:.1f} s (quota 1): "
          f"{total / baseline:.3f} x the baseline")
    # both spans hold several whole periods, so one period's burst moves a rate by a few per cent
    assert min(span_s, baseline_span_s) >= 3 * PERIOD_S, (span_s, baseline_span_s)
    # three instances without a fleet would give about 3 x the baseline. Below it: shares follow each
    # consumer's demand an exchange round or two late (docs/fleet.md), and on a loaded
    # machine three JVMs stall and resume out of step, so the group runs under the quota (0.740 x
    # once, beside a busy core); a fleet that counted each byte twice would hold it near 0.5 x
    assert 0.65 * baseline <= total <= 1.35 * baseline, f"{total / baseline:.3f} x the one-instance baseline"
    assert total <= 1.2 * QUOTA, f"{total / QUOTA:.3f} x quota"


def _after_records(bootstrap: str, topic: str, records: int) -> threading.Event:
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


# ------------------------------------------------------------------------------------ shifts

def test_demand_moves_to_the_one_producer_left(fleet3: Fleet, kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_name("fleet-shift"))
    stop_at_s = PERIOD_S + RUN_S
    stops = [threading.Event() for _ in range(3)]
    timers = [threading.Timer(stop_at_s, stops[i].set) for i in (1, 2)]
    for t in timers:
        t.start()
    timelines = flood_through(fleet3, topic, stop_at_s + 3 + RUN_S, stops)
    before = timelines[0].cycle_rate(PERIOD_S, stop_at_s, or_plain=True)
    after = timelines[0].cycle_rate(stop_at_s + 3, stop_at_s + 3 + RUN_S, or_plain=True)
    print(f"demand shift: the remaining producer {before / MiB:.2f} MiB/s before, "
          f"{after / MiB:.2f} MiB/s from 3 s after the others stopped (quota 1)")
    assert before <= 0.6 * QUOTA, f"{before / QUOTA:.2f} x quota before the shift"
    # whole quota reached: the share moves within ~2 s (bench_fleet: 1.8 s); over the cycles after
    # that the producer holds the quota (1.00 x measured), judged within 15 %
    assert 0.85 * QUOTA <= after <= 1.15 * QUOTA, f"{after / QUOTA:.2f} x quota after the shift"


def test_survivors_cover_the_quota_after_a_sigkill(fleet3: Fleet, kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_name("fleet-kill"))
    kill_at_s = PERIOD_S + RUN_S
    killer = threading.Timer(kill_at_s, lambda: fleet3.sluices[2].signal(signal.SIGKILL))
    killer.start()
    timelines = flood_through(fleet3, topic, kill_at_s + 3 + RUN_S)
    survivors = timelines[:2]
    before = total_rate(survivors, PERIOD_S, kill_at_s)
    after = total_rate(survivors, kill_at_s + 3, kill_at_s + 3 + RUN_S)
    print(f"kill: two survivors {before / MiB:.2f} MiB/s before, {after / MiB:.2f} MiB/s from 3 s after")
    assert before <= 0.85 * QUOTA, f"{before / QUOTA:.2f} x quota before the kill"
    assert 0.85 * QUOTA <= after <= 1.15 * QUOTA, f"{after / QUOTA:.2f} x quota after the kill"
    wait_until(lambda: fleet3.metrics(0).value("sluice_fleet_members") == 2, 10, "two members left")


# ------------------------------------------------------------------------------------ fallback

def test_an_unreachable_exchange_splits_by_the_expected_member_count(kafka: KafkaCluster,
                                                                      tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    fleet = start_fleet(kafka, tmp_path, 1, [{"client_id": "fleet-app", "producer_byte_rate": QUOTA}],
                        fleet={"bootstrap": dead, "expected_members": 3}, wait_members=3)
    try:
        metrics = fleet.metrics(0)
        assert metrics.value("sluice_fleet_fallback") == 1
        assert fleet.sluices[0].wait_for_log("fleet exchange kafka topic")  # the warning names it
        topic = create_topic(kafka.bootstrap, unique_name("fleet-fb"))
        (timeline,) = flood_through(fleet, topic, PERIOD_S + RUN_S)
        achieved = timeline.cycle_rate(PERIOD_S, PERIOD_S + RUN_S, or_plain=True)
        print(f"exchange unreachable, 3 members expected: {achieved / MiB:.3f} MiB/s (quota/3 = 0.333)")
        assert 0.9 * QUOTA / 3 <= achieved <= 1.1 * QUOTA / 3, f"{achieved / QUOTA:.3f} x quota"
        assert metrics.value("sluice_quota_limit", client_id="fleet-app", kind="produce") == \
            pytest.approx(QUOTA / 3)
        assert (metrics.value("sluice_fleet_exchange_errors_total") or 0) >= 1
    finally:
        fleet.stop()


# ------------------------------------------------------------------------------------ brokers

def test_per_broker_budgets_hold_per_broker_across_two_instances(kafka_cluster3: KafkaCluster,
                                                                 tmp_path: Path) -> None:
    quota = 512 * KiB
    fleet = start_fleet(kafka_cluster3, tmp_path, 2,
                        [{"client_id": "fleet-app", "producer_byte_rate": quota}])
    try:
        topic = spread_topic(kafka_cluster3.bootstrap, [[1], [2], [3]])
        with Sampler(lambda: {(b, i): fleet.metrics(i).value("sluice_fleet_share", broker=b,
                                                             client_id="fleet-app")
                              for b in ("1", "2", "3") for i in range(2)}) as seen:
            # one producer per instance and broker, each held to its partition: what each instance's
            # clients want of each broker stays steady, so the shares settle (a producer that spreads
            # its records moves its demand between brokers batch by batch, and every move lets the
            # instance gaining demand admit up to its standby share before the others hear of it:
            # 1.206 x a broker's budget in a loaded run)
            six = Fleet([fleet.members[i] for i in (0, 0, 0, 1, 1, 1)])
            flows = flood_through(six, topic, PERIOD_S + RUN_S, partitions=[0, 1, 2, 0, 1, 2])
        # partition p lives on broker p + 1; each connection judged over its own whole throttle
        # cycles, as in the three-instance test (a plain rate over a span that is not whole cycles
        # is off by up to one burst per connection)
        per_broker = [total_rate([flows[p], flows[3 + p]], PERIOD_S, PERIOD_S + RUN_S) for p in range(3)]
        print("three brokers, two instances: " + ", ".join(f"{r / KiB:.0f}" for r in per_broker)
              + f" KiB/s (budgets of {quota // KiB} KiB/s)")
        # one budget per broker for the whole fleet (two instances alone would give 2 x each). As in
        # test_pluggable_quotas, a loaded 2-core machine may not fill three budgets (0.79 measured
        # under load): the bound that matters is the upper one, the same as the three-instance test's
        # (0.99-1.02 per broker measured at load 5-6, beside a loaded test run)
        for broker, rate in enumerate(per_broker, start=1):
            assert rate <= 1.1 * quota, f"broker {broker}: {rate / quota:.3f} x its budget"
        assert 0.6 * 3 * quota <= sum(per_broker), f"{sum(per_broker) / (3 * quota):.3f} x 3 budgets"
        # both instances shared each broker's budget while the producers ran
        for broker in ("1", "2", "3"):
            both = [[sample[(broker, i)] for i in range(2)] for sample in seen.samples]
            assert any(all(s is not None and s < 1 for s in pair) for pair in both), (broker, both)
    finally:
        fleet.stop()


# ------------------------------------------------------------------------------------ workers

def test_one_instance_with_three_workers_holds_one_budget(kafka: KafkaCluster, tmp_path: Path) -> None:
    """Without `fleet:`, the workers of one instance share one budget over their supervisor's hub."""
    port = free_port()
    sluice = SluiceProcess(kafka.bootstrap, tmp_path / "workers", workers=3, config={
        "metrics": {"port": port},
        "quotas": {"window": WINDOW, "entries": [{"client_id": "fleet-app", "producer_byte_rate": QUOTA}]}}
    ).start()
    metrics = Metrics(port)
    try:
        for w in ("0", "1", "2"):
            wait_until(lambda w=w: metrics.value("sluice_fleet_members", worker=w) == 3, 30,  # type: ignore[misc]
                       f"worker {w} to hear from three members")
        topic = create_topic(kafka.bootstrap, unique_name("fleet-w"))
        # A worker listens on a broker's port once a Metadata answer through it named that broker:
        # twenty bootstrap connections (SO_REUSEPORT spreads them) make every worker do so, with
        # probability 1 - 3 x (2/3)^20. Then nine producers' broker connections spread over the
        # workers (all on one: 3 x (1/3)^9).
        from confluent_kafka.admin import AdminClient

        for _ in range(20):
            AdminClient({"bootstrap.servers": sluice.bootstrap}).list_topics(timeout=10)
        nine = Fleet([(sluice, metrics)] * 9)
        with Sampler(lambda: {w for w in ("0", "1", "2")
                              if metrics.value("sluice_fleet_share", worker=w, client_id="fleet-app")
                              is not None}) as seen:
            timelines = flood_through(nine, topic, PERIOD_S + RUN_S, batch_bytes=BATCH_OF_NINE)
        # the budget's flow is all nine producers' together: judged over its own throttle cycles
        # (each producer's part, about 0.11 MiB/s, trickles too thinly to find its own cycles in)
        total = load.Timeline.merged(timelines).cycle_rate(PERIOD_S, PERIOD_S + RUN_S, or_plain=True)
        served = sorted(set().union(*seen.samples))
        print(f"three workers, nine producers: {total / MiB:.3f} MiB/s (quota 1); workers serving: {served}")
        assert len(served) >= 2, "the connections did not spread over the workers"
        # nine connections share three workers' sensors: each connection may land one request
        # (16 KiB) before its own check mutes it (the broker's per-connection mute does the same),
        # so a cycle of about a second can hold 9 x 16 KiB = 0.14 MiB more than one connection's
        # (0.97-1.03 measured); without the workers' fleet it would be about 3
        assert 0.9 * QUOTA <= total <= 1.2 * QUOTA, f"{total / QUOTA:.3f} x quota"
        # a killed worker is restarted and joins again as a new member
        os.kill(sluice.worker_pids()[1], signal.SIGKILL)
        assert sluice.wait_for_log("restarting in", 20)
        wait_until(lambda: metrics.value("sluice_fleet_members", worker="0") == 3
                   and sluice.wait_for_log("worker 1 ready", 0.1), 60, "the restarted worker to rejoin")
    finally:
        sluice.stop()
