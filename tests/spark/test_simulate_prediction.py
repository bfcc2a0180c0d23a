"""Prediction against reality: `tune simulate` predicts what a plan does to recorded traffic, and
real Sluice enforcing that plan on the same paced real clients does it.

Run 1 records four paced librdkafka clients through Sluice under quotas far above their demand:
a steady producer, a bursty one, a flooder and a consumer whose demand is a paced feeder's output.
`sluice tune simulate` replays run 1's access log through a plan with lower quotas. Run 2 enforces
that plan on the same clients, paced the same way. Per entity, the predicted throttled seconds,
total throttle time and admitted bytes per second match run 2's access log and the clients' own
throughput.

The bound, ±10 % (derived for these numbers; the rates are the run's whole span, ~22.5 s):
* the quota window is 11 x 500 ms, so the windowed rate's sawtooth has a period of at most one
  window (5.5 s); a run of ~22.5 s holds 4 periods, and where the last period is cut differs by at
  most one 500 ms sample of the quota between prediction and run: 0.5 / 22.5 = 2.2 %;
* both runs are judged over the same span: each is cut SECONDS after the barrier that starts its
  clients (`Run.until_ms`: the access log's records before it, the clients' bytes before it; the
  simulation reads run 1's log with `--until`), not where each log happens to end (the clients'
  flush and close after SECONDS, 1.35 s longer in one loaded run 2 than in its run 1, put 7.4 %
  on a throttle total). What still differs is when each client starts after the barrier (every
  client is connected and knows its topic's leader before it; librdkafka's first request comes
  up to one linger or fetch wait later): up to ~0.5 s in a 22.5 s span: 2.2 %;
* the consumer is admitted in steps: after a fresh window's ~5 s of quota it is throttled, and then
  each fetch it is given is capped (KAFKA-9677) at (samples - 1) x size_ms of quota = 10 x 0.5 s x
  40 KiB/s = C = 200 KiB, which holds the 5.5 s window: the next fetch is emptied and throttled
  2C/q - W = 10 - 5.5 = 4.5 s (seen 4.5 to 5 s: the sample it lands in), twice, so a step comes
  every ~9.5 s, at ~9.3 s and ~18.8 s after the start and next at ~28 s. A step is 200 KiB in
  ~700 KiB, far more than 10 %; so the run lasts 22.5 s, ending 3.7 s after a step and 5 s before
  the next: a shift of the start by up to ~3 s cannot change the number of steps (a 20 s run,
  ending 1.2 s after the second step, lost it once to a consumer 1.2 s late: -27 %). 22.5 s is
  also three whole periods of the bursty producer;
* the consumer's demand is the feeder's output when it was produced (`fetch_demand`), not run 1's
  fetches, which come when the consumer asked: a few ms to 500 ms (fetch.wait.max.ms) apart, and
  later still when run 1 ran on a loaded machine;
* which step the consumer's last ~5 s mute falls in is chaotic: a record 76 ms earlier in the
  demand moves its early small throttles (0.3, 0.7, 1.9 s against 0.4, 1.5, 4.5 s) and with them
  the phase of every later mute by up to a second. So the throttle totals compared are the time
  muted within the run (each mute cut at the end of the log, as the simulation's
  `throttle_total_ms` is): for a client throttled without a break that is the time from its first
  throttle to the end, whatever the phase; the decisions' own sum adds the last mute's overhang
  past the end, 0 to 5 s of ~20 (seen 19,468 predicted against 21,911 in one loaded run, while the
  time muted within the run agreed to 2 %);
* requests are batches (a paced producer's records of LINGER_MS = 100 ms, at most BATCH = 16 KiB):
  a run can admit one batch more or less at its end than the prediction: 16 KiB in >= 40 KiB/s x
  22.5 s = 900 KB: 1.8 %;
* client-side throughput counts record values, the log counts the wire (batch and record headers,
  request and response framing). A producer's requests are the same batches in both runs: run 1's
  own ratio converts its prediction. A consumer's is not: run 1's responses are many small ones
  (4 to 8 KiB, ~5 % of framing) where run 2's are 200 KiB ones (~0.05 %), and both runs admit the
  same wire bytes (the quota counts them), so run 1's ratio put its client bytes 3.5 to 6.4 % below
  run 2's in the previous session's runs. The consumer reads the feeder's batches as they were
  written: the feeder's record values over its record-set bytes in run 1 (`value_per_record_set_byte`)
  convert it, and leave ~1 % (run 2's responses during the fresh window, as small as run 1's);
* a Fetch response over 64 KiB is streamed through Sluice and its log record has no topics: a
  run-1 consumer that catches up on a backlog does so in streamed responses (168 KB of 1.95 MB in
  one run). `fetch_demand` puts them in the consumer's partition; before it did, that run's
  prediction of the consumer's admitted rate was 8.8 % low (and +14.6 % on client bytes, with
  the ratio above);
* a throttled produce's mute ends after the broker's response plus the throttle (KIP-219); the
  replay takes that response time as the broker's service time (`quotas.replay.service_time_ms`:
  the mean wait of run 1's produces that found the broker idle, 1 to 7 ms in run 1 at loads of
  20 to 40), not the recorded waits, which hold the queues of an unthrottled run (one client's
  ran to 5.3 s). A producer is throttled ~b/q per cycle: each millisecond of response time
  mispredicted moves its throttle total by 1/(b/q) of it;
* load: run 2's broker answers a throttled produce and Sluice reads the muted client's next
  request when the machine lets them, which on a loaded machine is later than run 1's mean
  idle-broker wait: at a load of 35 to 41 (one `yes` hog and four sessions' tests) the throttled
  produces of run 2 waited 9 to 12 ms on average where run 1 had measured 5 ms. With 4 KiB
  requests (b/q = 80 to 100 ms) that was -7.4 and -9.4 % on the producers' throttle totals; with
  the paced producers' 100 ms batches, ~15 KiB (b/q = 300 to 400 ms), 7 ms is ~2 %, and 20 ms
  of extra wait 5 to 7 %. The replay cannot know the load of a later run: this is the term that
  grows with it. Within the whole suite on 2 cores (load 10 to 15, three Kafka JVMs beside) one
  run 2 gave -15 % and -12 % on the two producers' throttle totals while their admitted rates
  agreed to 2 %: ~90 ms a cycle more than run 1's wait. So the test measures the term in run 2
  and adds it back: a backlogged producer's cycle is its mute and the time from the mute's end to
  its next request, and its throttle is the rest of its b/q, so each millisecond of that time
  beyond the service time the replay assumed is a millisecond of throttle it did not get
  (`late_ms`: both producers stay backlogged once throttled, the bursty one's 125 KiB/s bursts
  average 50 KiB/s against its 40). The same fewer, larger requests keep run 1's broker up with
  the flooder under load (a run 1 at load ~30 with one-record requests recorded the flooder 2.1 s
  behind its pace);
* run 1 records the demand only if the broker keeps up with it: a cold broker JVM on a loaded
  machine held the flooder's and the feeder's produces for up to 5.3 s in its first ~9 s, so run
  1 recorded their demand seconds late (and the prediction's first throttles came 1.6 s and 6 s
  late: -8 % and -29 % on the throttle totals). The test first warms the broker to the flooder's
  pace (`broker_keeps_pace`), and checks that run 1 recorded every paced client within 1 s of
  its pace at every second (`recorded_pace_lag_s`): the recording is then the demand, as the
  test claims, or the test says it is not.
Per measure, the terms add up to: throttle totals 2.2 + 2.2 = 4.4 % with run 2's late time added back
(the cut and the start offset are as likely to cancel as to add); admitted rates
2.2 + 2.2 + 1.8 + ~1 = 7.2 %; client bytes the same,
and ~1 % more for the consumer (its ratio, above), whose rate terms are under 3 %. ±10 % holds these,
and a wrong model (no mute, no backlog, no un-record) misses by far more: a flooder that is not
muted would be admitted at its 150 KiB/s demand, 3x.
Throttled seconds are whole seconds of ~22: a boundary second more or less is 4.5 %, also within.
Seen on the 2-core machine shared with three other sessions' work (a whole test suite and a
benchmark among it), 5 runs of this version (both runs cut at the same span): two with nothing
of mine beside them (loads 17 to 23 and 1 to 5), three with a `yes` hog on one core (17 to 21,
12 to 18, 18 to 25): worst errors 2.9 % on throttle totals, 1.8 % on an admitted rate, 3.2 % on
client bytes, 1 of 21 on throttled seconds; the flooder's long-run rate +4.3 to +7.5 % over its
quota. Before the cut
(each log to its own end), 7 runs at loads of 9 to 39: worst 7.4 % on throttle totals and 6.4 %
on an admitted rate, all in one direction, in the run whose run 2's log ended 1.35 s later after
the clients' start than run 1's. With one-record requests of 4 KiB batches at linger 5 ms, at a
load of 13 to 41 with a hog: -9.4 % on the bursty producer's throttle total, and one run 1 (load
~30) that recorded the flooder 2.1 s behind its pace.
"""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from contracts.access_log import FETCH_API_KEY, PRODUCE_API_KEY
from quotas.replay import service_time_ms
from spark_analytics.jobs import simulate as simulate_job
from spark_analytics.session import Progress
from tests.conftest import create_topic, unique_name
from tests.harness.kafka import KafkaCluster
from tests.harness.load import Timeline
from tests.harness.sluice import SluiceProcess
from tests.harness.wait import eventually, poll

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

KiB = 1024
SECONDS = 22.5  # see the module's docstring: the consumer's steps and the bursty periods
WINDOW = {"samples": 11, "size_ms": 500}
RECORD = 1000
BATCH = 16 * KiB
LINGER_MS = 100  # a paced producer's requests: its records of 100 ms (see the docstring: load)

# client-id -> (quota key, demand in B/s, run 1 quota, plan quota)
STEADY, BURSTY, FLOOD = "sim-steady", "sim-bursty", "sim-flood"
CONSUMER, FEEDER = "sim-consumer", "sim-feeder"
HIGH = 50 * 1024 * KiB
PLAN = {
    STEADY: ("producer_byte_rate", 25 * KiB),    # demand 15 KiB/s: never throttled
    BURSTY: ("producer_byte_rate", 40 * KiB),    # mean 50 KiB/s in 3 s bursts of 125 KiB/s
    FLOOD: ("producer_byte_rate", 50 * KiB),     # demand 150 KiB/s
    CONSUMER: ("consumer_byte_rate", 40 * KiB),  # the feeder's 75 KiB/s
}
DEMAND = {STEADY: 15 * KiB, FLOOD: 150 * KiB, FEEDER: 75 * KiB}


def bursty_rate(t: float) -> float:
    """125 KiB/s for the first 3 s of every 7.5 s, else nothing: 50 KiB/s on average."""
    return 125 * KiB if t % 7.5 < 3.0 else 0.0


def knows_leader(client: Any, topic: str) -> None:
    """Wait until `client` has its topic's leader: a client that learns it only after the start
    (a fresh topic reaches the broker's metadata a little after CreateTopics returns, and librdkafka
    asks again only after a backoff) starts its traffic up to ~2 s late, in one run and not the
    other, and the prediction would be of traffic shifted in time."""
    eventually(lambda: client.list_topics(topic, timeout=10),
               lambda md: topic in md.topics and md.topics[topic].error is None
               and all(p.leader >= 0 for p in md.topics[topic].partitions.values())
               and len(md.topics[topic].partitions) > 0, timeout_s=30)


def paced_produce(bootstrap: str, topic: str, client_id: str, rate_of: Any, seconds: float,
                  start: threading.Barrier) -> Timeline:
    """Produce 1000-byte records at `rate_of(t)` B/s (t from the start), in batches of LINGER_MS; what
    falls behind the pace is sent as soon as the client can (the backlog carries over)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "linger.ms": LINGER_MS,
                         "batch.size": BATCH, "queue.buffering.max.kbytes": 16 * 1024, "acks": 1})
    timeline = Timeline()
    value = b"x" * RECORD

    def delivered(err: object, msg: object) -> None:
        if err is None:
            timeline.add(RECORD)

    knows_leader(producer, topic)
    start.wait()
    t0 = timeline.started = time.monotonic()
    owed = 0.0
    last = t0
    while (now := time.monotonic()) < t0 + seconds:
        owed += rate_of(now - t0) * (now - last)
        last = now
        while owed >= RECORD:
            try:
                producer.produce(topic, value, on_delivery=delivered)
            except BufferError:
                break
            owed -= RECORD
        producer.poll(0.005)
    producer.purge()  # what is still queued at the end was not admitted
    producer.flush(30)
    return timeline


def consume(bootstrap: str, topic: str, seconds: float, start: threading.Barrier) -> Timeline:
    """Read the topic's one partition from offset 0, assigned at the start (no group join and no
    offset lookup, whose timing differs from run to run: the consumer's demand is the feeder's
    output from the moment it is produced, in both runs)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_name("sim-group"),
                         "client.id": CONSUMER, "enable.auto.commit": False})
    knows_leader(consumer, topic)
    timeline = Timeline()
    start.wait()
    consumer.assign([TopicPartition(topic, 0, 0)])  # librdkafka fetches from the assignment on
    timeline.started = time.monotonic()
    try:
        while time.monotonic() < timeline.started + seconds:
            msg = consumer.poll(0.1)
            if msg is not None and msg.error() is None:
                timeline.add(len(msg.value() or b""))
    finally:
        consumer.close()
    return timeline


def warm_up(bootstrap: str, topics: tuple[str, ...]) -> None:
    """One record into each fresh topic, acknowledged, before anyone starts: a fresh partition's
    first appends were seen taking ~1 s on a loaded machine (the feeder's first produces waited
    262 to 1048 ms in one run 1 and 1 to 3 ms in its run 2), which delays the consumer's data in
    one run and not the other. The consumer reads this record too: 1 KB in ~1.7 MB."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "client.id": "sim-warm-up", "acks": 1})
    for topic in topics:
        producer.produce(topic, b"x" * RECORD)
    assert producer.flush(60) == 0


def broker_keeps_pace(bootstrap: str) -> None:
    """Produce straight to the broker at the flooder's pace (150 one-record requests a second,
    linger 5 ms) until, in one whole second, it acknowledged at least 90 % of them and none later
    than 100 ms after it was produced. A cold broker JVM on a loaded machine answered the
    flooder's first produces through Sluice after up to 5.3 s for its first ~9 s (while the steady
    client's, one at a time, took < 0.7 s): run 1 recorded 15 to 40 KiB/s of the flooder's and
    the feeder's paced demand for 8 s and then 813 KiB in one second, the demand moved by seconds,
    and the prediction was of that (its first throttle 1.6 s later than run 2's: -8 % on the
    throttle total). Run 2's broker is warm; so is run 1's now."""
    from confluent_kafka import Producer

    topic = create_topic(bootstrap, unique_name("sim-warm-broker"))
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": "sim-warm-broker", "linger.ms": 5,
                         "acks": 1})
    knows_leader(producer, topic)
    seconds: list[tuple[int, float]] = []

    def one_second() -> bool:
        latencies: list[float] = []

        def delivered(sent_at: float) -> Any:
            return lambda err, msg: None if err else latencies.append(time.monotonic() - sent_at)

        t0 = time.monotonic()
        for k in range(150):
            while time.monotonic() < t0 + k / 150:
                producer.poll(0.001)
            producer.produce(topic, b"x" * RECORD, on_delivery=delivered(time.monotonic()))
        producer.poll(0.1)
        seconds.append((len(latencies), max(latencies, default=math.inf)))
        return len(latencies) >= 135 and max(latencies) <= 0.1

    kept_pace = poll(one_second, timeout_s=90, interval_s=0)
    producer.flush(30)
    assert kept_pace, f"the broker never kept the flooder's pace: (acknowledged, slowest s) {seconds}"


def recorded_pace_lag_s(logs: Path, client: str, rate: float) -> float:
    """How far, in seconds of its pace, a paced producer's recorded produce bytes fell behind its
    pace at any whole second of the recording (0 when they kept it): `rate` B/s from its first
    recorded request on."""
    rows = sorted((r["ts_ms"], r["request_bytes"]) for path in logs.rglob("*.jsonl")
                  for r in map(json.loads, path.read_text().splitlines())
                  if r["client_id"] == client and r["api_key"] == PRODUCE_API_KEY)
    first_ms, end_ms = rows[0][0], rows[-1][0]
    worst, total, k = 0.0, 0, 0
    for second_ms in range(first_ms + 1000, end_ms, 1000):
        while k < len(rows) and rows[k][0] < second_ms:
            total += rows[k][1]
            k += 1
        worst = max(worst, ((second_ms - first_ms) / 1000 * rate - total) / rate)
    return worst


def recorded_waits(logs: Path) -> list[tuple[int, float]]:
    """Every answered produce's (ts_ms, broker wait in whole ms) in `logs`, as the simulation reads
    them for the broker's service time."""
    return [(r["ts_ms"], int(r["upstream_latency_ms"] + 0.5))  # half up, as Spark's round
            for path in logs.rglob("*.jsonl") for r in map(json.loads, path.read_text().splitlines())
            if r["api_key"] == PRODUCE_API_KEY and r["upstream_latency_ms"] is not None]


def value_per_record_set_byte(logs: Path, client: str) -> float:
    """A producer's record values (RECORD bytes each) per byte of the record sets it wrote (batch
    and record headers included, request framing not), from its produce requests in `logs`."""
    records = size = 0
    for path in logs.rglob("*.jsonl"):
        for r in map(json.loads, path.read_text().splitlines()):
            if r["client_id"] == client and r["api_key"] == PRODUCE_API_KEY:
                records += sum(t["records"] for t in r["topics"] or [])
                size += sum(t["bytes"] for t in r["topics"] or [])
    return RECORD * records / size


@dataclass(frozen=True)
class Run:
    """One run's clients, and the instant they were all let go (the barrier), on the epoch clock
    (the access log's `ts_ms`) and on the monotonic one (the clients' `Timeline`s)."""

    clients: dict[str, Timeline]
    start_ms: int
    start_mono: float

    @property
    def until_ms(self) -> int:
        """Where the run is cut: SECONDS after its start. Both runs are judged over the same span
        from their start (the log's records before it, the clients' bytes before it), not to
        where each log happens to end: the clients' flush and close after SECONDS took 1.35 s
        longer in one loaded run 2 than in its run 1 (see the docstring)."""
        return self.start_ms + round(SECONDS * 1000)

    def client_bytes(self, client: str) -> int:
        """The bytes the client delivered (a producer) or read (the consumer) before the cut."""
        cut = self.start_mono + SECONDS
        return sum(n for at, n in self.clients[client].events if at < cut)


def traffic(bootstrap: str) -> Run:
    """All five clients at once for SECONDS, paced the same way every time."""
    produce_topic = create_topic(bootstrap, unique_name("sim-produce"))
    feed_topic = create_topic(bootstrap, unique_name("sim-feed"))
    warm_up(bootstrap, (produce_topic, feed_topic))
    out: dict[str, Timeline] = {}
    jobs = {
        STEADY: lambda: paced_produce(bootstrap, produce_topic, STEADY, lambda t: DEMAND[STEADY], SECONDS,
                                      start),
        BURSTY: lambda: paced_produce(bootstrap, produce_topic, BURSTY, bursty_rate, SECONDS, start),
        FLOOD: lambda: paced_produce(bootstrap, produce_topic, FLOOD, lambda t: DEMAND[FLOOD], SECONDS,
                                     start),
        FEEDER: lambda: paced_produce(bootstrap, feed_topic, FEEDER, lambda t: DEMAND[FEEDER], SECONDS,
                                      start),
        CONSUMER: lambda: consume(bootstrap, feed_topic, SECONDS, start),
    }
    # every client starts once all of them are ready (connected, the topics' leaders known)
    start = threading.Barrier(len(jobs) + 1, timeout=60)
    threads = [threading.Thread(target=lambda n=n, f=f: out.__setitem__(n, f()), daemon=True)
               for n, f in jobs.items()]
    for t in threads:
        t.start()
    start.wait()
    start_ms, start_mono = time.time_ns() // 1_000_000, time.monotonic()
    for t in threads:
        t.join(SECONDS + 60)
    assert set(out) == set(jobs), f"clients that did not finish: {set(jobs) - set(out)}"
    return Run(out, start_ms, start_mono)


def config(logs: Path, values: dict[str, float]) -> dict[str, Any]:
    entries = [{"client_id": c, PLAN[c][0]: v} for c, v in values.items()]
    entries.append({"client_id": FEEDER, "producer_byte_rate": HIGH})
    return {"access_log": {"dir": str(logs), "format": "json"},
            "quotas": {"window": WINDOW, "entries": entries}}


def observed(logs: Path, until_ms: int, service_ms: int = 0) -> dict[str, dict[str, float]]:
    """Per client-id, from an access log's records before `until_ms` (the simulation's `--until`):
    throttled seconds (seconds overlapping a mute [ts, ts + throttle)), total throttle ms, and
    admitted bytes per second from its first request to the end of the log so cut (the
    simulation's span). `late_ms`, a producer's: the time from each throttled produce's mute end
    to its next produce beyond `service_ms`, the wait the replay gives it (see the docstring)."""
    records: dict[str, list[dict[str, Any]]] = {}
    log_end_ms = 0
    for path in logs.rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if r["ts_ms"] >= until_ms:
                continue
            log_end_ms = max(log_end_ms, r["ts_ms"] + 1)
            if r["client_id"] in PLAN:
                records.setdefault(r["client_id"], []).append(r)
    out = {}
    for client, rows in records.items():
        key = PLAN[client][0]
        api = PRODUCE_API_KEY if key == "producer_byte_rate" else FETCH_API_KEY
        mine = sorted((r for r in rows if r["api_key"] == api), key=lambda r: r["ts_ms"])
        # as the simulation's: from the client's first request to the end of the whole log (a
        # consumer muted at the end has no request there, but the time is its)
        span_s = (log_end_ms - mine[0]["ts_ms"]) / 1000
        size = "request_bytes" if api == PRODUCE_API_KEY else "response_bytes"
        seconds: set[int] = set()
        muted_ms = 0
        late_ms = sum(max(n["ts_ms"] - (r["ts_ms"] + r["throttle_time_ms"]) - service_ms, 0)
                      for r, n in itertools.pairwise(mine)
                      if api == PRODUCE_API_KEY and r["throttle_time_ms"] > 0)
        for r in mine:
            # the time muted within the run, as the simulation's total (see the docstring)
            muted_ms += max(min(r["ts_ms"] + r["throttle_time_ms"], log_end_ms) - r["ts_ms"], 0)
            if r["throttle_time_ms"] > 0:
                end_ms = r["ts_ms"] + r["throttle_time_ms"]
                seconds.update(range(r["ts_ms"] // 1000, (end_ms - 1) // 1000 + 1))
        end_s = (log_end_ms - 1) // 1000
        # the fidelity bench's long-run rate: after the first N x W, where a fresh sensor's padded
        # window lets a client burst, over whole periods of a throttled client's sawtooth: from the
        # first burst (a request admitted unthrottled after a throttled one) to the last burst's
        # start; a start within 2 s of the one before is the same burst (a period is ~6.5 s, a
        # burst under 2 s). A client with fewer than two bursts: to the end of the log
        fresh_ms = mine[0]["ts_ms"] + WINDOW["samples"] * WINDOW["size_ms"]
        starts: list[int] = []
        for r, n in itertools.pairwise(mine):
            if (r["throttle_time_ms"] > 0 and n["throttle_time_ms"] == 0 and n["ts_ms"] >= fresh_ms
                    and (not starts or n["ts_ms"] - starts[-1] > 2000)):
                starts.append(n["ts_ms"])
        first_ms, last_ms = (starts[0], starts[-1]) if len(starts) >= 2 else (fresh_ms, log_end_ms)
        whole = sum(r[size] or 0 for r in mine if first_ms <= r["ts_ms"] < last_ms)
        out[client] = {"long_run_per_s": whole / max(last_ms - first_ms, 1) * 1000,
                       "periods": max(len(starts) - 1, 0),
                       "throttled_seconds": len({s for s in seconds if s <= end_s}),
                       "throttle_total_ms": muted_ms, "late_ms": late_ms,
                       "admitted_per_s": sum(r[size] or 0 for r in mine) / span_s, "span_s": span_s}
    return out


def within(got: float, want: float, rel: float = 0.10) -> bool:
    return abs(got - want) <= rel * abs(want)


def test_simulate_predicts_what_sluice_then_does(kafka: KafkaCluster, spark: SparkSession,
                                                 tmp_path: Path) -> None:
    broker_keeps_pace(kafka.bootstrap)
    # Run 1: everyone far under a quota of 50 MiB/s: the recording is the demand, uncensored.
    with SluiceProcess(kafka.bootstrap, tmp_path / "run1", config=config(
            tmp_path / "logs1", {c: HIGH for c in PLAN})) as sluice:
        first = traffic(sluice.bootstrap)
    recorded = observed(tmp_path / "logs1", first.until_ms)
    assert all(v["throttle_total_ms"] == 0 for v in recorded.values())
    # the recording is the demand: the paced producers were carried at their pace for the whole
    # run (a broker too slow to keep up would record less, and the prediction would be of that)
    for c, want in ((STEADY, DEMAND[STEADY]), (FLOOD, DEMAND[FLOOD])):
        assert recorded[c]["span_s"] >= 0.9 * SECONDS, (c, recorded[c])
        assert recorded[c]["admitted_per_s"] >= 0.9 * want, (c, recorded[c])
    # ... and when it happened: the paced clients' recorded bytes never fell more than 1 s of
    # their pace behind it (a broker answering in tens of ms keeps them within ~0.1 s; the cold
    # broker of `broker_keeps_pace` put the flooder 4.6 s behind, and the feeder, whose output is
    # the consumer's demand, as far)
    for c in (STEADY, FLOOD, FEEDER):
        lag_s = recorded_pace_lag_s(tmp_path / "logs1", c, DEMAND[c])
        assert lag_s <= 1.0, f"run 1 recorded {c} {lag_s:.1f} s behind its pace: not its demand"

    plan_dir = tmp_path / "plan"
    plan_dir.mkdir()
    entries = [{"entity": f"client-id={c}", "quota_key": key, "matched_entity": f"client-id={c}",
                "current": float(HIGH), "recommended": value, "action": "decrease",
                "reason": "the test's plan"}
               for c, (key, value) in PLAN.items()]
    (plan_dir / "plan.json").write_text(json.dumps({"format": "sluice.quota-plan/1", "generated_at": "",
                                                    "policy": {}, "input": {}, "entries": entries}))
    # the job itself (`sluice tune simulate`'s `run`), in the Spark tests' session: a JVM of its own
    # would add its start and a cold JIT to the test, not to what it proves (the job's command
    # line runs in tests/spark/test_simulate.py); run 1's log cut where run 2's is (`Run.until_ms`)
    args = simulate_job.build_parser().parse_args(
        ["--logs", str(tmp_path / "logs1"), "--until", str(first.until_ms),
         "--plan", str(plan_dir / "plan.json"), "--window-samples", str(WINDOW["samples"]),
         "--window-size-ms", str(WINDOW["size_ms"]), "--no-plots"])
    with Progress(spark, "simulate", enabled=False) as progress:
        sim = simulate_job.run(spark, args, progress, quiet=True)
    predicted = {e["entity"].removeprefix("client-id="): e["plan"] | {"span_s": e["span_s"]}
                 for e in sim["entities"]}
    assert sorted(predicted) == sorted(PLAN)

    # Run 2: Sluice enforces the plan on the same paced clients.
    with SluiceProcess(kafka.bootstrap, tmp_path / "run2", config=config(
            tmp_path / "logs2", {c: v for c, (_, v) in PLAN.items()})) as sluice:
        second = traffic(sluice.bootstrap)
    # the service time the replay gave a throttled produce (its `broker_service_ms`, one broker)
    service_ms = service_time_ms(recorded_waits(tmp_path / "logs1"))
    real = observed(tmp_path / "logs2", second.until_ms, service_ms)
    # the client counts record values, the log the wire: a producer's ratio is its own in run 1;
    # the consumer's, the feeder's values per record-set byte (see the docstring)
    value_per_wire_byte = {c: first.client_bytes(c) / (recorded[c]["admitted_per_s"] * recorded[c]["span_s"])
                           for c in PLAN}
    value_per_wire_byte[CONSUMER] = value_per_record_set_byte(tmp_path / "logs1", FEEDER)
    report = {c: {"predicted": {k: predicted[c][k] for k in ("throttled_seconds", "throttle_total_ms",
                                                             "admitted_per_s", "demand_per_s")},
                  "run1": recorded[c], "run2": real[c],
                  "client_bytes": second.client_bytes(c),
                  "predicted_client_bytes": predicted[c]["admitted_per_s"] * predicted[c]["span_s"]
                  * value_per_wire_byte[c]}
              for c in PLAN}
    print(json.dumps(report, indent=1))

    # the steady producer is under its quota: neither predicted nor run throttles it
    assert predicted[STEADY]["throttled_seconds"] == real[STEADY]["throttled_seconds"] == 0
    # the others' throttles, from run 2's access log (a Fetch Sluice answers empty is logged with
    # the throttle_time_ms its consumer was told)
    for c in (BURSTY, FLOOD, CONSUMER):
        p, r = predicted[c], real[c]
        assert p["throttled_seconds"] > 0, c
        assert within(r["throttled_seconds"], p["throttled_seconds"]), (c, report[c])
        # a producer's time between cycles beyond the replay's service time (0 for the consumer)
        assert within(r["throttle_total_ms"] + r["late_ms"], p["throttle_total_ms"]), (c, report[c])
    for c in PLAN:
        p, r = predicted[c], real[c]
        assert within(r["admitted_per_s"], p["admitted_per_s"]), (c, report[c])
        assert within(report[c]["client_bytes"], report[c]["predicted_client_bytes"]), (c, report[c])
    # the flooder's admitted rate is the quota's, as the fidelity bench measures it: after the first
    # N x W = 5.5 s (a fresh sensor's padded window lets it burst), over whole periods. A backlogged
    # client of 16 KiB requests is admitted in a sawtooth: throttled ~0.8 s per batch while a burst
    # is in the window, then, as the burst's samples leave it, a burst again (of up to (N - 1) x size
    # of quota); seen every ~6.5 s, at ~6-7, ~13 and ~19.5 s after its first request, so two whole
    # periods before the cut. Over whole periods Kafka's throttle holds the mean to the quota, plus
    # up to one batch a period (16 KiB / 6.5 s = 4.9 %). Seen: -0.0 and +3.8 % (the second a run
    # whose first burst came at 7.0 s: from the fresh window to the cut, that span held three bursts
    # in 16 s, +10.4 %, which is why the span is whole periods)
    assert real[FLOOD]["periods"] >= 1, report[FLOOD]
    assert within(real[FLOOD]["long_run_per_s"], PLAN[FLOOD][1]), report[FLOOD]
