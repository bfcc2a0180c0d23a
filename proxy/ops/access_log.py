"""One access-log record per request, written off the event loop's back.

Three steps:

1. `AccessLogStage` (event loop): when a Produce request arrives, its partitions (topic, partition,
   records, bytes) are read from the request into the in-flight entry (`InFlight.produce_parts`, the
   walk the topic and records quotas read too); once the response has gone out, `on_complete` adds
   one row to the current column batch (`LogBatch.add`): the request's fields, the response's error
   codes and the broker's throttle time (read from the broker's response, which the pipeline keeps
   until then), and the quota decision. No payload outlives its request. When `queue_size` records
   are waiting the record is dropped and counted; the loop never blocks.
2. A feeder thread (`AccessLogWriter`) takes the batch (a new one starts) once it holds
   `SEND_ROWS` records (or half of `queue_size`, if less) or a second has passed, and sends its
   columns down a pipe, about 100 bytes a record (`LogBatch.message`). It sleeps in between: the
   loop wakes it (one byte down a pipe) when a batch reaches `SEND_ROWS`, the writer process's
   exit wakes it at once, and otherwise it wakes once a second, so an idle proxy costs next to no
   CPU and the event loop is not interrupted for the GIL. The writer's work per
   batch is nearly fixed (some 40 Arrow calls, about a millisecond), so batches are made large:
   at 20 records a batch that would be 50 µs a record, more than the rest of the log's work.
3. A writer process (`proxy.ops.access_log_files.serve`): turns each batch into an Arrow record
   batch of the records of `contracts.access_log` (the one contract shared with the Spark jobs)
   without re-reading Produce or Fetch payloads, and writes Parquet (the default) or JSON lines,
   partitioned by UTC date and hour, and optionally sends each record to a Kafka topic. Its CPU
   is its own: it never holds this process's GIL.

Responses of APIs other than Produce, Fetch and ApiVersions (Metadata, group and admin APIs: rare)
go with the batch whole, and the writer reads their error codes (and Metadata's topic ids) with
kio: at most `max_pending_payload_bytes` of them in a batch; past that a record is still logged,
only without its error codes.

The log never fails silently. The feeder thread watches the writer process: one that dies (killed,
crashed) is logged with its exit status and started again after a backoff (`WriterBackoff`),
counted in `sluice_access_log_writer_restarts_total`; the records it had been sent and not
written are counted as dropped (cause ``writer_died``), and records wait in the batch meanwhile
(past `queue_size`, dropped: ``queue_full``). Records the Kafka topic sink could not deliver are
dropped too (``topic``). `problems()` names what is wrong now, for `/healthz` (207, degraded):
a writer down, or any record dropped in the last `DEGRADED_HOLD_S` seconds.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Final

from contracts.compiled import choose
from protocol.apis import ApiKey
from protocol.headers import RequestHeader
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext, RequestOutcome, StageBase
from proxy.ops.access_log_batch import LogBatch
from proxy.ops.access_log_files import (
    COUNTERS,
    FAILED,
    TOPIC_DELIVERED,
    TOPIC_DROPPED,
    WRITTEN,
    writer_process,
)
from quotas.clock import Clock
from quotas.entity import QuotaEntity

log = logging.getLogger("sluice.access_log")

_CHOICE: Final = choose("proxy.ops._speedups", ("AccessLogHooks",))
COMPILED_MODULE: Final = _CHOICE.compiled_module
"""proxy.ops._speedups if it was built (whatever SLUICE_PURE_PYTHON says: tests use both), else None."""
describe: Final = _CHOICE.describe

SEND_INTERVAL_S = 1.0     # a batch goes to the writer at least this often ...
SEND_ROWS = 8192          # ... and as soon as it holds this many records (or half of queue_size)

DEGRADED_HOLD_S = 10.0
"""`/healthz` reports the access log degraded until this long after the last record dropped."""

DROP_CAUSES = ("queue_full", "writer_died", "topic")
"""Why records were dropped: the handoff was full; the writer process died with them; the Kafka
topic sink could not deliver them (the files have them)."""


def send_threshold(queue_size: int) -> int:
    """Records in a batch that send it at once: `SEND_ROWS`, or half of a smaller `queue_size`, so
    that a healthy writer is sent a batch well before the queue is full."""
    return max(1, min(SEND_ROWS, queue_size // 2))


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
    """The event loop's end of the access log: a column batch, a feeder thread and the writer
    process, which the feeder thread restarts when it dies."""

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
        self._entity_text: dict[QuotaEntity, str] = {}   # quota entities as the records write them
        self._batch = LogBatch(self._entity_text)         # filled on the loop, taken by the feeder
        self._lock = threading.Lock()                     # a row is added, or the batch taken, whole
        self.dropped = 0            # batch full (the loop's counter)
        self.unreadable = 0         # a row the loop could not build (a bug; logged)
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
        self.send_rows = send_threshold(queue_size)   # a batch this full is sent at once ...
        self._wake_r, self._wake_w = os.pipe()         # ... the loop says so down this pipe
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)

    # ------------------------------------------------------------------ event-loop side

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._start_process()
        log.info("access-log writer process started (pid %s)", self.writer_pid)
        self._thread.start()

    def _start_process(self) -> None:
        receiver, pipe = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(
            target=writer_process, name="sluice-access-log-writer", daemon=True,
            args=(receiver, str(self.root), self.instance, self.log_format, self.rotate_bytes, self.worker,
                  self._kafka, self._counters))
        process.start()
        receiver.close()
        self._pipe, self._process = pipe, process  # others read the pid: only a started process's
        self._started_s = time.monotonic()

    def add(self, ctx: ConnectionContext, entry: InFlight, ts_ms: int) -> None:
        """One record for a request whose response has gone out (or that gets none)."""
        with self._lock:
            batch = self._batch
            if len(batch.ts_ms) >= self.queue_size:  # len(batch), without a Python call per record
                self.dropped += 1
                self._last_drop_s = time.monotonic()
                return
            try:
                batch.add(ctx, entry, ts_ms, self.max_pending_payload_bytes)
            except Exception:  # a bug must cost one record, never the connection
                self.unreadable += 1
                if self.unreadable == 1 or self.unreadable % 10_000 == 0:
                    log.exception("cannot log a request (%d so far)", self.unreadable)
                return
            if len(batch.ts_ms) == self.send_rows:
                self.wake()

    def wake(self) -> None:
        """Have the feeder thread look at the batch now (the loop's call, once per full batch)."""
        if self._wake_w >= 0:  # not closed
            with contextlib.suppress(BlockingIOError):  # a full pipe: a wake-up is already waiting
                os.write(self._wake_w, b"\0")

    @property
    def waiting(self) -> int:
        """Records in the batch the feeder has not taken yet."""
        return len(self._batch)

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, close the files, stop the thread and the process."""
        if self._thread.is_alive():
            self._stop.set()
            self.wake()
            self._thread.join(timeout_s)
            if self._process is not None:
                self._process.join(timeout_s)
                if self._process.is_alive():
                    log.warning("access-log writer did not finish in %.0f s; stopped", timeout_s)
                    self._process.terminate()
        if self._wake_w >= 0 and not self._thread.is_alive():  # the feeder no longer reads it
            wake_r, wake_w, self._wake_r, self._wake_w = self._wake_r, self._wake_w, -1, -1
            os.close(wake_r)
            os.close(wake_w)

    @property
    def written(self) -> int:
        return int(self._counters[WRITTEN])

    @property
    def writer_pid(self) -> int | None:
        """The writer process's pid (benchmarks read its CPU; tests kill it); None before start."""
        return None if self._process is None else self._process.pid

    @property
    def failed(self) -> int:
        """Records that could not be built (the loop's) or written (the writer's)."""
        return int(self._counters[FAILED]) + self.unreadable

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
        """Records added and not yet written (or failed, or lost with a dead writer)."""
        done = int(self._counters[WRITTEN]) + int(self._counters[FAILED]) + self.lost
        return len(self._batch) + self.sent - done

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
        delay_s: float | None = None
        restart_at: float | None = None
        sent_s = time.monotonic()
        send_rows = self.send_rows
        while True:
            wait_s = (restart_at if restart_at is not None else sent_s + SEND_INTERVAL_S) - time.monotonic()
            stopping = self._sleep(wait_s, watch_writer=restart_at is None)
            self._watch_topic_drops()
            if restart_at is None and not self._writer_alive():
                delay_s = self.backoff.delay_s(delay_s, time.monotonic() - self._started_s)
                restart_at = time.monotonic() + delay_s
                self._writer_died(delay_s)
            if restart_at is not None:
                if stopping:  # nothing to hand the waiting records to: counted, and said
                    left = len(self._take())
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
                now_s = time.monotonic()
                if stopping or len(self._batch) >= send_rows or now_s - sent_s >= SEND_INTERVAL_S:
                    sent_s = now_s
                    self._send_batch()
                if stopping:
                    self._pipe.send_bytes(b"")  # the writer closes its files and exits
                    self._pipe.close()
                    return
            except (OSError, EOFError):
                continue  # the writer died mid-send: noticed on the next turn

    def _sleep(self, timeout_s: float, watch_writer: bool) -> bool:
        """Until `timeout_s` has passed, the loop wakes the feeder (`wake`) or, if `watch_writer`,
        the writer process exits; True once `close` has been called."""
        watched: list[int] = [self._wake_r]
        if watch_writer and self._process is not None:
            watched.append(self._process.sentinel)  # ready once the process has exited
        if self._wake_r in multiprocessing.connection.wait(watched, max(0.0, timeout_s)):
            with contextlib.suppress(BlockingIOError):
                while os.read(self._wake_r, 4096):
                    pass
        return self._stop.is_set()

    def _take(self) -> LogBatch:
        """The batch filled so far; the loop goes on with a new one."""
        with self._lock:
            batch = self._batch
            if len(batch):
                self._batch = LogBatch(self._entity_text)
        return batch

    def _send_batch(self) -> None:
        batch = self._take()
        if not len(batch):
            return
        data = batch.message()
        self.sent += len(batch)  # counted before the send: a batch a dying writer never read is lost
        self._pipe.send_bytes(data)

    def _writer_alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def _writer_died(self, delay_s: float) -> None:
        process = self._process
        code = None if process is None else process.exitcode
        lost = self.sent - int(self._counters[WRITTEN]) - int(self._counters[FAILED]) - self.lost
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


class AccessLogStage(StageBase):
    """Captures what a record needs; its place in the pipeline does not matter (the broker's
    throttle time is read from the broker's response as the pipeline kept it, before any stage
    patched it)."""

    def __init__(self, writer: AccessLogWriter, clock: Clock) -> None:
        self._writer = writer
        self._add = writer.add
        self._clock = clock
        self._epoch_offset_ms = int(time.time() * 1000) - clock.now_ms()
        compiled = _CHOICE.active
        if compiled is not None:  # the same hooks compiled (`proxy/ops/_speedups.pyx`)
            hooks = compiled.AccessLogHooks(self, AccessLogStage.on_complete)
            self.on_request = hooks.on_request  # type: ignore[method-assign]
            self.on_complete = hooks.on_complete  # type: ignore[method-assign]

    def on_request(self, ctx: ConnectionContext, entry: InFlight, header: RequestHeader,
                   payload: bytes) -> RequestOutcome | None:
        if header.api_key == ApiKey.PRODUCE:
            entry.produce_parts(payload, header)
        return None

    def on_complete(self, ctx: ConnectionContext, entry: InFlight, sent_ms: int) -> None:
        self._add(ctx, entry, entry.received_ms + self._epoch_offset_ms)
