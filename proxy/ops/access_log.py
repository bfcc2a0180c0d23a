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
"""

from __future__ import annotations

import logging
import multiprocessing
import pickle
import threading
import time
from collections import deque
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from contracts.access_log import format_quota_entity
from protocol.apis import ApiKey
from protocol.headers import RequestHeader
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext, RequestOutcome, ResponseOutcome, StageBase
from proxy.ops.access_log_files import COUNTERS, Row, serve
from quotas.clock import Clock
from quotas.manager import ThrottleDecision

log = logging.getLogger("sluice.access_log")

_SMALL_RESPONSE_BYTES = 64 * 1024   # larger responses are streamed: only their head is seen
_FEED_INTERVAL_S = 0.05
_HEAD_BYTES = 32                    # a Fetch response's header and throttle_time_ms

# what the stage hands over: (entry, broker_id, client_address, principal, software name, version, ts_ms)
Handoff = tuple[InFlight, int | None, str, str, str | None, str | None, int]


class AccessLogWriter:
    """The event loop's end of the access log: a deque, a feeder thread and the writer process."""

    def __init__(self, root: Path, instance: str, *, log_format: str = "parquet",
                 rotate_bytes: int = 128 * 1024 * 1024, queue_size: int = 100_000,
                 max_pending_payload_bytes: int = 64 * 1024 * 1024,
                 kafka: tuple[str, str] | None = None, worker: int | None = None) -> None:
        self.root = root
        self.instance = instance
        self.worker = worker  # `--workers N`: this process's index, in every record and file name
        self.log_format = log_format
        self.rotate_bytes = rotate_bytes
        self.queue_size = queue_size
        self.max_pending_payload_bytes = max_pending_payload_bytes
        self._kafka = kafka
        self.handoff: deque[Handoff] = deque()
        # payload bytes: reserved on the loop, released by the feeder; each counter has one writer
        self._reserved_bytes = 0
        self._released_bytes = 0
        self.dropped = 0
        self.sent = 0
        self._ctx = multiprocessing.get_context("spawn")  # never fork a process with a running loop
        self._counters: Any = self._ctx.Array("q", len(COUNTERS), lock=False)
        self._process: BaseProcess | None = None
        self._pipe: Any = None
        self._thread = threading.Thread(target=self._feed, name="sluice-access-log", daemon=True)
        self._stop = threading.Event()

    # ------------------------------------------------------------------ event-loop side

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        receiver, self._pipe = self._ctx.Pipe(duplex=False)
        self._process = self._ctx.Process(
            target=serve, name="sluice-access-log-writer", daemon=True,
            args=(receiver, str(self.root), self.instance, self.log_format, self.rotate_bytes, self.worker,
                  self._kafka, self._counters))
        self._process.start()
        receiver.close()
        self._thread.start()

    def reserve_payload(self, nbytes: int) -> bool:
        if self._reserved_bytes - self._released_bytes + nbytes > self.max_pending_payload_bytes:
            return False
        self._reserved_bytes += nbytes
        return True

    def submit(self, item: Handoff) -> None:
        if len(self.handoff) >= self.queue_size:
            self.dropped += 1
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
        return int(self._counters[0])

    @property
    def writer_pid(self) -> int | None:
        """The writer process's pid (benchmarks read its CPU); None before start."""
        return None if self._process is None else self._process.pid

    @property
    def failed(self) -> int:
        return int(self._counters[1])

    @property
    def queue_depth(self) -> int:
        """Records handed over and not yet written (or failed)."""
        return len(self.handoff) + self.sent - self.written - self.failed

    # ------------------------------------------------------------------ feeder thread

    def _feed(self) -> None:
        handoff, pipe = self.handoff, self._pipe
        try:
            while True:
                stopping = self._stop.wait(_FEED_INTERVAL_S)
                while handoff:
                    batch: list[Row] = []
                    released = 0
                    for _ in range(min(len(handoff), 5000)):
                        item = handoff.popleft()
                        batch.append(row_of(item))
                        released += _payload_bytes(item[0])
                    data = pickle.dumps(batch, pickle.HIGHEST_PROTOCOL)
                    self._released_bytes += released
                    pipe.send_bytes(data)
                    self.sent += len(batch)
                if stopping:
                    pipe.send_bytes(b"")  # the writer closes its files and exits
                    return
        except (OSError, EOFError) as exc:
            log.error("access-log writer process is gone (%s); records are no longer written", exc)
        finally:
            pipe.close()


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
