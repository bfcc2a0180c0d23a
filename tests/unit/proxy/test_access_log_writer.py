"""The access-log writer: rows added to a column batch on the loop, records written by the writer
process, Parquet by default and JSON lines on request, every record valid against the shared contract."""

from __future__ import annotations

import json
import os
import signal
import struct
import threading
import time
from multiprocessing import Pipe
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from contracts.access_log import FIELD_NAMES, validate_record
from protocol.apis import ApiKey
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext, Pipeline, ResponseOutcome, StageBase
from proxy.ops import access_log, access_log_files
from proxy.ops.access_log import DEGRADED_HOLD_S, AccessLogStage, AccessLogWriter, WriterBackoff
from proxy.ops.access_log_batch import LogBatch
from proxy.ops.access_log_files import serve
from quotas.clock import FakeClock
from tests.harness.wait import eventually, wait_until
from tests.unit.protocol.test_records import LEGACY

CTX = ConnectionContext(3, "127.0.0.1:5000", "broker 1", 1, principal="alice",
                        client_software_name="test-client", client_software_version="1.0")


def serve_requests(writer: AccessLogWriter, n: int) -> None:
    clock = FakeClock(1_000)
    pipeline = Pipeline([AccessLogStage(writer, clock)])
    for i in range(n):
        entry = InFlight(i, ApiKey.METADATA, 1, "app", 30, clock.now_ms())
        response = struct.pack(">i", i) + b"\x00" * 8   # Metadata v1: brokers, controller, topics (none)
        entry.upstream_response_bytes = len(response)
        entry.response_received_ms = clock.now_ms() + 2
        pipeline.on_response(CTX, entry, response)
        entry.response_bytes = len(response)
        pipeline.on_complete(CTX, entry, clock.now_ms() + 2)


def read_parquet(root: Path) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for path in sorted(root.rglob("*.parquet")):
        rows += pq.read_table(path).to_pylist()
    return rows


@pytest.mark.parametrize("log_format", ["parquet", "json"])
def test_every_handed_over_record_is_written_valid_in_either_format(tmp_path: Path, log_format: str) -> None:
    writer = AccessLogWriter(tmp_path / "logs", "unit", log_format=log_format)
    writer.start()
    serve_requests(writer, 2_500)
    writer.close(timeout_s=60)
    if log_format == "parquet":
        records = read_parquet(tmp_path / "logs")
        assert not list((tmp_path / "logs").rglob("*.jsonl"))
    else:
        records = [json.loads(line) for p in sorted((tmp_path / "logs").rglob("*.jsonl"))
                   for line in p.read_text().splitlines()]
    assert len(records) == 2_500 and writer.written == 2_500
    assert writer.dropped == 0 and writer.failed == 0 and writer.queue_depth == 0
    assert sorted(r["correlation_id"] for r in records) == list(range(2_500))
    for record in records[:50]:
        assert list(record) == list(FIELD_NAMES)
        assert validate_record(record) == [], record
        assert record["principal"] == "alice" and record["client_software_name"] == "test-client"
        assert record["upstream_latency_ms"] == 2.0 and record["response_bytes"] == 12


def test_the_writer_process_writes_parquet_without_loading_pandas(tmp_path: Path) -> None:
    # pyarrow loads pandas (installed here: the Spark jobs use it) on its first conversion of a
    # Python list unless the process marked it absent; pandas' own extension modules would then
    # be mapped into the writer process
    writer = AccessLogWriter(tmp_path / "logs", "unit")
    writer.start()
    try:
        serve_requests(writer, 200)
        wait_until(lambda: writer.written == 200, 60, "the writer to write the 200 records")
        maps = Path(f"/proc/{writer.writer_pid}/maps").read_text()
        assert "/pyarrow/" in maps  # what wrote the Parquet file is there ...
        assert "/pandas/" not in maps  # ... and pandas is not
    finally:
        writer.close(timeout_s=60)


def test_a_full_handoff_drops_and_counts_instead_of_blocking(tmp_path: Path) -> None:
    writer = AccessLogWriter(tmp_path / "logs", "unit", queue_size=100)  # not started: nothing drains
    assert writer.problems() == []
    serve_requests(writer, 150)
    assert writer.waiting == 100 and writer.dropped == 50 and writer.queue_depth == 100
    assert writer.drops == {"queue_full": 50, "writer_died": 0, "topic": 0}
    # degraded while records are dropped, and for DEGRADED_HOLD_S after the last one
    assert writer.problems() == ["access log: records dropped in the last 10 s (in all: 50 queue_full)"]
    assert writer.problems(now_s=time.monotonic() + DEGRADED_HOLD_S + 0.1) == []


def test_the_writer_backoff_doubles_to_its_cap_and_resets_after_a_stable_run() -> None:
    backoff = WriterBackoff(initial_s=0.5, max_s=4.0, stable_after_s=60.0)
    delays: list[float] = []
    previous: float | None = None
    for _ in range(6):
        previous = backoff.delay_s(previous, ran_s=1.0)
        delays.append(previous)
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert backoff.delay_s(4.0, ran_s=60.0) == 0.5


#: the longest a writer process's cold start may take on a loaded machine (see the test below)
COLD_START_S = 120.0


def test_a_killed_writer_is_restarted_its_lost_records_counted_and_the_log_goes_on(tmp_path: Path) -> None:
    """SIGSTOP the writer, hand records over (they sit unread in the pipe), SIGKILL it: the feeder
    notices, counts what was sent and never written as dropped (writer_died), reports the log
    degraded while the writer is down, starts a new writer after the backoff, and every record
    handed over afterwards is written."""
    writer = AccessLogWriter(tmp_path / "logs", "unit", log_format="json",
                             backoff=WriterBackoff(initial_s=1.0))
    writer.start()
    # A writer is a fresh process (spawned, it imports pyarrow): its cold start took 5-19 s in this
    # test beside the whole suite at load ~20, and more than 30 s once in the pure-Python run at
    # that load. The deadlines below wait for a cold start, so they are COLD_START_S, not less.
    try:
        serve_requests(writer, 100)
        wait_until(lambda: writer.written == 100, COLD_START_S, "the first records written")
        first_pid = writer.writer_pid
        assert first_pid is not None
        os.kill(first_pid, signal.SIGSTOP)
        serve_requests(writer, 50)
        wait_until(lambda: writer.sent == 150, 30, "the records sent to the stopped writer")
        os.kill(first_pid, signal.SIGKILL)
        down = eventually(writer.problems, lambda p: any("writer process died" in w for w in p), timeout_s=10)
        assert any("writer process died (exit status -9)" in w for w in down), down
        assert writer.drops["writer_died"] == 50 and writer.restarts == 0
        serve_requests(writer, 30)  # handed over while it is down: they wait in the queue
        wait_until(lambda: writer.restarts == 1, COLD_START_S, "the writer restarted")
        # up again, and still degraded: records were dropped within DEGRADED_HOLD_S (1 s ago)
        assert [p for p in writer.problems() if "50 writer_died" in p]
        assert writer.writer_pid not in (None, first_pid)
        wait_until(lambda: writer.written == 130, COLD_START_S,
                   "the records handed over after the kill written")
        assert writer.queue_depth == 0
        assert writer.problems(now_s=time.monotonic() + DEGRADED_HOLD_S + 0.1) == []  # then healthy
    finally:
        writer.close(timeout_s=30)


def test_the_feeder_sleeps_until_a_batch_is_full_the_writer_exits_or_the_log_closes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the once-a-second send pushed out to an hour, only the wake-ups move records: the
    loop's when a batch reaches `send_rows`, the writer process's exit, and `close`."""
    monkeypatch.setattr(access_log, "SEND_INTERVAL_S", 3600.0)
    writer = AccessLogWriter(tmp_path / "logs", "unit", log_format="json", queue_size=200,
                             backoff=WriterBackoff(initial_s=0.5))
    assert writer.send_rows == 100  # half of queue_size
    writer.start()
    try:
        serve_requests(writer, 100)  # the 100th record wakes the feeder: the batch goes now
        wait_until(lambda: writer.written == 100, COLD_START_S, "a full batch written")
        first_pid = writer.writer_pid
        assert first_pid is not None
        os.kill(first_pid, signal.SIGKILL)  # the exit wakes the feeder, which restarts the writer
        wait_until(lambda: writer.restarts == 1, COLD_START_S, "the writer restarted")
        assert writer.writer_pid not in (None, first_pid)
        serve_requests(writer, 10)  # a part batch: it waits for the hour, or for close
        assert writer.waiting == 10
    finally:
        writer.close(timeout_s=COLD_START_S)
    assert writer.written == 110 and writer.queue_depth == 0


def test_the_brokers_throttle_is_logged_even_when_sluice_patched_a_larger_one() -> None:
    writer = AccessLogWriter(Path("/nonexistent"), "unit")  # not started: only the stage and the row
    clock = FakeClock(0)
    patch = ResponseOutcome(struct.pack(">iii", 7, 0, 9000))  # Sluice's 9000 ms written first

    class Patcher(StageBase):
        def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome:
            return patch

    pipeline = Pipeline([Patcher(), AccessLogStage(writer, clock)])  # the log stage sees the patched bytes
    entry = InFlight(7, ApiKey.PRODUCE, 8, "app", 100, 0)
    broker = struct.pack(">iii", 7, 0, 450)  # Produce v8: no topics, throttle_time_ms 450
    entry.upstream_response_bytes = entry.response_received_ms = len(broker)
    pipeline.on_response(CTX, entry, broker)
    pipeline.on_complete(CTX, entry, 0)
    (record,) = records_of(writer._take())
    assert record["broker_throttle_time_ms"] == 450


# ------------------------------------------------------------------ the writer process's loop

HOUR_MS = 3_600_000
T0 = 1_767_225_600_000 + HOUR_MS - 40  # 40 ms before 01:00 UTC: the batches cross an hour


def records_of(batch: LogBatch, topic_names: dict[bytes, str] | None = None) -> list[dict[str, object]]:
    from proxy.ops.access_log_arrow import to_record_batch

    record_batch, failed = to_record_batch(LogBatch.from_message(batch.message()), "unit", None,
                                           {} if topic_names is None else topic_names)
    assert failed == 0
    return list(record_batch.to_pylist())


def mixed_batch(first: int, count: int) -> LogBatch:
    """Records first..first+count-1 of the endless traffic mix (`access_log_traffic`: every kind of
    record), record i received at T0 + i ms with correlation id i."""
    from tests.unit.proxy.access_log_traffic import CONTEXTS, exchanges, serve_one

    writer = AccessLogWriter(Path("/nonexistent"), "unit", queue_size=10**6)  # not started
    stage = AccessLogStage(writer, FakeClock(0))
    stage._epoch_offset_ms = T0
    pipeline = Pipeline([stage])
    mix = list(exchanges())
    for i in range(first, first + count):
        serve_one(pipeline, CONTEXTS[i % 2], mix[i % len(mix)], i, i)
    return writer._take()


MIX = 19  # exchanges in the traffic mix


def written(root: Path) -> list[tuple[str, int, list[dict[str, object]]]]:
    """(file, row groups, records) of every Parquet file under `root`."""
    out = []
    for path in sorted(root.rglob("*.parquet")):
        f = pq.ParquetFile(path)
        out.append((str(path.relative_to(root)), f.num_row_groups, f.read().to_pylist()))
    return out


def serve_batches(root: Path, batches: list[bytes], worker: int | None = None,
                  rotate_bytes: int = 1 << 30, log_format: str = "parquet") -> tuple[int, int]:
    """Runs the writer process's main loop in this process over `batches` (messages; then the
    empty message that ends it); returns its (written, failed) counters."""
    receiver, sender = Pipe(duplex=False)

    def feed() -> None:  # a thread sends, as the proxy would: a pipe holds less than these batches
        for message in [*batches, b""]:
            sender.send_bytes(message)

    feeder = threading.Thread(target=feed)
    feeder.start()
    counters = [0] * len(access_log_files.COUNTERS)
    serve(receiver, str(root), "unit", log_format, rotate_bytes, worker, None, counters)
    feeder.join()
    return counters[0], counters[1]


@pytest.fixture
def no_signal_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    # serve() ignores SIGTERM and SIGINT for its own process; pytest's must keep them
    monkeypatch.setattr(signal, "signal", lambda *_: None)


@pytest.mark.usefixtures("no_signal_handlers")
@pytest.mark.parametrize("worker", [None, 2])
def test_batches_become_records_split_by_hour_size_and_row_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, worker: int | None) -> None:
    monkeypatch.setattr(access_log_files, "_PARQUET_ROWS", 64)   # several row groups per file
    batches = [mixed_batch(i, min(97, 500 - i)).message() for i in range(0, 500, 97)]
    assert serve_batches(tmp_path, batches, worker, rotate_bytes=200 * 150) == (500, 0)  # ~150 a file
    got = written(tmp_path)
    # the hour boundary and the size rotation split files: 40 rows in hour 00, then 150-row files
    assert [(name.split("/")[1], len(records)) for name, _, records in got] == [
        ("hour=00", 40), ("hour=01", 150), ("hour=01", 150), ("hour=01", 150), ("hour=01", 10)]
    # row groups of at most 64 rows, across batches: 150 rows make three
    assert [groups for _, groups, _ in got] == [1, 3, 3, 3, 1]
    records = [r for _, _, rs in got for r in rs]
    assert [r["correlation_id"] for r in records] == list(range(500))
    assert all(validate_record(r) == [] for r in records)
    assert records[0]["topics"] == [{"topic": "a", "partition": 0, "records": 5, "bytes": 127},
                                    {"topic": "a", "partition": 1, "records": 0, "bytes": 0},  # null set
                                    {"topic": "b", "partition": 7, "records": None, "bytes": len(LEGACY)}]
    assert records[0]["error_codes"] == [6, 19] and records[0]["broker_throttle_time_ms"] == 120
    assert records[6]["topics"] is None and records[6]["broker_throttle_time_ms"] == 33  # walk failed
    assert records[10]["topics"] is None and records[10]["broker_throttle_time_ms"] == 250  # streamed head
    assert records[11]["topics"] is None and records[11]["error_codes"] == []  # truncated: none read
    assert records[15]["error_codes"] == [27]                                  # read by the writer (kio)
    assert all(r["worker"] == worker and r["instance"] == "unit" for r in records)


@pytest.mark.usefixtures("no_signal_handlers")
def test_json_lines_rotate_by_their_size_as_records_one_by_one_would(tmp_path: Path) -> None:
    batches = [mixed_batch(i, 50).message() for i in range(40, 240, 50)]  # all in hour 01
    lines_bytes = 0
    assert serve_batches(tmp_path, batches, rotate_bytes=4_000, log_format="json") == (200, 0)
    files = sorted(tmp_path.rglob("*.jsonl"))
    sizes = [len(p.read_text()) for p in files]
    # each file was started empty and took records until it reached 4,000 characters: every file
    # but the last is at least that full, and would have been under it without its last line
    for path, size in zip(files[:-1], sizes, strict=False):
        last = path.read_text().splitlines()[-1]
        assert size >= 4_000 > size - len(last) - 1, (path, size)
    records = [json.loads(line) for p in files for line in p.read_text().splitlines()]
    lines_bytes = sum(sizes)
    assert [r["correlation_id"] for r in records] == list(range(40, 240)) and lines_bytes > 4_000 * 3


@pytest.mark.usefixtures("no_signal_handlers")
def test_a_deferred_response_that_cannot_be_read_is_counted_and_the_others_are_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from protocol import records

    def broken(payload: bytes, api_key: int, api_version: int) -> list[int]:
        if api_key == ApiKey.HEARTBEAT:
            raise RuntimeError("a bug in the decoder")
        return real(payload, api_key, api_version)

    real = records.response_error_codes
    monkeypatch.setattr(records, "response_error_codes", broken)
    # records 15 and 16 are Heartbeats: the writer reads their error codes
    assert serve_batches(tmp_path, [mixed_batch(0, 10).message(), mixed_batch(10, 9).message()]) == (17, 2)
    assert [r["correlation_id"] for _, _, rs in written(tmp_path) for r in rs] == [
        i for i in range(19) if i not in (15, 16)]


def test_the_topic_sinks_settings_are_secret_and_need_the_sink() -> None:
    from proxy.config import ConfigError, load_config
    from proxy.server import make_access_log

    base = {"upstream": {"bootstrap": "localhost:9092"}}
    sink = {"dir": "/tmp/al", "format": "json", "kafka_bootstrap": "b:9092", "kafka_topic": "log",
            "kafka_config": {"sasl.password": "hunter2", "message.timeout.ms": 5000,
                             "enable.idempotence": True}}
    config = load_config(None, {**base, "access_log": sink}, environ={})
    assert "hunter2" not in repr(config) and "hunter2" not in str(config.access_log)
    writer = make_access_log(config)
    assert writer is not None  # what the writer process gets: librdkafka's strings
    assert writer._kafka == ("b:9092", "log", {"sasl.password": "hunter2", "message.timeout.ms": "5000",
                                               "enable.idempotence": "true"})
    with pytest.raises(ConfigError, match="access_log"):
        load_config(None, {**base, "access_log": {"dir": "/tmp/al", "kafka_config": {"a": "b"}}}, environ={})


@pytest.mark.usefixtures("no_signal_handlers")
def test_records_the_topic_sink_cannot_deliver_are_counted_dropped_not_delivered(tmp_path: Path) -> None:
    """A sink whose cluster is unreachable: after message.timeout.ms every record it was given is
    counted dropped (the files still have them)."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    receiver, sender = Pipe(duplex=False)
    sender.send_bytes(mixed_batch(0, 10).message())
    sender.send_bytes(b"")
    counters = [0] * len(access_log_files.COUNTERS)
    serve(receiver, str(tmp_path), "unit", "json", 1 << 20, None,
          (f"127.0.0.1:{port}", "log", {"message.timeout.ms": "300"}), counters)
    assert counters[access_log_files.WRITTEN] == 10
    assert counters[access_log_files.TOPIC_DROPPED] == 10 and counters[access_log_files.TOPIC_DELIVERED] == 0
