"""The access-log writer process: rows in, records of `contracts.access_log` out, to files (Parquet
or JSON lines) and optionally a Kafka topic.

It runs in its own process (`proxy.ops.access_log.AccessLogWriter` starts it), so parsing
Produce/Fetch partitions and error codes, building records and encoding them never compete with the
proxy's event loop for the GIL. It reads batches of rows (`ROW_FIELDS`: plain values and the
payloads the record needs, pickled) from a pipe until an empty batch or EOF (the proxy died), then
closes its files. Files are partitioned by UTC date and hour and rotate by size and hour; JSON is
flushed every second; Parquet files are written with pyarrow from columns, one row group per batch
of up to 50,000 records. Each row becomes one record (`build_record`), whatever the format.
"""

from __future__ import annotations

import logging
import pickle
import signal
import time
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any, Protocol

from contracts.access_log import FIELD_NAMES, FIELDS, SCHEMA_VERSION, Field, dumps_record, partition_path
from protocol.apis import ApiKey, api_name
from protocol.errors import ProtocolError
from protocol.headers import read_request_header
from protocol.throttle import read_throttle_time_ms

log = logging.getLogger("sluice.access_log")

# The row a proxy hands over per record (a plain tuple: cheap to build and to pickle)
ROW_FIELDS = ("ts_ms", "broker_id", "client_address", "principal", "client_id", "client_software_name",
              "client_software_version", "api_key", "api_version", "correlation_id", "request_bytes",
              "response_bytes", "upstream_latency_ms", "throttle_time_ms", "broker_throttle_head",
              "quota_entity", "quota_kind", "quota_limit", "shadow", "would_throttle_ms",
              "request_payload", "response_payload")
Row = tuple[Any, ...]

COUNTERS = ("written", "failed", "topic_delivered", "topic_dropped")  # shared integers the proxy reads
WRITTEN, FAILED, TOPIC_DELIVERED, TOPIC_DROPPED = range(len(COUNTERS))
_PARQUET_ROWS = 50_000
_PARQUET_ROW_BYTES = 200  # an estimate per record: rotation by size is approximate for Parquet


class RecordSink(Protocol):
    """Somewhere else each record's JSON line goes (a Kafka topic)."""

    def send(self, line: str) -> None: ...

    def poll(self) -> None: ...

    def close(self) -> None: ...


class KafkaSink:
    """Records also go to a Kafka topic (librdkafka batches them). Every record is counted once
    it is settled: delivered (`TOPIC_DELIVERED`), or dropped (`TOPIC_DROPPED`): librdkafka's
    queue full, a delivery that failed or timed out (`message.timeout.ms`, 30 s unless
    `settings` say otherwise), or still undelivered at close. `settings` are the user's librdkafka
    settings (SASL/TLS): secrets, never logged."""

    def __init__(self, bootstrap: str, topic: str, settings: Mapping[str, str], counters: Any) -> None:
        from confluent_kafka import Producer

        self._topic = topic
        self._counters = counters
        self._warned_s = self._error_logged_s = -1e9
        self._producer: Any = Producer({"linger.ms": 100, "client.id": "sluice-access-log",
                                   "queue.buffering.max.messages": 100_000, "message.timeout.ms": 30_000,
                                   **settings, "bootstrap.servers": bootstrap, "error_cb": self._error})

    def _error(self, err: Any) -> None:
        now = time.monotonic()
        if now - self._error_logged_s >= 10:  # librdkafka repeats them while the cluster is away
            self._error_logged_s = now
            log.warning("access-log topic %s: %s", self._topic, err.str())

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is None:
            self._counters[TOPIC_DELIVERED] += 1
        else:
            self._drop(f"a record was not delivered: {err.str()}")

    def _drop(self, why: str, n: int = 1) -> None:
        self._counters[TOPIC_DROPPED] += n
        now = time.monotonic()
        if now - self._warned_s >= 10:  # at most one line per 10 s: the count is the metric
            self._warned_s = now
            log.warning("access-log topic %s: %s; records dropped (counted in "
                        "sluice_access_log_records_dropped_total{cause=\"topic\"})", self._topic, why)

    def send(self, line: str) -> None:
        try:
            self._producer.produce(self._topic, line.encode(), on_delivery=self._delivered)
        except BufferError:
            self._drop("not keeping up (its queue is full)")
        self._producer.poll(0)

    def poll(self) -> None:
        self._producer.poll(0)

    def close(self) -> None:
        left = self._producer.flush(10)
        if left:
            self._drop(f"{left} record(s) not delivered at close", left)
        self._producer = None  # its callbacks refer to this sink: the producer goes now, not at exit


PayloadFields = tuple[list[dict[str, object]] | None, int | None, list[int]]


def payload_fields(row: Row, topic_names: dict[bytes, str]) -> PayloadFields:
    """(topics, broker_throttle_time_ms, error_codes) of one row: what is read from its payloads.
    A payload that cannot be read gives what could be read before the problem."""
    from protocol import records  # the walkers are only needed here

    api_key, api_version = row[_API_KEY], row[_API_VERSION]
    broker_head, request, response = row[_BROKER_HEAD], row[_REQUEST], row[_RESPONSE]
    if request is None and response is None and broker_head is None:
        return None, None, []   # a fresh list: every record owns its error codes
    topics: list[dict[str, object]] | None = None
    error_codes: set[int] = set()
    broker_throttle_ms: int | None = None
    throttle_read = False  # a Produce response's walk reads it with the error codes
    try:
        if api_key == ApiKey.PRODUCE and request is not None:
            header = read_request_header(request)
            topics = [_topic(p, topic_names) for p in records.produce_request_partitions(request, header)]
            if response is not None:
                codes, broker_throttle_ms = records.produce_response_summary(response, api_version)
                error_codes.update(codes)
                throttle_read = True
        elif api_key == ApiKey.FETCH and response is not None:
            top, parts = records.fetch_response_partitions(response, api_version)
            error_codes.update([top, *(p.error_code for p in parts)])
            topics = [_topic(p, topic_names) for p in parts]
        elif api_key == ApiKey.METADATA and response is not None and api_version >= 10:
            topic_names.update(records.topic_ids_from_metadata_response(response, api_version))
            error_codes.update(records.response_error_codes(response, api_key, api_version))
        elif response is not None:
            error_codes.update(records.response_error_codes(response, api_key, api_version))
    except ProtocolError:
        pass  # the record is still written, without what could not be read
    error_codes.discard(0)
    if not throttle_read:
        broker_throttle_ms = _broker_throttle(response if response is not None else broker_head,
                                              api_key, api_version)
    return (topics if api_key in (ApiKey.PRODUCE, ApiKey.FETCH) else None, broker_throttle_ms,
            sorted(error_codes))


def build_record(row: Row, instance: str, topic_names: dict[bytes, str],
                 worker: int | None = None) -> dict[str, object]:
    """The schema's record for one served request."""
    (ts_ms, broker_id, client_address, principal, client_id, software_name, software_version, api_key,
     api_version, correlation_id, request_bytes, response_bytes, upstream_latency_ms, throttle_ms,
     _, quota_entity, quota_kind, quota_limit, shadow, would_throttle_ms, _, _) = row
    topics, broker_throttle_ms, error_codes = payload_fields(row, topic_names)
    return {
        "schema_version": SCHEMA_VERSION,
        "ts_ms": ts_ms,
        "instance": instance,
        "broker_id": broker_id,
        "client_address": client_address,
        "principal": principal,
        "client_id": client_id,
        "client_software_name": software_name,
        "client_software_version": software_version,
        "api_key": api_key,
        "api_name": api_name(api_key),
        "api_version": api_version,
        "correlation_id": correlation_id,
        "request_bytes": request_bytes,
        "response_bytes": response_bytes,
        "topics": topics,
        "upstream_latency_ms": upstream_latency_ms,
        "throttle_time_ms": throttle_ms,
        "broker_throttle_time_ms": broker_throttle_ms,
        "quota_entity": quota_entity,
        "quota_kind": quota_kind,
        "quota_limit": quota_limit,
        "shadow": shadow,
        "would_throttle_ms": would_throttle_ms,
        "error_codes": error_codes,
        "worker": worker,
    }


# the row's fields the payload walks read (by position)
_API_KEY, _API_VERSION = ROW_FIELDS.index("api_key"), ROW_FIELDS.index("api_version")
_BROKER_HEAD = ROW_FIELDS.index("broker_throttle_head")
_REQUEST, _RESPONSE = ROW_FIELDS.index("request_payload"), ROW_FIELDS.index("response_payload")
_HOUR_MS = 3_600_000  # UTC hours are whole multiples of it in epoch milliseconds


def _broker_throttle(payload: bytes | None, api_key: int, api_version: int) -> int | None:
    if payload is None:
        return None
    try:
        return read_throttle_time_ms(payload, api_key, api_version)
    except ProtocolError:
        return None


def _topic(p: Any, topic_names: dict[bytes, str]) -> dict[str, object]:
    name = p.topic if p.topic is not None else topic_names.get(p.topic_id or b"", (p.topic_id or b"").hex())
    return {"topic": name, "partition": p.partition, "records": p.records, "bytes": p.bytes}


_ARROW_SCHEMA: Any = None


def arrow_schema() -> Any:
    """The record schema as a pyarrow schema (from `contracts.access_log.FIELDS`), built once."""
    global _ARROW_SCHEMA
    if _ARROW_SCHEMA is None:
        import pyarrow as pa

        scalar = {"string": pa.string(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(),
                  "double": pa.float64(), "boolean": pa.bool_(), "array<int16>": pa.list_(pa.int16())}

        def arrow_type(field: Field) -> Any:
            if field.type == "array<struct>":
                members = [pa.field(f.name, arrow_type(f), f.nullable) for f in field.fields]
                return pa.list_(pa.struct(members))
            return scalar[field.type]

        _ARROW_SCHEMA = pa.schema([pa.field(f.name, arrow_type(f), f.nullable) for f in FIELDS])
    return _ARROW_SCHEMA


class RecordFiles:
    """Appends records to files partitioned by UTC date and hour, rotating by size and hour."""

    def __init__(self, root: Path, instance: str, log_format: str, rotate_bytes: int,
                 worker: int | None, sink: RecordSink | None) -> None:
        self.root, self.instance, self.log_format = root, instance, log_format
        self.rotate_bytes, self.worker, self._sink = rotate_bytes, worker, sink
        self._file: IO[str] | None = None
        self._file_hour: int | None = None
        self._file_bytes = 0
        self._seq = 0
        self._path: Path | None = None
        self._columns: dict[str, list[object]] = {name: [] for name in FIELD_NAMES}
        self._rows = 0
        self._parquet: Any = None   # pyarrow.parquet.ParquetWriter of the open file

    def write(self, record: dict[str, object]) -> None:
        ts_ms = int(record["ts_ms"])  # type: ignore[call-overload]
        self._roll(ts_ms)
        if self.log_format == "json" or self._sink is not None:
            line = dumps_record(record)
            if self.log_format == "json":
                assert self._file is not None
                self._file.write(line + "\n")
                self._file_bytes += len(line) + 1
            if self._sink is not None:
                self._sink.send(line)
        if self.log_format == "parquet":
            for name, column in self._columns.items():
                column.append(record[name])
            self._rows += 1
            self._file_bytes += _PARQUET_ROW_BYTES
            if self._rows >= _PARQUET_ROWS:
                self._write_row_group()

    def _roll(self, ts_ms: int) -> None:
        """A new file when the hour changes or the file is full."""
        hour = ts_ms // _HOUR_MS
        if self._file_hour != hour or self._file_bytes >= self.rotate_bytes:
            self.close()
            self._file_hour = hour
            self._open(ts_ms)

    def _open(self, ts_ms: int) -> None:
        path = partition_path(self.root, ts_ms, self.instance, self._seq, log_format=self.log_format,
                              worker=self.worker)
        self._seq += 1
        path.parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._file_bytes = 0
        if self.log_format == "json":
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def _write_row_group(self) -> None:
        if not self._rows:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = arrow_schema()
        try:
            table = pa.Table.from_pydict(self._columns, schema=schema)
            if self._parquet is None:
                assert self._path is not None
                self._parquet = pq.ParquetWriter(self._path, schema)
            self._parquet.write_table(table)
        finally:  # a row group pyarrow refuses is dropped, never written again with the next ones
            self._columns = {name: [] for name in FIELD_NAMES}
            self._rows = 0

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.log_format == "parquet":
            self._write_row_group()
            if self._parquet is not None:
                self._parquet.close()
                self._parquet = None


def serve(conn: Connection, root: str, instance: str, log_format: str, rotate_bytes: int,
          worker: int | None, kafka: tuple[str, str, Mapping[str, str]] | None,
          counters: Sequence[int]) -> None:
    """The writer process's main: batches from `conn` until an empty one or EOF.

    It ignores SIGTERM and SIGINT (a signal to the whole process group): the proxy drains, then
    closes the pipe, and the writer closes its files after the last record. If the proxy dies,
    EOF ends it the same way."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    shared: Any = counters
    sink = KafkaSink(*kafka, counters=shared) if kafka is not None else None
    files = RecordFiles(Path(root), instance, log_format, rotate_bytes, worker, sink)
    topic_names: dict[bytes, str] = {}
    last_flush = time.monotonic()
    try:
        while True:
            if conn.poll(0.5):
                try:
                    data = conn.recv_bytes()
                except EOFError:
                    break
                if not data:
                    break
                rows: list[Row] = pickle.loads(data)
                for row in rows:
                    try:
                        files.write(build_record(row, instance, topic_names, worker))
                        shared[WRITTEN] += 1
                    except Exception:  # a bad record must not stop the log
                        shared[FAILED] += 1
                        log.exception("cannot write an access-log record")
            if sink is not None:
                sink.poll()  # delivery reports: every record sent is counted delivered or dropped
            if time.monotonic() - last_flush >= 1.0:
                files.flush()
                last_flush = time.monotonic()
    finally:
        files.close()
        if sink is not None:
            sink.close()
