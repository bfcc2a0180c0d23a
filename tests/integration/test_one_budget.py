"""One budget for every quota kind, across three Sluice processes in one fleet and across the three
workers of one instance: real Kafka, real Sluice processes, librdkafka producers.

Each case configures one budget of 1 MiB/s (or 1 024 records/s of 1 000 B), under the token
bucket (so a plain rate over a span is fair: no sawtooth to cut through), and runs three
producers, one per instance (or nine, spread over the workers), that together want far more.

The bound, ±5 % over the measured span T = 2 x 5.5 s = 11 s after the first period (5.5 s, the
fleet settles its shares and the fresh bucket's burst is spent):
- the bucket's burst, 250 ms of quota, can land inside the span at most once: 0.25 / 11 = 2.3 %;
- each producer connection may land one request past its check (64 KiB; 16 KiB for the nine of
  the workers case): 3 x 64 KiB / (1 MiB/s x 11 s) = 1.7 % (9 x 16 KiB: 1.3 %);
- together under 4.1 %, so 1.05 holds a correct budget, and a budget each process enforces in
  full (about 3 x, what old main did for every kind but Kafka's client-id and user entities)
  fails it by far.

Below, 0.90: alone the cases hold at least 0.95, but within the whole suite on 2 cores (a load of
10-15) the producers and the fleet's share exchange, not the budget, set the rate at times (0.930
x was measured in two full runs, for the prefix and topic-prefix cases). 0.90 still fails a
budget whose shares add up to less than the whole (one member's share lost: 0.67 x).

Failing on old main (as issue 26 measured them, not re-run here): the client-id-prefix, user +
prefix, topic and topic-prefix cases (each process enforced the whole budget, and the usage report
dropped the prefix: 2.95 x and 2.96 x for prefix and topic). The record- and request-rate kinds
of a client-id entry were shared already on old main; their cases guard that.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import create_topic, unique_name
from tests.harness import load
from tests.harness.kafka import KafkaCluster, free_port
from tests.harness.metrics import Metrics
from tests.harness.quotas import PERIOD_S, WINDOW, KiB, MiB
from tests.harness.sluice import SluiceProcess
from tests.harness.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUOTA = MiB
RECORD = 1000
MEASURED_S = 2 * PERIOD_S
TOKEN_BUCKET = {"window": WINDOW, "rate_model": "token_bucket", "burst_ms": 250}


@dataclass(frozen=True)
class Case:
    """One budget: its entry, the client ids of the producers and the topic each writes, and how
    to read the budget's unit from the bytes delivered."""

    entry: Callable[[str], dict[str, Any]]      # topic -> the entry
    client_ids: tuple[str, str, str]
    topic_prefix: str = "ob-"
    per_unit_bytes: float = 1.0                 # bytes per unit of the budget
    principal_from_address: bool = False
    budget: float = QUOTA                       # in bytes per second
    producer: tuple[tuple[str, object], ...] = ()  # librdkafka settings of every producer


CASES = {
    "client_id_prefix": Case(lambda t: {"client_id_prefix": "etl-", "producer_byte_rate": QUOTA},
                             ("etl-1", "etl-2", "etl-3")),
    # the principal is the client's address (principal_from: client_address): user 127.0.0.1
    "user_and_prefix": Case(lambda t: {"user": "127.0.0.1", "client_id_prefix": "etl-",
                                       "producer_byte_rate": QUOTA},
                            ("etl-1", "etl-2", "etl-3"), principal_from_address=True),
    "topic": Case(lambda t: {"topic": t, "producer_byte_rate": QUOTA}, ("free-1", "free-2", "free-3")),
    "topic_prefix": Case(lambda t: {"topic_prefix": "obp-", "producer_byte_rate": QUOTA},
                         ("free-1", "free-2", "free-3"), topic_prefix="obp-"),
    # 1 048.576 records/s of 1 000 B: the same bytes, counted in records
    "producer_record_rate": Case(lambda t: {"client_id": "rec-app", "producer_record_rate": QUOTA / RECORD},
                                 ("rec-app", "rec-app", "rec-app"), per_unit_bytes=RECORD),
    # one record per batch and one partition: one Produce request per record, so records/s are
    # requests/s (the few Metadata requests also count: a handful in 16.5 s, under 1 %);
    # 50 requests/s: the burst is 12.5 requests (2.3 % of 550 in 11 s)
    "request_rate": Case(lambda t: {"client_id": "req-app", "request_rate": 50},
                         ("req-app", "req-app", "req-app"), per_unit_bytes=RECORD, budget=50 * RECORD,
                         producer=(("batch.num.messages", 1), ("linger.ms", 0))),
}


def sluice_config(case: Case, topic: str, metrics_port: int) -> dict[str, Any]:
    config: dict[str, Any] = {"metrics": {"port": metrics_port},
                              "quotas": {**TOKEN_BUCKET, "entries": [case.entry(topic)]}}
    if case.principal_from_address:
        config["principal_from"] = "client_address"
    return config


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> Case:
    return CASES[request.param]


def flood(bootstraps: list[str], client_ids: list[str], topic: str, seconds: float,
          batch_bytes: int, settings: tuple[tuple[str, object], ...] = ()) -> list[load.Timeline]:
    """One librdkafka producer per (bootstrap, client id), started together."""
    timelines = [load.Timeline() for _ in bootstraps]

    def run(i: int) -> None:
        load.confluent_flood(bootstraps[i], topic, seconds, client_id=client_ids[i], record_size=RECORD,
                             batch_bytes=batch_bytes, timeline=timelines[i],
                             config={"log_level": 2, **dict(settings)})

    load.run_together([functools.partial(run, i) for i in range(len(bootstraps))], seconds + 60)
    return timelines


def judged(case: Case, timelines: list[load.Timeline], label: str) -> float:
    merged = load.Timeline.merged(timelines)
    rate = merged.rate(PERIOD_S, PERIOD_S + MEASURED_S) / case.per_unit_bytes
    budget = case.budget / case.per_unit_bytes
    print(f"{label}: {rate:.1f} per s over {MEASURED_S:g} s = {rate / budget:.3f} x the budget")
    return rate / budget


@pytest.fixture
def fleet_of_three(kafka: KafkaCluster, tmp_path: Path,
                   case: Case) -> Iterator[tuple[list[SluiceProcess], str]]:
    topic = create_topic(kafka.bootstrap, unique_name(case.topic_prefix))
    fleet_id = unique_name("fleet")
    store_topic = unique_name("_sluice_quotas")
    members: list[SluiceProcess] = []
    ports: list[int] = []
    try:
        for i in range(3):
            ports.append(free_port())
            config = {**sluice_config(case, topic, ports[-1]), "instance": f"sluice-{i}",
                      "store": {"type": "kafka", "topic": store_topic},
                      "fleet": {"id": fleet_id, "topic": f"{fleet_id}-reports"}}
            members.append(SluiceProcess(kafka.bootstrap, tmp_path / f"sluice-{i}", config=config).start())
        for metrics in [Metrics(port) for port in ports]:
            wait_until(lambda m=metrics: m.value("sluice_fleet_members") == 3, 30,  # type: ignore[misc]
                       "three fleet members")
        yield members, topic
    finally:
        for sluice in members:
            sluice.stop()


def test_three_instances_hold_one_budget_of_every_kind(
        fleet_of_three: tuple[list[SluiceProcess], str], case: Case) -> None:
    members, topic = fleet_of_three
    timelines = flood([s.bootstrap for s in members], list(case.client_ids), topic,
                      PERIOD_S + MEASURED_S, batch_bytes=64 * KiB, settings=case.producer)
    ratio = judged(case, timelines, "three instances")
    assert 0.90 <= ratio <= 1.05, f"{ratio:.3f} x the budget"


def test_three_workers_hold_one_budget_of_every_kind(kafka: KafkaCluster, tmp_path: Path, case: Case) -> None:
    topic = create_topic(kafka.bootstrap, unique_name(case.topic_prefix))
    port = free_port()
    sluice = SluiceProcess(kafka.bootstrap, tmp_path / "workers", workers=3,
                           config=sluice_config(case, topic, port)).start()
    metrics = Metrics(port)
    try:
        for w in ("0", "1", "2"):
            wait_until(lambda w=w: metrics.value("sluice_fleet_members", worker=w) == 3, 30,  # type: ignore[misc]
                       f"worker {w} to hear from three members")
        # A worker listens on a broker's port once a Metadata answer through it named that broker:
        # twenty bootstrap connections (SO_REUSEPORT spreads them) make every worker do so, with
        # probability 1 - 3 x (2/3)^20; nine producers then spread over the workers.
        from confluent_kafka.admin import AdminClient

        for _ in range(20):
            AdminClient({"bootstrap.servers": sluice.bootstrap}).list_topics(timeout=10)
        timelines = flood([sluice.bootstrap] * 9, list(case.client_ids) * 3, topic,
                          PERIOD_S + MEASURED_S, batch_bytes=16 * KiB, settings=case.producer)
        ratio = judged(case, timelines, "three workers")
        assert 0.90 <= ratio <= 1.05, f"{ratio:.3f} x the budget"
    finally:
        sluice.stop()
