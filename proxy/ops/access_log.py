"""One access-log record per request, written off the event loop's back.

Three steps, each cheaper for the event loop than the last one was:

1. `AccessLogStage.on_complete` (event loop): one tuple of references (the in-flight entry and what
   the connection context says now) appended to a deque. No lock, no record, no encoding. When
   `queue_size` records are waiting the record is dropped and counted; the loop never blocks.
2. A feeder thread (`AccessLogWriter`), every 50 ms: turns each tuple into a row of plain values
   (`proxy.ops.access_log_files.ROW_FIELDS`), pickles the batch (in C) and sends it down a pipe.
3. A writer process (`proxy.ops.access_log_files.serve`): parses Produce/Fetch partitions and
   error codes, builds the records of `contracts.access_log` (the one contract shared with the
   Spark jobs) and writes Parquet (the default) or JSON lines, partitioned by UTC date and hour,
   and optionally sends each record to a Kafka topic. Its CPU is its own: it never holds this
   process's GIL.

Payload references are budgeted: past `max_pending_payload_bytes` a record is still logged, only
without the details that needed the payload (topics, error codes).

The log never fails silently. The feeder thread watches the writer process: one that dies (killed,
crashed) is logged with its exit status and started again after a backoff (`WriterBackoff`),
counted in `sluice_access_log_writer_restarts_total`; the records it had been sent and not
written are counted as dropped (cause ``writer_died``), and records wait in the deque meanwhile
(past `queue_size`, dropped: ``queue_full``). Records the Kafka topic sink could not deliver are
dropped too (``topic``). `problems()` names what is wrong now, for `/healthz` (207, degraded):
a writer down, or any record dropped in the last `DEGRADED_HOLD_S` seconds.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import pickle
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from contracts.access_log import format_quota_entity
from protocol.apis import ApiKey
from protocol.headers import RequestHeader
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext, RequestOutcome, ResponseOutcome, StageBase
from proxy.ops.access_log_files import COUNTERS, FAILED, TOPIC_DELIVERED, TOPIC_DROPPED, WRITTEN, Row, serve
from quotas.clock import Clock
from quotas.manager import ThrottleDecision

log = logging.getLogger("sluice.access_log")

_SMALL_RESPONSE_BYTES = 64 * 1024   # larger responses are streamed: only their head is seen
_FEED_INTERVAL_S = 0.05
_HEAD_BYTES = 32                    # a Fetch response's header and throttle_time_ms

# what the stage hands over: (entry, broker_id, client_address, principal, software name, version, ts_ms)
Handoff = tuple[InFlight, int | None, str, str, str | None, str | None, int]

DEGRADED_HOLD_S = 10.0
"""`/healthz` reports the access log degraded until this long after the last record dropped."""

DROP_CAUSES = ("queue_full", "writer_died", "topic")
"""Why records were dropped: the handoff was full; the writer process died with them; the Kafka
topic sink could not deliver them (the files have them)."""


@dataclass(frozen=True, slots=True)
class WriterBackoff:
    """The wait before starting a dead writer again: doubling from `initial_s` up to `max_s`; a
    writer that ran `stable_after_s` or more is restarted after `initial_s` again."""

    initial_s: float = 0.5
    max_s: float = 30.0
    stable_after_s: float = 60.0

    def delay_s(self, previous_s: float | None, ran_s: float) -> float:
        if previous_s is None or ran_s >= self.stable_after_s:
            return self.initial_s
        return min(self.max_s, previous_s * 2)


KafkaTarget = tuple[str, str, Mapping[str, str]]
"""The Kafka topic sink: (bootstrap, topic, librdkafka settings); the settings may hold secrets
(SASL/TLS) and are never logged."""


class AccessLogWriter:
    """The event loop's end of the access log: a deque, a feeder thread and the writer process,
    which the feeder thread restarts when it dies."""

    def __init__(self, root: Path, instance: str, *, log_format: str = "parquet",
                 rotate_bytes: int = 128 * 1024 * 1024, queue_size: int = 100_000,
                 max_pending_payload_bytes: int = 64 * 1024 * 1024,
                 kafka: KafkaTarget | None = None, worker: int | None = None,
                 backoff: WriterBackoff = WriterBackoff()) -> None:
        self.root = root
        self.instance = instance
        self.worker = worker  # `--workers N`: this process's index, in every record and file name
        self.log_format = log_format
        self.rotate_bytes = rotate_bytes
        self.queue_size = queue_size
        self.max_pending_payload_bytes = max_pending_payload_bytes
        self._kafka = kafka
        self.backoff = backoff
        self.handoff: deque[Handoff] = deque()
        # payload bytes: reserved on the loop, released by the feeder; each counter has one writer
        self._reserved_bytes = 0
        self._released_bytes = 0
        self.dropped = 0            # handoff full (the loop's counter)
        self.lost = 0               # sent to a writer that died before writing them (the feeder's)
        self.sent = 0
        self.restarts = 0
        self._last_drop_s: float | None = None        # the loop's, for queue_full
        self._last_loss_s: float | None = None        # the feeder's, for writer_died and topic
        self._topic_dropped_seen = 0
        self._down: str | None = None                  # why the writer is down, while it is
        self._ctx = multiprocessing.get_context("spawn")  # never fork a process with a running loop
        self._counters: Any = self._ctx.Array("q", len(COUNTERS), lock=False)
        self._process: BaseProcess | None = None
        self._pipe: Any = None
        self._started_s = 0.0
        self._thread = threading.Thread(target=self._feed, name="sluice-access-log", daemon=True)
        self._stop = threading.Event()

    # ------------------------------------------------------------------ event-loop side

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._start_process()
        log.info("access-log writer process started (pid %s)", self.writer_pid)
        self._thread.start()

    def _start_process(self) -> None:
        receiver, pipe = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(
            target=serve, name="sluice-access-log-writer", daemon=True,
            args=(receiver, str(self.root), self.instance, self.log_format, self.rotate_bytes, self.worker,
                  self._kafka, self._counters))
        process.start()
        receiver.close()
        self._pipe, self._process = pipe, process  # others read the pid: only a started process's
        self._started_s = time.monotonic()

    def reserve_payload(self, nbytes: int) -> bool:
        if self._reserved_bytes - self._released_bytes + nbytes > self.max_pending_payload_bytes:
            return False
        self._reserved_bytes += nbytes
        return True

    def submit(self, item: Handoff) -> None:
        if len(self.handoff) >= self.queue_size:
            self.dropped += 1
            self._last_drop_s = time.monotonic()
            entry = item[0]
            self._released_bytes += _payload_bytes(entry)  # only the loop touches it on this path
            return
        self.handoff.append(item)

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, close the files, stop the thread and the process."""
        if not self._thread.is_alive():
            return
        self._stop.set()
        self._thread.join(timeout_s)
        if self._process is not None:
            self._process.join(timeout_s)
            if self._process.is_alive():
                log.warning("access-log writer did not finish in %.0f s; stopped", timeout_s)
                self._process.terminate()

    @property
    def written(self) -> int:
        return int(self._counters[WRITTEN])

    @property
    def writer_pid(self) -> int | None:
        """The writer process's pid (benchmarks read its CPU; tests kill it); None before start."""
        return None if self._process is None else self._process.pid

    @property
    def failed(self) -> int:
        return int(self._counters[FAILED])

    @property
    def topic_dropped(self) -> int:
        """Records the Kafka topic sink could not deliver (the files have them)."""
        return int(self._counters[TOPIC_DROPPED])

    @property
    def topic_delivered(self) -> int:
        return int(self._counters[TOPIC_DELIVERED])

    @property
    def drops(self) -> dict[str, int]:
        """Records dropped, by cause (`DROP_CAUSES`)."""
        return {"queue_full": self.dropped, "writer_died": self.lost, "topic": self.topic_dropped}

    @property
    def queue_depth(self) -> int:
        """Records handed over and not yet written (or failed, or lost with a dead writer)."""
        return len(self.handoff) + self.sent - self.written - self.failed - self.lost

    def problems(self, now_s: float | None = None) -> list[str]:
        """What is wrong with the access log now (empty: nothing), for `/healthz`."""
        self._watch_topic_drops()  # a drop the feeder has not seen yet counts now
        now_s = time.monotonic() if now_s is None else now_s
        out: list[str] = []
        down = self._down
        if down is not None:
            out.append(f"access log: {down}")
        last = max(self._last_drop_s or -1e18, self._last_loss_s or -1e18)
        if now_s - last < DEGRADED_HOLD_S:
            dropped = ", ".join(f"{n} {cause}" for cause, n in self.drops.items() if n)
            out.append(f"access log: records dropped in the last {DEGRADED_HOLD_S:g} s (in all: {dropped})")
        return out

    # ------------------------------------------------------------------ feeder thread

    def _feed(self) -> None:
        handoff = self.handoff
        delay_s: float | None = None
        restart_at: float | None = None
        while True:
            stopping = self._stop.wait(_FEED_INTERVAL_S)
            self._watch_topic_drops()
            if restart_at is None and not self._writer_alive():
                delay_s = self.backoff.delay_s(delay_s, time.monotonic() - self._started_s)
                restart_at = time.monotonic() + delay_s
                self._writer_died(delay_s)
            if restart_at is not None:
                if stopping:  # nothing to hand the queued records to: counted, and said
                    left = len(handoff)
                    handoff.clear()
                    self.lost += left
                    if left:
                        log.error("access-log writer down at shutdown: %d record(s) not written", left)
                    return
                if time.monotonic() < restart_at:
                    continue
                restart_at = None
                self._restart()
                continue
            try:
                while handoff:
                    self._send_batch(handoff)
                if stopping:
                    self._pipe.send_bytes(b"")  # the writer closes its files and exits
                    self._pipe.close()
                    return
            except (OSError, EOFError):
                continue  # the writer died mid-send: noticed on the next turn

    def _send_batch(self, handoff: deque[Handoff]) -> None:
        batch: list[Row] = []
        released = 0
        for _ in range(min(len(handoff), 5000)):
            item = handoff.popleft()
            batch.append(row_of(item))
            released += _payload_bytes(item[0])
        data = pickle.dumps(batch, pickle.HIGHEST_PROTOCOL)
        self._released_bytes += released
        self.sent += len(batch)  # counted before the send: a batch a dying writer never read is lost
        self._pipe.send_bytes(data)

    def _writer_alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def _writer_died(self, delay_s: float) -> None:
        process = self._process
        code = None if process is None else process.exitcode
        lost = self.sent - self.written - self.failed - self.lost
        self.lost += lost
        if lost:
            self._last_loss_s = time.monotonic()
        with contextlib.suppress(OSError):
            self._pipe.close()
        self._down = (f"writer process died (exit status {code}); restart {self.restarts + 1} "
                      f"in {delay_s:g} s; records wait in the queue meanwhile")
        log.error("access-log writer process died (exit status %s) with %d record(s) not written; "
                  "restarting it in %g s", code, lost, delay_s)

    def _restart(self) -> None:
        self._start_process()
        self.restarts += 1
        self._down = None
        log.warning("access-log writer process restarted (pid %s, restart %d)", self.writer_pid,
                    self.restarts)

    def _watch_topic_drops(self) -> None:
        dropped = self.topic_dropped
        if dropped > self._topic_dropped_seen:
            self._topic_dropped_seen = dropped
            self._last_loss_s = time.monotonic()


def _payload_bytes(entry: InFlight) -> int:
    n = 0
    if entry.request_payload is not None:
        n += len(entry.request_payload)
    if entry.response_payload is not None:
        n += len(entry.response_payload)
    return n


def row_of(item: Handoff) -> Row:
    """The plain values of one record (runs on the feeder thread)."""
    entry, broker_id, client_address, principal, software_name, software_version, ts_ms = item
    note = entry.quota
    matched = _matched_decision(note.decisions) if note is not None else None
    quota_entity = quota_kind = quota_limit = None
    if matched is not None and matched.entity is not None:
        quota_entity = format_quota_entity(matched.entity.to_kafka())
        quota_kind = matched.kind.value
        quota_limit = matched.bound
    shadow = matched is not None and matched.shadow
    received = entry.response_received_ms
    return (ts_ms, broker_id, client_address, principal, entry.client_id, software_name, software_version,
            entry.api_key, entry.api_version, entry.correlation_id, entry.request_bytes,
            entry.response_bytes if received else None,
            float(received - entry.received_ms) if entry.forwarded and received else None,
            note.enforced_ms if note is not None else 0, _throttle_source(entry),
            quota_entity, quota_kind, quota_limit, shadow,
            matched.would_throttle_ms if shadow and matched is not None else None,
            entry.request_payload, entry.response_payload)


def _throttle_source(entry: InFlight) -> bytes | None:
    """What the writer reads the broker's throttle_time_ms from: the kept response, else (a streamed
    Fetch) the head of the broker's response, where the field is."""
    if entry.response_payload is not None:
        return None  # the writer reads it from the response itself
    head = entry.broker_response
    return head[:_HEAD_BYTES] if head is not None and entry.api_key == ApiKey.FETCH else None


def _matched_decision(decisions: list[ThrottleDecision]) -> ThrottleDecision | None:
    """The decision that explains the request best: the largest throttle, else any with a quota."""
    best: ThrottleDecision | None = None
    for d in decisions:
        if d.entity is None or d.bound is None:
            continue
        if best is None or d.would_throttle_ms > best.would_throttle_ms:
            best = d
    return best


class AccessLogStage(StageBase):
    """Captures what a record needs; its place in the pipeline does not matter (the broker's
    throttle time is read once by the pipeline, before any stage patches it)."""

    def __init__(self, writer: AccessLogWriter, clock: Clock) -> None:
        self._writer = writer
        self._submit = writer.submit
        self._clock = clock
        self._epoch_offset_ms = int(time.time() * 1000) - clock.now_ms()

    def on_request(self, ctx: ConnectionContext, entry: InFlight, header: RequestHeader,
                   payload: bytes) -> RequestOutcome | None:
        if header.api_key == ApiKey.PRODUCE and self._writer.reserve_payload(len(payload)):
            entry.request_payload = payload
        return None

    def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome | None:
        size = len(payload)
        if (size == entry.upstream_response_bytes and size <= _SMALL_RESPONSE_BYTES
                and self._writer.reserve_payload(size)):
            entry.response_payload = entry.broker_response  # the broker's bytes, whatever stage order
        return None

    def on_complete(self, ctx: ConnectionContext, entry: InFlight, sent_ms: int) -> None:
        self._submit((entry, ctx.broker_id, ctx.client_address, ctx.principal, ctx.client_software_name,
                      ctx.client_software_version, entry.received_ms + self._epoch_offset_ms))
