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
            config = {"listen": listen_address(), "metrics": {"port": port}, "instance": f"sluice-{i}",
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

# ------------------------------------------------------------------------------------ rolling restart

def test_a_rolling_restart_keeps_every_five_seconds_within_the_budget(kafka: KafkaCluster,
                                                                     make_fleet: Any) -> None:
    """Fails on main: a restarted member enforced the whole quota until it had heard the fleet,
    with a fresh sensor's credit on top (2.3-2.6 x the budget in the second after each rejoin,
    1.29 x over the worst five seconds)."""
    topic = create_topic(kafka.bootstrap, unique_name("fleet-roll"))
    # the token bucket: a raised share refills at the new rate from the credits it holds (a windowed
    # rate would let a member whose share rose re-admit what a departed member used in the window)
    fleet = make_fleet(kafka, {"id": unique_name("fleet"), "topic": unique_name("fleet-reports")},
                       {"rate_model": "token_bucket"})
    producers = Producers([m.bootstrap for m in fleet.members], topic, 240)
    try:
        wait_until(lambda: producers.now_s() >= 2 * PERIOD_S, 30, "a steady fleet")
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
        producers.stop()
    merged = load.Timeline.merged(timelines)
    for i, t in enumerate(timelines):  # per second, per producer, for a post-mortem
        print(f"producer {i} KiB/s from {first_restart_s - 3:.0f} s: "
              + " ".join(f"{r / KiB:.0f}" for _, r in window_rates(t, first_restart_s - 3, end_s, 1.0, 1.0)))
    print("restarts at " + ", ".join(f"{s:.1f}" for s in restarts_s))
    before = window_rates(merged, PERIOD_S, first_restart_s, 5.0)
    during = window_rates(merged, first_restart_s, end_s, 5.0)
    worst_before = max(r for _, r in before)
    worst_start, worst = max(during, key=lambda w: w[1])
    print(f"rolling restart: worst 5 s window {worst / MiB:.3f} MiB/s (at {worst_start:.2f} s); before "
          f"the first restart, in the same run, {worst_before / MiB:.3f} MiB/s; whole run "
          f"{merged.cycle_rate(first_restart_s, end_s, or_plain=True) / MiB:.3f} MiB/s (budget 1 MiB/s)")
    # 5 s windows over a sawtooth of 5.5 s periods: a window holds at most one burst per producer,
    # about one period's worth of its share, so a steady fleet's worst window is up to 5.5/5 = 1.1 x
    # (the same-run 'before' figure); a rejoin may add its standby share for about one report
    # interval: 1/3 x 0.5 s / 5 s = 0.03 x. Bound: 1.15 x
    assert worst <= 1.15 * QUOTA, f"{worst / QUOTA:.3f} x the budget over 5 s at {worst_start:.2f} s"
    assert [m.metrics.value("sluice_fleet_members") for m in fleet.members].count(3) >= 1
    assert all(m.process is not None and m.process.process is not None
               and m.process.process.poll() is None for m in fleet.members)
