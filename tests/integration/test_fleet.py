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

import pytest

from tests.conftest import create_topic, unique_name
from tests.harness import load
from tests.harness.fleet import (
    Fleet,
    filled_topic,
    flood_through,
    group_rate,
    java_consumer_progress,
    start_fleet,
    total_rate,
)
from tests.harness.kafka import KafkaCluster, free_port
from tests.harness.metrics import Metrics
from tests.harness.quotas import PERIOD_S, RUN_S, WINDOW, KiB, MiB
from tests.harness.sluice import SluiceProcess
from tests.harness.wait import Sampler, wait_until
from tests.integration.test_pluggable_quotas import spread_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUOTA = MiB
# the nine producers of the workers test send 16 KiB batches: what each may land past the budget
BATCH_OF_NINE = 16 * KiB


@pytest.fixture
def fleet3(kafka: KafkaCluster, tmp_path: Path) -> Iterator[Fleet]:
    fleet = start_fleet(kafka, tmp_path, 3, [{"client_id": "fleet-app", "producer_byte_rate": QUOTA,
                                              "consumer_byte_rate": QUOTA}])
    try:
        yield fleet
    finally:
        fleet.stop()


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


def test_a_java_consumer_group_through_three_instances_holds_one_fetch_budget(
        fleet3: Fleet, kafka: KafkaCluster, tmp_path: Path) -> None:
    # A Java consumer under Kafka's windowed fetch quota runs somewhat below the quota (a throttled
    # fetch is emptied whole and waited out, chunk included): the same-run baseline is one consumer
    # through one Sluice without a fleet, fetching an eighth of its quota at a time; each fleet
    # member's consumer fetches an eighth of its third.
    nbytes = int(QUOTA * (PERIOD_S + 2 * RUN_S))  # about 38 s at the quota: several whole cycles
    # The baseline runs beside the fleet's group, not before it: each has its own budget (the
    # baseline's Sluice is in no fleet, no broker quota is set) and both then see the same load.
    base_topic, fleet_topic = filled_topic(kafka, 1, nbytes), filled_topic(kafka, 3, nbytes)
    baseline_sluice = SluiceProcess(kafka.bootstrap, tmp_path / "baseline", config={
        "quotas": {"window": WINDOW, "entries": [{"client_id": "fleet-app", "consumer_byte_rate": QUOTA}]}}
    ).start()
    runs: dict[str, list[list[tuple[float, float]]]] = {}
    try:
        base_run = threading.Thread(target=lambda: runs.update(base=java_consumer_progress(
            [baseline_sluice.bootstrap], base_topic, nbytes // 1000, unique_name("base-jg"), QUOTA // 8,
            tmp_path / "b")))
        base_run.start()
        try:
            runs["fleet"] = java_consumer_progress(
                [s.bootstrap for s in fleet3.sluices], fleet_topic, nbytes // 1000, unique_name("fleet-jg"),
                QUOTA // 24, tmp_path / "f")
        finally:
            base_run.join(360)
    finally:
        baseline_sluice.stop()
    assert "base" in runs, "the baseline consumer did not finish"
    baseline, baseline_span_s = group_rate(runs["base"], PERIOD_S)
    total, span_s = group_rate(runs["fleet"], PERIOD_S)
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
