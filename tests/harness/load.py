"""Timed load from real clients, and rates measured from what the broker acknowledged.

Used by the quota tests and benchmarks: each function runs for a fixed time and returns
timestamped byte counts, so a rate can be computed over the steady part of the run only (after
the quota window has filled; Kafka lets a fresh sensor burst).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tests.harness.wait import wait_until


@dataclass
class Timeline:
    """(monotonic seconds, bytes) events, e.g. one per delivered or consumed record."""

    events: list[tuple[float, int]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    errors: dict[str, int] = field(default_factory=dict)  # delivery errors: message -> count

    @classmethod
    def merged(cls, timelines: Sequence[Timeline]) -> Timeline:
        """All events of several timelines as one, from the earliest start: the flow one shared
        budget admits, whose throttle cycles are the budget's own (the clients sharing it are
        throttled together), where each client's small part of it trickles too thinly for its own
        cycles to be found."""
        merged = cls(events=sorted(e for t in timelines for e in t.events),
                     started=min(t.started for t in timelines))
        for t in timelines:
            for error, count in t.errors.items():
                merged.errors[error] = merged.errors.get(error, 0) + count
        return merged

    def fail(self, error: str) -> None:
        with self.lock:
            self.errors[error] = self.errors.get(error, 0) + 1

    def add(self, nbytes: int, at: float | None = None) -> None:
        with self.lock:
            self.events.append((time.monotonic() if at is None else at, nbytes))

    @property
    def total_bytes(self) -> int:
        return sum(n for _, n in self.events)

    @property
    def count(self) -> int:
        return len(self.events)

    def rate_from_first(self, span_s: float) -> float:
        """Bytes per second over `span_s` seconds from the first event (so that connecting and
        joining a group do not count), including that first event."""
        first = min(t for t, _ in self.events)
        got = sum(n for t, n in self.events if first <= t < first + span_s)
        return got / span_s

    def cycle_rate(self, from_s: float, to_s: float, bin_s: float = 0.25, *, or_plain: bool = False) -> float:
        """Bytes per second over whole throttle cycles within [from_s, to_s]: from the first burst
        that starts in the range to the last one. A client held by Kafka's windowed rate moves in a
        sawtooth (a burst of about one window's quota, then a mute), so a rate over a span that is
        not a whole number of cycles is off by up to one burst; over whole cycles it is not. Bursts
        are found over the whole timeline (so one right at the range's start counts): a burst starts
        at a bin of more than twice the mean rate of the busy part of the timeline, with no such bin
        in the second before it (between bursts a muted client may still trickle a batch now and
        then). With fewer than two burst starts in the range (a client held to a small share can
        trickle rather than burst) it raises, or with `or_plain` returns the plain rate."""
        if not self.events:
            raise AssertionError(f"no events (delivery errors: {self.errors or 'none'})")
        last = max(t for t, _ in self.events) - self.started
        n = max(1, int(last / bin_s) + 1)
        bins = [0] * n
        for t, nbytes in self.events:
            i = int((t - self.started) / bin_s)
            if 0 <= i < n:
                bins[i] += nbytes
        lo, hi = int(from_s / bin_s), min(n, int(to_s / bin_s) + 1)
        mean = sum(bins[lo:hi]) / max(1, hi - lo)
        quiet_bins = max(1, int(1.0 / bin_s))
        starts = [i for i in range(lo, hi)
                  if bins[i] > 2 * mean and all(b <= 2 * mean for b in bins[max(0, i - quiet_bins):i])]
        if len(starts) < 2 and or_plain:
            return sum(bins[lo:hi]) / ((hi - lo) * bin_s)
        if len(starts) < 2:
            raise AssertionError(f"fewer than two throttle cycles between {from_s:g} s and {to_s:g} s: "
                                 f"bins {bins[lo:hi]}")
        first, final = starts[0], starts[-1]
        return sum(bins[first:final]) / ((final - first) * bin_s)

    def rate(self, from_s: float, to_s: float | None = None) -> float:
        """Bytes per second between `from_s` and `to_s` seconds after the start."""
        end = (max(t for t, _ in self.events) - self.started) if to_s is None else to_s
        lo, hi = self.started + from_s, self.started + end
        got = sum(n for t, n in self.events if lo <= t < hi)
        return got / max(end - from_s, 1e-9)


def load_until(timeline: Timeline, monotonic_s: float) -> None:
    """Let the load run until the producer has delivered something at or after `monotonic_s` (so
    the span before it is covered by deliveries, however slow the machine)."""
    def delivered_after() -> bool:
        with timeline.lock:  # events are appended in delivery order: the last is the latest
            return bool(timeline.events) and timeline.events[-1][0] >= monotonic_s

    wait_until(delivered_after, monotonic_s - time.monotonic() + 30, "deliveries past the measured span")


def confluent_flood(bootstrap: str, topic: str, seconds: float, *, record_size: int = 1000,
                    client_id: str = "flood", config: Mapping[str, object] | None = None,
                    rate_bytes_per_s: float | None = None, stop: threading.Event | None = None,
                    batch_bytes: int = 64 * 1024, timeline: Timeline | None = None,
                    abandon_on_stop: bool = False, partition: int | None = None) -> Timeline:
    """Produce for `seconds` as fast as the quota lets librdkafka (or at a fixed pace).

    `batch_bytes` bounds librdkafka's produce requests: against a small quota, 1 MiB batches
    would make a few huge requests and a measurement over seconds would be all-or-nothing.
    `abandon_on_stop`: when `stop` is set, drop what is in flight and close at once (a client that
    goes away) instead of waiting for the outstanding requests.
    `partition`: produce to this partition only (by default librdkafka's sticky partitioner spreads
    the records, moving the demand between partitions, and so between brokers, batch by batch).
    """
    from confluent_kafka import KafkaError, Producer

    timeline = Timeline() if timeline is None else timeline
    purged = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)  # what this function drops itself
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "linger.ms": 5,
                         "batch.size": batch_bytes,
                         "queue.buffering.max.kbytes": max(256, 4 * batch_bytes // 1024),
                         "acks": 1, **(config or {})})
    value = b"x" * record_size

    def delivered(err: object, msg: object) -> None:
        if err is None:
            timeline.add(record_size)
        elif err.code() not in purged:  # type: ignore[attr-defined]
            timeline.fail(str(err))

    deadline = timeline.started + seconds
    sent = 0
    while time.monotonic() < deadline and not (stop and stop.is_set()):
        if rate_bytes_per_s is not None:
            wait_s = timeline.started + sent * record_size / rate_bytes_per_s - time.monotonic()
            if wait_s > 0:
                producer.poll(min(0.05, wait_s))  # never negative: that would block forever
                continue
        try:
            if partition is None:
                producer.produce(topic, value, on_delivery=delivered)
            else:
                producer.produce(topic, value, partition=partition, on_delivery=delivered)
            sent += 1
        except BufferError:
            producer.poll(0.05)
            continue
        producer.poll(0)
    if abandon_on_stop and stop is not None and stop.is_set():
        producer.purge(in_queue=True, in_flight=True)
        producer.flush(0)
        del producer          # librdkafka closes its connections now
        return timeline
    producer.purge()      # what is still queued when time is up does not count
    producer.flush(30)
    return timeline


def confluent_drain(bootstrap: str, topic: str, seconds: float, *, client_id: str = "drain",
                    group: str, config: Mapping[str, object] | None = None,
                    expect: int | None = None, keep: list[bytes] | None = None) -> Timeline:
    """Consume for `seconds` (or until `expect` records), timing each record's bytes."""
    from confluent_kafka import Consumer

    timeline = Timeline()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": client_id,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False, **(config or {})})
    consumer.subscribe([topic])
    deadline = timeline.started + seconds
    try:
        while time.monotonic() < deadline and (expect is None or timeline.count < expect):
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            value = msg.value() or b""
            timeline.add(len(value))
            if keep is not None:
                keep.append(value)
    finally:
        consumer.close()
    return timeline


_PERIODIC = re.compile(r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\)")


def java_producer_windows(stdout: str) -> list[float]:
    """MiB/s of each periodic ProducerPerformance report (every 5 s), the final summary dropped."""
    rows = [float(m.group(3)) for m in _PERIODIC.finditer(stdout)]
    return rows[:-1]


def java_consumer_intervals(stdout: str) -> list[float]:
    """MB/s (MiB) of each `--show-detailed-stats` interval row of ConsumerPerformance."""
    out = []
    for line in stdout.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) >= 4 and cols[0][:1].isdigit() and ":" in cols[0]:
            try:
                out.append(float(cols[3]))
            except ValueError:
                continue
    return out


class WatermarkSampler:
    """Samples a partition's log end offset on the broker itself, for clients whose own
    reports do not line up with the quota window (Kafka's perf tools)."""

    def __init__(self, bootstrap: str, topic: str, partition: int = 0, interval_s: float = 0.1) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermark-sampler"})
        self._tp = TopicPartition(topic, partition)
        self._interval_s = interval_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> WatermarkSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()

    def _run(self) -> None:
        from confluent_kafka import KafkaException

        while not self._stop.is_set():
            try:
                _low, high = self._consumer.get_watermark_offsets(self._tp, timeout=5)
            except KafkaException:  # a slow answer on a loaded machine: this sample is skipped
                continue
            self.samples.append((time.monotonic(), high))
            self._stop.wait(self._interval_s)

    def timeline(self, record_bytes: int) -> Timeline:
        """The log's growth as a `Timeline` (each sample's new records x `record_bytes`, at the
        sample's time), started at the last sample before the first growth: for `cycle_rate`."""
        first = next(i for i, (_, high) in enumerate(self.samples) if high > 0)
        start_s, previous = self.samples[max(0, first - 1)]
        timeline = Timeline(started=start_s)
        for t, high in self.samples[first:]:
            if high > previous:
                timeline.events.append((t, (high - previous) * record_bytes))
                previous = high
        return timeline

    def records_between(self, start_s: float, end_s: float) -> tuple[int, float]:
        """Records appended in [first growth + start_s, first growth + end_s], and the real span."""
        first = next(t for t, high in self.samples if high > 0)
        lo = [s for s in self.samples if s[0] <= first + start_s][-1]
        hi = [s for s in self.samples if s[0] <= first + end_s][-1]
        return hi[1] - lo[1], hi[0] - lo[0]


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def run_together(jobs: Sequence[Callable[[], object]], join_timeout_s: float) -> None:
    """Runs each job in a thread of its own, all started together, and waits for them; the first
    exception a job raised is raised again here, in the caller's thread."""
    failures: list[BaseException] = []

    def guarded(job: Callable[[], object]) -> None:
        try:
            job()
        except BaseException as e:
            failures.append(e)

    threads = [threading.Thread(target=guarded, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_timeout_s)
    if failures:
        raise failures[0]
