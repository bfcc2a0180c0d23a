"""The fleet's promise through faults, against real Kafka and real Sluice processes: the exchange
lost after the fleet formed (its only broker SIGKILLed, then restarted), and a rolling restart of
the instances.

As in `test_fleet`, windows are 11 x 500 ms (a period of 5.5 s), members report every 500 ms and
leave after 1.5 s of silence, and one librdkafka producer per instance (client id `fleet-app`)
saturates one 1 MiB/s budget; rates come from what the broker acknowledged.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import create_topic, unique_name
from tests.harness import load
from tests.harness.kafka import KafkaCluster, free_port
from tests.harness.metrics import Metrics
from tests.harness.quotas import PERIOD_S, WINDOW, KiB, MiB
from tests.harness.sluice import SluiceProcess
from tests.harness.wait import eventually, wait_until
from tests.integration.test_pluggable_quotas import spread_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUOTA = MiB
ENTRIES = [{"client_id": "fleet-app", "producer_byte_rate": QUOTA}]


@dataclass
class Member:
    workdir: Path
    config: dict[str, Any]
    metrics: Metrics
    process: SluiceProcess | None = None

    def start(self, upstream: str) -> SluiceProcess:
        self.process = SluiceProcess(upstream, self.workdir, config=self.config).start()
        return self.process

    @property
    def bootstrap(self) -> str:
        return str(self.config["listen"])


@dataclass
class Fleet:
    upstream: str
    members: list[Member] = field(default_factory=list)

    def stop(self) -> None:
        for m in self.members:
            if m.process is not None:
                m.process.stop()

    def wait_members(self, n: int, timeout_s: float = 30) -> None:
        for m in self.members:
            wait_until(lambda m=m: m.metrics.value("sluice_fleet_members") == n, timeout_s,  # type: ignore[misc]
                       f"{n} fleet members")


def listen_address() -> str:
    """A fixed listen port, so a restarted instance comes back where its clients look for it (its
    broker ports follow: listen + 1 + node id)."""
    return f"127.0.0.1:{free_port()}"


@pytest.fixture
def make_fleet(tmp_path: Path) -> Iterator[Any]:
    fleets: list[Fleet] = []

    def make(kafka: KafkaCluster, fleet: dict[str, Any], quotas: dict[str, Any] | None = None) -> Fleet:
        f = Fleet(kafka.bootstrap)
        fleets.append(f)
        store_topic = unique_name("_sluice_quotas")
        for i in range(3):
            port = free_port()
            # a SIGTERMed instance drains for at most 3 s (a saturating producer always has a request
            # in flight, so the drain would run to the 30 s default): the issue's restart, "started
            # again on its ports 3 s later"
            config = {"listen": listen_address(), "metrics": {"port": port}, "instance": f"sluice-{i}",
                      "drain_timeout_ms": 3000,
                      "quotas": {"window": WINDOW, "entries": ENTRIES, **(quotas or {})},
                      "store": {"type": "kafka", "topic": store_topic},
                      "fleet": {"report_interval_ms": 500, "member_timeout_ms": 1500, **fleet}}
            member = Member(tmp_path / f"sluice-{i}", config, Metrics(port))
            f.members.append(member)
            member.start(kafka.bootstrap)
        f.wait_members(3)
        return f

    yield make
    for f in fleets:
        f.stop()


class Producers:
    """One producer per instance, each through its own instance's listen address, started together
    and running until `stop`; their timelines share one start."""

    def __init__(self, bootstraps: list[str], topic: str, max_s: float) -> None:
        self.timelines = [load.Timeline() for _ in bootstraps]
        start = min(t.started for t in self.timelines)
        for t in self.timelines:
            t.started = start
        self.started = start
        self._stops = [threading.Event() for _ in bootstraps]
        self._failures: list[BaseException] = []
        self._stopped = False
        self._threads = [threading.Thread(target=self._flood, args=(b, topic, max_s, t, s), daemon=True)
                         for b, t, s in zip(bootstraps, self.timelines, self._stops, strict=True)]
        for th in self._threads:
            th.start()

    def _flood(self, bootstrap: str, topic: str, max_s: float, timeline: load.Timeline,
               stop: threading.Event) -> None:
        try:
            load.confluent_flood(bootstrap, topic, max_s, client_id="fleet-app", timeline=timeline,
                                 config={"log_level": 2}, stop=stop, abandon_on_stop=True, partition=0)
        except BaseException as e:  # raised again in the test's own thread
            self._failures.append(e)

    def now_s(self) -> float:
        return time.monotonic() - self.started

    def stop(self) -> list[load.Timeline]:
        if self._stopped:
            return self.timelines
        self._stopped = True
        for s in self._stops:
            s.set()
        for th in self._threads:
            th.join(60)
        if self._failures:
            raise self._failures[0]
        return self.timelines


def window_rates(timeline: load.Timeline, from_s: float, to_s: float, span_s: float,
                 step_s: float = 0.25) -> list[tuple[float, float]]:
    """(start, bytes per second) of every `span_s` window starting at each `step_s` in
    [from_s, to_s - span_s]."""
    events = sorted((t - timeline.started, n) for t, n in timeline.events)
    out = []
    start = from_s
    while start + span_s <= to_s + 1e-9:
        got = sum(n for t, n in events if start <= t < start + span_s)
        out.append((start, got / span_s))
        start += step_s
    return out


# ------------------------------------------------------------------------------------ the exchange lost

def test_the_exchange_lost_after_formation_keeps_one_budget(kafka_cluster3: KafkaCluster,
                                                            make_fleet: Any) -> None:
    """Fails on main before the frozen membership: each member timed the others out before it
    noticed the exchange itself was silent, and the fleet admitted 1.81 x the budget for the
    outage. After the return the fleet must hold one budget again within 3 s: no member may time
    another out because their exchange clients came back at different times."""
    cluster = kafka_cluster3
    exchange_node, data_node = 2, 1
    fleet_topic = spread_topic(cluster.bootstrap, [[exchange_node]])  # replication 1, on node 2 only
    data_topic = spread_topic(cluster.bootstrap, [[data_node]])
    fleet = make_fleet(cluster, {"id": unique_name("fleet"), "topic": fleet_topic})
    producers = Producers([m.bootstrap for m in fleet.members], data_topic, 180)
    shares = ShareSampler(fleet, producers)
    killed = False
    try:
        wait_until(lambda: producers.now_s() >= PERIOD_S + 2, 30, "the fresh clients' first period")
        kill_s = producers.now_s()
        cluster.kill_node(exchange_node)
        killed = True
        for m in fleet.members:
            wait_until(lambda m=m: m.metrics.value("sluice_fleet_fallback") == 1, 15,  # type: ignore[misc]
                       "every member in its fallback")
        # every member still splits by three: nobody was timed out while the exchange was silent
        assert [m.metrics.value("sluice_fleet_members") for m in fleet.members] == [3, 3, 3]
        wait_until(lambda: producers.now_s() >= kill_s + 3 * PERIOD_S, 60, "three periods of outage")
        restart_s = producers.now_s()
        cluster.restart_node(exchange_node, timeout_s=120)  # slow on a loaded machine
        killed = False
        for m in fleet.members:
            wait_until(lambda m=m: m.metrics.value("sluice_fleet_fallback") == 0, 60,  # type: ignore[misc]
                       "the exchange back on every member")
        back_s = producers.now_s()
        assert [m.metrics.value("sluice_fleet_members") for m in fleet.members] == [3, 3, 3]
        after_s = (back_s + 3, back_s + 3 + AFTER_PERIODS * PERIOD_S)
        wait_until(lambda: producers.now_s() >= after_s[1], 60, "three periods after the return")
        timelines = producers.stop()
    finally:
        shares.stop()
        producers.stop()
        if killed:
            cluster.restart_node(exchange_node, timeout_s=120)  # slow on a loaded machine
    for i, t in enumerate(timelines):  # per second, per producer, for a post-mortem
        print(f"producer {i} KiB/s from {kill_s - 3:.0f} s: "
              + " ".join(f"{r / KiB:.0f}" for _, r in window_rates(t, kill_s - 3, after_s[1], 1.0, 1.0)))
    print(f"exchange killed at {kill_s:.1f} s, restarted at {restart_s:.1f} s, back on every member at "
          f"{back_s:.1f} s; share moves: {shares.moves() or 'none'}")
    outage = sum(t.cycle_rate(kill_s, restart_s, or_plain=True) for t in timelines)
    after = sum(t.cycle_rate(*after_s, or_plain=True) for t in timelines)
    print(f"exchange lost after formation: {outage / MiB:.3f} MiB/s over the {restart_s - kill_s:.1f} s "
          f"outage; {after / MiB:.3f} MiB/s from 3 s after its return ({back_s - restart_s:.1f} s after "
          f"the restart began) (one budget: 1 MiB/s)")
    # Before, during and after the outage every member holds a third: before, all three are
    # constrained (water-filling gives 1/3 each); during, the fallback splits by the frozen count
    # (3); after, each member leaves its fallback when it hears the exchange again (within one
    # 500 ms interval of its clients reconnecting, which the exchange retries at least every
    # member_timeout / 3 = 500 ms), so all three are back within 1 s of one another, inside the
    # 1.5 s member timeout that counts from a member's own return: nobody is timed out, and no
    # share moves. The 3 s margin covers that second plus one interval.
    assert shares.worst_after(restart_s) <= 1 / 3 + 1e-3, shares.moves()
    # A windowed rate holding a third admits a third over each whole throttle cycle (a burst of
    # about one 5.5 s window's worth, then a mute: a cycle of about 6 s here). So each producer is
    # judged over its own whole cycles (`cycle_rate`): spans of three periods (16.5 s) hold two
    # whole cycles while a cycle is under 8.25 s. A producer that trickles its third instead (seen
    # under load: 318-387 KiB/s in every 250 ms bin, no burst at all) has no cycle to find, and
    # its plain rate over the span is then exact to a bin (`or_plain`): with no burst there is
    # none to cut in half at the span's ends.
    # (Over two periods, 11 s, a span holds one cycle start or two by phase, and the old fallback
    # to a plain rate then counted one burst in 11 s: 0.765-0.81 x measured with the shares at a
    # third throughout.) The bound: each cycle ends with at most one 64 KiB request admitted past
    # its check and paid for in the next cycle, 3 x 64 KiB over >= 6 s of one MiB/s = 3 %, and the
    # 0.25 s bins place a cycle's ends within one trickle bin (< 1 %): 10 %, test_fleet's bound.
    assert 0.9 * QUOTA <= outage <= 1.1 * QUOTA, f"{outage / QUOTA:.3f} x the budget during the outage"
    assert 0.9 * QUOTA <= after <= 1.1 * QUOTA, f"{after / QUOTA:.3f} x the budget after the return"


#: Periods measured after the exchange's return (see the bound's comment).
AFTER_PERIODS = 3


class ShareSampler:
    """Every 250 ms, every member's `sluice_fleet_share` of the producers' group (its standby share
    while it holds none of its own); keeps the changes."""

    def __init__(self, fleet: Fleet, producers: Producers) -> None:
        self._fleet = fleet
        self._producers = producers
        self.samples: list[tuple[float, int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last: dict[int, float] = {}
        while not self._stop.wait(0.25):
            for i, m in enumerate(self._fleet.members):
                try:
                    share = m.metrics.value("sluice_fleet_share", client_id="fleet-app")
                    if share is None:
                        share = m.metrics.value("sluice_fleet_standby_share")
                except OSError:
                    continue
                if share is not None and last.get(i) != share:
                    last[i] = share
                    self.samples.append((self._producers.now_s(), i, share))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def worst_after(self, from_s: float) -> float:
        return max((s for t, _, s in self.samples if t >= from_s), default=0.0)

    def moves(self) -> str:
        return ", ".join(f"{t:.1f} s member {i}: {s:.3f}" for t, i, s in self.samples)


# ------------------------------------------------------------------------------------ rolling restart

@dataclass
class RollingRun:
    """One rolling restart's merged rates: every 5 s window (start, bytes/s) of the steady fleet
    before the first restart and from it to the end, each producer's timeline and the restarts."""

    before: list[tuple[float, float]]
    during: list[tuple[float, float]]
    timelines: list[load.Timeline]
    restarts_s: list[float]
    end_s: float

    @property
    def worst(self) -> tuple[float, float]:
        return max(self.during, key=lambda w: w[1])

    @property
    def worst_before(self) -> float:
        return max(r for _, r in self.before)

    def attribution(self, start_s: float) -> str:
        """Each producer's part of the 5 s window at `start_s` (x the budget), and which member
        had restarted last before it: whose bytes made the window's excess."""
        parts = []
        for i, t in enumerate(self.timelines):
            got = sum(n for at, n in t.events if start_s <= at - t.started < start_s + 5.0)
            parts.append(f"producer {i} {got / 5.0 / QUOTA:.3f}")
        last = max((i for i, r in enumerate(self.restarts_s) if r <= start_s + 5.0), default=None)
        return ", ".join(parts) + (f" (member {last} restarted at {self.restarts_s[last]:.1f} s)"
                                   if last is not None else "")


def rolling_restart(kafka: KafkaCluster, make_fleet: Any, quotas: dict[str, Any], steady_s: float
                    ) -> RollingRun:
    """Three instances, one saturating producer through each; after `steady_s` each instance in
    turn is SIGTERMed, started again on its ports and given a period after it has rejoined."""
    topic = create_topic(kafka.bootstrap, unique_name("fleet-roll"))
    fleet = make_fleet(kafka, {"id": unique_name("fleet"), "topic": unique_name("fleet-reports")}, quotas)
    producers = Producers([m.bootstrap for m in fleet.members], topic, 240)
    shares = ShareSampler(fleet, producers)
    try:
        wait_until(lambda: producers.now_s() >= steady_s, 60, "a steady fleet")
        first_restart_s = producers.now_s()
        restarts_s: list[float] = []
        for m in fleet.members:
            assert m.process is not None
            restarts_s.append(producers.now_s())
            m.process.stop()                   # SIGTERM; it drains and exits
            m.start(fleet.upstream)            # on the same ports
            eventually(lambda m=m: m.metrics.value("sluice_fleet_members"),  # type: ignore[misc]
                       lambda n: n is not None and n >= 3, 30)
            started = producers.now_s()
            wait_until(lambda s=started: producers.now_s() >= s + PERIOD_S, 30, "a period after the rejoin")
        end_s = producers.now_s()
        timelines = producers.stop()
    finally:
        shares.stop()
        producers.stop()
    assert [m.metrics.value("sluice_fleet_members") for m in fleet.members].count(3) >= 1
    assert all(m.process is not None and m.process.process is not None
               and m.process.process.poll() is None for m in fleet.members)
    merged = load.Timeline.merged(timelines)
    for i, t in enumerate(timelines):  # per second, per producer, for a post-mortem
        print(f"producer {i} KiB/s from {first_restart_s - 3:.0f} s: "
              + " ".join(f"{r / KiB:.0f}" for _, r in window_rates(t, first_restart_s - 3, end_s, 1.0, 1.0)))
    print("restarts at " + ", ".join(f"{s:.1f}" for s in restarts_s))
    print(f"share moves: {shares.moves() or 'none'}")
    run = RollingRun(window_rates(merged, PERIOD_S, first_restart_s, 5.0),
                     window_rates(merged, first_restart_s, end_s, 5.0), timelines, restarts_s, end_s)
    worst_start, worst = run.worst
    print(f"rolling restart: worst 5 s window {worst / MiB:.3f} MiB/s (at {worst_start:.2f} s: "
          f"{run.attribution(worst_start)}); before the first restart, in the same run, "
          f"{run.worst_before / MiB:.3f} MiB/s; whole run "
          f"{merged.cycle_rate(first_restart_s, end_s, or_plain=True) / MiB:.3f} MiB/s (budget 1 MiB/s)")
    return run


def test_a_rolling_restart_keeps_every_five_seconds_within_the_budget(kafka: KafkaCluster,
                                                                     make_fleet: Any) -> None:
    """Fails on main: a restarted member enforced the whole quota until it had heard the fleet,
    with a fresh sensor's credit on top (2.3-2.6 x the budget in the second after each rejoin,
    1.29 x over the worst five seconds)."""
    # the token bucket: a raised share refills at the new rate from the credits it holds (a windowed
    # rate would let a member whose share rose re-admit what a departed member used in the window)
    run = rolling_restart(kafka, make_fleet, {"rate_model": "token_bucket"}, 2 * PERIOD_S)
    worst_start, worst = run.worst
    # 5 s windows over a sawtooth of 5.5 s periods: a window holds at most one burst per producer,
    # about one period's worth of its share, so a steady fleet's worst window is up to 5.5/5 = 1.1 x
    # (the same-run 'before' figure); a rejoin may add its standby share for about one report
    # interval: 1/3 x 0.5 s / 5 s = 0.03 x. Bound: 1.15 x
    assert worst <= 1.15 * QUOTA, f"{worst / QUOTA:.3f} x the budget over 5 s at {worst_start:.2f} s"


def test_a_windowed_rolling_restart_stays_within_the_steady_fleets_own_sawtooth(kafka: KafkaCluster,
                                                                              make_fleet: Any) -> None:
    """Kafka's windowed rate through a rolling restart: no five-second window of the restart goes
    above the worst five seconds of the same fleet before it (its own sawtooth, 1.157-1.182 x),
    plus one share move's overlap. Without the owed raise (`QuotaManager._owe_raise`) a survivor
    whose share rose re-admitted at once what the departed member had used in the window: 1.291 x
    over the worst five seconds against 1.187 x steady in the same run."""
    # three periods of the steady fleet: its sawtooth's worst 5 s window, measured over every 5 s
    # window that starts in the second and third periods (the first is a fresh client's burst)
    run = rolling_restart(kafka, make_fleet, {"rate_model": "windowed"}, 4 * PERIOD_S)
    worst_start, worst = run.worst
    # The steady windowed fleet's own sawtooth, not share moves (the shares stay at a third until
    # the first restart): each producer admits about one 5.5 s window of its third per period in a
    # burst, plus the requests it had in flight when the throttle began (librdkafka's 256 KiB
    # queue: up to three 64 KiB batches past the one that crossed), so a 5 s window that catches
    # the three bursts holds 5.5/5 = 1.1 x and up to 3 x 192 KiB / 5 s = 0.11 x more (1.157-1.182 x
    # measured; docs/fleet.md). A restart moves the shares twice: the survivors' raise to a half is
    # owed over one window (no burst), and the rejoin is made room for before the joiner's clients
    # come back (`quotas.fleet`, "Making room for a newcomer"); a move the fleet could not foresee
    # admits at most the joiner's third for one report interval: 1/3 x 0.5 s / 5 s = 0.033 x. The
    # bound: the same run's steady worst window (never under the token bucket's 1.15 x) + 0.033 x.
    bound = max(1.15 * QUOTA, run.worst_before) + QUOTA / 30
    assert worst <= bound, (f"{worst / QUOTA:.3f} x the budget over 5 s at {worst_start:.2f} s; steady "
                            f"{run.worst_before / QUOTA:.3f} x")
