"""The access-log writer process: column batches in, records of `contracts.access_log` out, to files
(Parquet or JSON lines) and optionally a Kafka topic.

It runs in its own process (`proxy.ops.access_log.AccessLogWriter` starts it), so building records
and encoding them never compete with the proxy's event loop for the GIL. It reads batches
(`proxy.ops.access_log_batch.LogBatch` messages: the columns the proxy filled, already holding
each request's partitions, error codes and throttle times) from a pipe until an empty message or
EOF (the proxy died), then closes its files. Each batch becomes one Arrow record batch
(`proxy.ops.access_log_arrow.to_record_batch`), whatever the format. Files are partitioned by UTC
date and hour and rotate by size and hour; JSON is flushed every second; Parquet files are written
with pyarrow, one row group per 50,000 records.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any, Protocol

from contracts.access_log import dumps_record, partition_path
from proxy.ops.access_log_arrow import arrow_schema, to_record_batch
from proxy.ops.access_log_batch import LogBatch

log = logging.getLogger("sluice.access_log")

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


_HOUR_MS = 3_600_000  # UTC hours are whole multiples of it in epoch milliseconds


class RecordFiles:
    """Appends record batches to files partitioned by UTC date and hour, rotating by size and hour.

    A batch is cut where a record's hour differs from the open file's, or where the file is full
    (Parquet: `_PARQUET_ROW_BYTES` a record; JSON: the lines' bytes), so each record lands where
    it would if records came one by one."""

    def __init__(self, root: Path, instance: str, log_format: str, rotate_bytes: int,
                 worker: int | None, sink: RecordSink | None) -> None:
        self.root, self.instance, self.log_format = root, instance, log_format
        self.rotate_bytes, self.worker, self._sink = rotate_bytes, worker, sink
        self._file: IO[str] | None = None
        self._file_hour: int | None = None
        self._file_bytes = 0
        self._seq = 0
        self._path: Path | None = None
        self._pending: list[Any] = []   # Parquet: record batches not yet in a row group
        self._rows = 0
        self._parquet: Any = None   # pyarrow.parquet.ParquetWriter of the open file

    def write_batch(self, batch: Any) -> None:
        """Append the records of an Arrow record batch (`proxy.ops.access_log_arrow`)."""
        import pyarrow.compute as pc

        n = batch.num_rows
        if not n:
            return
        lines: list[str] | None = None
        ends: list[int] = []  # JSON: the file bytes records 0..i add, cumulated
        if self.log_format == "json" or self._sink is not None:
            lines = [dumps_record(record) for record in batch.to_pylist()]
            if self.log_format == "json":
                ends = list(itertools.accumulate(len(line) + 1 for line in lines))
        ts_ms = batch.column("ts_ms")
        hours = pc.divide(ts_ms, _HOUR_MS)
        starts = [0]
        if n > 1:  # where a record's hour differs from the one before
            changed = pc.not_equal(hours.slice(1), hours.slice(0, n - 1))
            starts += [i + 1 for i in pc.indices_nonzero(changed).to_pylist()]
        starts.append(n)
        for run_start, run_end in itertools.pairwise(starts):
            start = run_start
            while start < run_end:
                self._roll(ts_ms[start].as_py())
                end = min(run_end, start + self._room(ends, start))
                self._append(batch, lines, start, end)
                start = end

    def _room(self, ends: list[int], start: int) -> int:
        """How many records from `start` on the open file takes: the one that fills it is the last."""
        left = self.rotate_bytes - self._file_bytes
        if self.log_format == "json":
            before = ends[start - 1] if start else 0
            return bisect.bisect_left(ends, before + left, lo=start) - start + 1
        return max(1, -(-left // _PARQUET_ROW_BYTES))

    def _append(self, batch: Any, lines: list[str] | None, start: int, end: int) -> None:
        if lines is not None:
            part = lines[start:end]
            if self.log_format == "json":
                assert self._file is not None
                text = "".join(line + "\n" for line in part)
                self._file.write(text)
                self._file_bytes += len(text)  # characters, as the rotation has always counted
            if self._sink is not None:
                for line in part:
                    self._sink.send(line)
        if self.log_format == "parquet":
            self._pending.append(batch.slice(start, end - start))
            self._rows += end - start
            self._file_bytes += (end - start) * _PARQUET_ROW_BYTES
            while self._rows >= _PARQUET_ROWS:
                self._write_row_group(_PARQUET_ROWS)

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

    def _write_row_group(self, rows: int) -> None:
        """The first `rows` pending records (at most) as one row group."""
        if not self._rows:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = arrow_schema()
        table = pa.Table.from_batches(self._pending, schema=schema)
        rows = min(rows, self._rows)
        rest = table.slice(rows)
        self._pending = rest.to_batches() if rest.num_rows else []
        self._rows = rest.num_rows
        if self._parquet is None:
            assert self._path is not None
            self._parquet = pq.ParquetWriter(self._path, schema)
        self._parquet.write_table(table.slice(0, rows).combine_chunks(), row_group_size=rows)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.log_format == "parquet":
            try:
                self._write_row_group(self._rows)
            finally:  # a row group pyarrow refuses is dropped, never written again with the next ones
                self._pending, self._rows = [], 0
                if self._parquet is not None:
                    self._parquet.close()
                    self._parquet = None


class _NoPandas:
    """An import finder that answers "no such module" for pandas (pyarrow then goes without it)."""

    def find_spec(self, name: str, path: object, target: object = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"{name}: not used by the access-log writer", name=name)
        return None  # any other module: the next finder's


def writer_process(*args: Any) -> None:
    """The writer process's target: `serve(*args)` in a process that refuses pandas.

    The writer never uses pandas, but pyarrow imports it, when it is installed, the first time it
    converts a Python list (to check the list for pandas objects): 0.5 s of CPU on this kind of
    machine with a bytecode cache, 2 s without one, spent on the writer's first batch. Refused,
    pyarrow converts without it. (`sys.modules["pandas"] = None` is not enough: pyarrow's compiled
    import takes the None for the module.)"""
    sys.meta_path.insert(0, _NoPandas())
    serve(*args)


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
                write_message(data, files, instance, worker, topic_names, shared)
            if sink is not None:
                sink.poll()  # delivery reports: every record sent is counted delivered or dropped
            if time.monotonic() - last_flush >= 1.0:
                files.flush()
                last_flush = time.monotonic()
    finally:
        files.close()
        if sink is not None:
            sink.close()


def write_message(data: bytes, files: RecordFiles, instance: str, worker: int | None,
                  topic_names: dict[bytes, str], counters: Any) -> None:
    """One batch from the proxy into the files; its records counted written or failed."""
    rows = 0
    try:
        batch = LogBatch.from_message(data)
        rows = len(batch)
        record_batch, failed = to_record_batch(batch, instance, worker, topic_names)
        files.write_batch(record_batch)
    except Exception:  # a bad batch must not stop the log
        counters[FAILED] += rows
        log.exception("cannot write a batch of %d access-log record(s)", rows)
        return
    counters[FAILED] += failed
    counters[WRITTEN] += record_batch.num_rows
