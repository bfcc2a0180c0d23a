"""One access-log record per request, written off the hot path.

The pipeline stage only captures references (the context, the in-flight entry, the broker's
throttle time, the payloads it will need) and hands them to a bounded queue; it never blocks: when
the queue is full the record is dropped and counted. A writer thread builds each record in the
schema of `contracts.access_log` (the one contract shared with the Spark jobs),
parses Produce/Fetch partitions and error codes, and appends JSON lines (or Parquet) to files
partitioned by UTC date and hour, rotating by size and hour, flushing every second and on close.
Optionally every record also goes to a Kafka topic.

Payload references are budgeted: past `max_pending_payload_bytes` a record is still logged, only
without the details that needed the payload (topics, error codes).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from contracts.access_log import (
    SCHEMA_VERSION,
    dumps_record,
    format_quota_entity,
    partition_path,
)
from protocol.apis import ApiKey, api_name
from protocol.errors import ProtocolError
from protocol.headers import RequestHeader, read_request_header
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext, RequestOutcome, ResponseOutcome, StageBase
from quotas.clock import Clock
from quotas.manager import ThrottleDecision

log = logging.getLogger("sluice.access_log")

_SMALL_RESPONSE_BYTES = 64 * 1024   # larger responses are streamed: only their head is seen


class RecordSink(Protocol):
    """Somewhere else each record's JSON line goes (a Kafka topic)."""

    def send(self, line: str) -> None: ...

    def close(self) -> None: ...


@dataclass(slots=True)
class _Item:
    ctx: ConnectionContext
    principal: str
    software: tuple[str | None, str | None]
    entry: InFlight
    ts_ms: int
    payload_bytes: int = 0


class AccessLogWriter:
    """A thread that turns queued items into records and writes them."""

    def __init__(self, root: Path, instance: str, *, log_format: str = "json",
                 rotate_bytes: int = 128 * 1024 * 1024, queue_size: int = 100_000,
                 max_pending_payload_bytes: int = 64 * 1024 * 1024,
                 kafka_sink: RecordSink | None = None, worker: int | None = None) -> None:
        self.root = root
        self.instance = instance
        self.worker = worker  # `--workers N`: this process's index, in every record and file name
        self.log_format = log_format
        self.rotate_bytes = rotate_bytes
        self.max_pending_payload_bytes = max_pending_payload_bytes
        self._queue: queue.Queue[_Item | None] = queue.Queue(maxsize=queue_size)
        self._kafka_sink = kafka_sink
        self._thread = threading.Thread(target=self._run, name="sluice-access-log", daemon=True)
        self._pending_payload_bytes = 0
        self._lock = threading.Lock()
        self.dropped = 0
        self.written = 0
        self.failed = 0
        self._file: IO[str] | None = None
        self._file_hour: tuple[int, int] | None = None
        self._file_bytes = 0
        self._seq = 0
        self._parquet_rows: list[dict[str, object]] = []
        self._topic_names: dict[bytes, str] = {}

    # ------------------------------------------------------------------ event-loop side

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def reserve_payload(self, nbytes: int) -> bool:
        with self._lock:
            if self._pending_payload_bytes + nbytes > self.max_pending_payload_bytes:
                return False
            self._pending_payload_bytes += nbytes
            return True

    def submit(self, item: _Item) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            self._release(item.payload_bytes)

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, close the files, stop the thread."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout_s)
        self._thread.join(timeout_s)

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize()

    def _release(self, nbytes: int) -> None:
        if nbytes:
            with self._lock:
                self._pending_payload_bytes -= nbytes

    # ------------------------------------------------------------------ writer thread

    def _run(self) -> None:
        last_flush = time.monotonic()
        while True:
            try:
                item = self._queue.get(timeout=0.5)
            except queue.Empty:
                item = False  # type: ignore[assignment]
            if item is None:
                break
            if item:
                try:
                    self._write(build_record(item, self.instance, self._topic_names, self.worker))
                except Exception:  # a bad record must not stop the log
                    self.failed += 1
                    log.exception("cannot write an access-log record")
                finally:
                    self._release(item.payload_bytes)
            if time.monotonic() - last_flush >= 1.0:
                self._flush()
                last_flush = time.monotonic()
        self._close_file()
        if self._kafka_sink is not None:
            self._kafka_sink.close()

    def _write(self, record: dict[str, object]) -> None:
        ts_ms = int(record["ts_ms"])  # type: ignore[call-overload]
        t = time.gmtime(ts_ms / 1000)
        hour = (t.tm_yday + t.tm_year * 1000, t.tm_hour)
        if self._file_hour != hour or self._file_bytes >= self.rotate_bytes:
            self._close_file()
            self._file_hour = hour
            self._open_file(ts_ms)
        line = dumps_record(record)
        if self.log_format == "json":
            assert self._file is not None
            self._file.write(line + "\n")
            self._file_bytes += len(line) + 1
        else:
            self._parquet_rows.append(record)
            self._file_bytes += len(line)
            if len(self._parquet_rows) >= 50_000:
                self._close_file()
                self._file_hour = None
        if self._kafka_sink is not None:
            self._kafka_sink.send(line)
        self.written += 1

    def _open_file(self, ts_ms: int) -> None:
        path = partition_path(self.root, ts_ms, self.instance, self._seq, log_format=self.log_format,
                              worker=self.worker)
        self._seq += 1
        path.parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._file_bytes = 0
        if self.log_format == "json":
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in _close_file

    def _flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._parquet_rows:
            import pyarrow as pa
            import pyarrow.parquet as pq

            from contracts.access_log import FIELD_NAMES

            table = pa.Table.from_pylist(self._parquet_rows)
            pq.write_table(table.select(list(FIELD_NAMES)), self._path)
            self._parquet_rows = []


def build_record(item: _Item, instance: str, topic_names: dict[bytes, str],
                 worker: int | None = None) -> dict[str, object]:
    """The schema's record for one served request (runs on the writer thread)."""
    from protocol import records  # the walkers are only needed here

    entry = item.entry
    note = entry.quota
    matched = _matched_decision(note.decisions) if note is not None else None
    topics: list[dict[str, object]] | None = None
    error_codes: set[int] = set()
    request = entry.request_payload
    response = entry.response_payload
    try:
        if entry.api_key == ApiKey.PRODUCE and isinstance(request, bytes):
            header = read_request_header(request)
            topics = [_topic(p, topic_names) for p in records.produce_request_partitions(request, header)]
            if isinstance(response, bytes):
                error_codes.update(records.produce_response_errors(response, entry.api_version))
        elif entry.api_key == ApiKey.FETCH and isinstance(response, bytes):
            top, parts = records.fetch_response_partitions(response, entry.api_version)
            error_codes.update([top, *(p.error_code for p in parts)])
            topics = [_topic(p, topic_names) for p in parts]
        elif entry.api_key == ApiKey.METADATA and isinstance(response, bytes) and entry.api_version >= 10:
            topic_names.update(records.topic_ids_from_metadata_response(response, entry.api_version))
            error_codes.update(records.response_error_codes(response, entry.api_key, entry.api_version))
        elif isinstance(response, bytes):
            error_codes.update(records.response_error_codes(response, entry.api_key, entry.api_version))
    except ProtocolError:
        pass  # the record is still written, without what could not be read
    error_codes.discard(0)
    enforced = note.enforced_ms if note is not None else 0
    shadow = matched is not None and matched.shadow
    answered = entry.response_bytes if entry.response_received_ms else None
    return {
        "schema_version": SCHEMA_VERSION,
        "ts_ms": item.ts_ms,
        "instance": instance,
        "broker_id": item.ctx.broker_id,
        "client_address": item.ctx.client_address,
        "principal": item.principal,
        "client_id": entry.client_id,
        "client_software_name": item.software[0],
        "client_software_version": item.software[1],
        "api_key": entry.api_key,
        "api_name": api_name(entry.api_key),
        "api_version": entry.api_version,
        "correlation_id": entry.correlation_id,
        "request_bytes": entry.request_bytes,
        "response_bytes": answered,
        "topics": topics if entry.api_key in (ApiKey.PRODUCE, ApiKey.FETCH) else None,
        "upstream_latency_ms": (float(entry.response_received_ms - entry.received_ms)
                                if entry.forwarded and entry.response_received_ms else None),
        "throttle_time_ms": enforced,
        "broker_throttle_time_ms": entry.broker_throttle_ms,
        "quota_entity": (format_quota_entity(matched.entity.to_kafka())
                         if matched is not None and matched.entity is not None else None),
        "quota_kind": matched.kind.value if matched is not None and matched.entity is not None else None,
        "quota_limit": matched.bound if matched is not None and matched.entity is not None else None,
        "shadow": shadow,
        "would_throttle_ms": matched.would_throttle_ms if shadow and matched is not None else None,
        "error_codes": sorted(error_codes),
        "worker": worker,
    }


def _matched_decision(decisions: list[ThrottleDecision]) -> ThrottleDecision | None:
    """The decision that explains the request best: the largest throttle, else any with a quota."""
    best: ThrottleDecision | None = None
    for d in decisions:
        if d.entity is None or d.bound is None:
            continue
        if best is None or d.would_throttle_ms > best.would_throttle_ms:
            best = d
    return best


def _topic(p: Any, topic_names: dict[bytes, str]) -> dict[str, object]:
    name = p.topic if p.topic is not None else topic_names.get(p.topic_id or b"", (p.topic_id or b"").hex())
    return {"topic": name, "partition": p.partition, "records": p.records, "bytes": p.bytes}


class AccessLogStage(StageBase):
    """Captures what a record needs; must come before the quota stage (to see the broker's
    throttle time before it is patched)."""

    def __init__(self, writer: AccessLogWriter, clock: Clock) -> None:
        self._writer = writer
        self._clock = clock
        self._epoch_offset_ms = int(time.time() * 1000) - clock.now_ms()

    wants_broker_throttle = True  # the pipeline reads it into entry.broker_throttle_ms

    def on_request(self, ctx: ConnectionContext, entry: InFlight, header: RequestHeader,
                   payload: bytes) -> RequestOutcome | None:
        if header.api_key == ApiKey.PRODUCE and self._writer.reserve_payload(len(payload)):
            entry.request_payload = payload
        return None

    def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome | None:
        complete = len(payload) == entry.upstream_response_bytes
        if complete and len(payload) <= _SMALL_RESPONSE_BYTES and self._writer.reserve_payload(len(payload)):
            entry.response_payload = payload
        return None

    def on_complete(self, ctx: ConnectionContext, entry: InFlight, sent_ms: int) -> None:
        pending = 0
        if entry.request_payload is not None:
            pending += len(entry.request_payload)
        if entry.response_payload is not None:
            pending += len(entry.response_payload)
        self._writer.submit(_Item(ctx, ctx.principal, (ctx.client_software_name, ctx.client_software_version),
                                  entry, entry.received_ms + self._epoch_offset_ms, pending))
