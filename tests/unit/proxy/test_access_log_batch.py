"""The columnar access log: the batch the loop fills, the Arrow records the writer makes of it, and
the golden files main's row-by-row writer made of the same traffic (`access_log_traffic`)."""

from __future__ import annotations

import math
import signal
import threading
from multiprocessing import Pipe
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from contracts.access_log import FIELD_NAMES, validate_record
from protocol.apis import ApiKey
from proxy.flow.inflight import InFlight, QuotaNote
from proxy.flow.pipeline import ConnectionContext, Pipeline, StageBase
from proxy.ops import access_log_files
from proxy.ops.access_log import AccessLogStage, AccessLogWriter
from proxy.ops.access_log_arrow import to_record_batch
from proxy.ops.access_log_batch import NULL_INT, LogBatch
from quotas.clock import FakeClock
from quotas.entity import ClientIdentity
from tests.unit.protocol.test_records import LEGACY, produce_v3_request
from tests.unit.proxy.access_log_traffic import TOPIC_ID, decisions, drive

GOLDEN = Path(__file__).parent / "data"
CTX = ConnectionContext(3, "10.0.0.7:5211", "broker 1", 1, principal="alice",
                        client_software_name="librdkafka", client_software_version="2.6.0")


def one_batch(*entries: InFlight) -> LogBatch:
    batch = LogBatch()
    for i, entry in enumerate(entries):
        batch.add(CTX, entry, 1_767_225_600_000 + i, 1 << 20)
    return batch


def records_of(batch: LogBatch, topic_names: dict[bytes, str] | None = None) -> list[dict[str, object]]:
    record_batch, failed = to_record_batch(LogBatch.from_message(batch.message()), "unit", 3,
                                           {} if topic_names is None else topic_names)
    assert failed == 0
    return list(record_batch.to_pylist())


def test_a_produce_row_holds_its_partitions_and_no_payload() -> None:
    payload = produce_v3_request()
    from protocol.fastpath import read_request_header

    entry = InFlight(7, ApiKey.PRODUCE, 3, "cli", len(payload), 100)
    entry.produce_parts(payload, read_request_header(payload))
    assert entry.parts == (("a", None, 0, 5, 127), ("a", None, 1, 0, 0), ("b", None, 7, -1, len(LEGACY)))
    batch = one_batch(entry)
    # columns, not objects: one row, three partitions, and nothing of the payload
    assert len(batch) == 1 and list(batch.topics_end) == [3] and list(batch.topics_valid) == [1]
    assert list(batch.part_index) == [0, 1, 7] and list(batch.part_records) == [5, 0, -1]
    assert list(batch.part_bytes) == [127, 0, len(LEGACY)] and batch.topics == ["a", "b"]
    assert list(batch.response_bytes) == [NULL_INT] and math.isnan(batch.latency_ms[0])  # no response yet
    assert batch.deferred == [] and len(batch.message()) < 1_000
    (record,) = records_of(batch)
    assert list(record) == list(FIELD_NAMES) and validate_record(record) == []
    assert record["topics"] == [{"topic": "a", "partition": 0, "records": 5, "bytes": 127},
                                {"topic": "a", "partition": 1, "records": 0, "bytes": 0},
                                {"topic": "b", "partition": 7, "records": None, "bytes": len(LEGACY)}]
    assert record["response_bytes"] is None and record["upstream_latency_ms"] is None
    assert record["worker"] == 3 and record["client_software_version"] == "2.6.0"


def test_a_malformed_produce_request_is_logged_without_topics() -> None:
    from protocol.fastpath import read_request_header

    payload = produce_v3_request()[:-5]
    entry = InFlight(7, ApiKey.PRODUCE, 3, "cli", len(payload), 100)
    entry.produce_parts(payload, read_request_header(payload))
    assert entry.parts is None and entry.parts_walked
    (record,) = records_of(one_batch(entry))
    assert record["topics"] is None and record["error_codes"] == []


def test_repeated_strings_and_quotas_are_stored_once_per_batch() -> None:
    entries = []
    for i in range(6):
        entry = InFlight(i, ApiKey.METADATA, 1, f"app-{i % 2}", 30, 100)
        entry.quota = QuotaNote(ClientIdentity("alice", "app"), decisions("matched" if i % 3 else "shadow",
                                                                          ApiKey.METADATA), 0)
        entries.append(entry)
    batch = one_batch(*entries)
    assert len(batch.conns) == 1 and batch.client_ids == ["app-0", "app-1"]
    assert len(batch.quotas) == 2  # the matched decision, and the shadow one
    records = records_of(batch)
    assert [r["client_id"] for r in records] == ["app-0", "app-1"] * 3
    assert [r["shadow"] for r in records] == [True, False, False, True, False, False]
    assert [r["would_throttle_ms"] for r in records] == [5, None, None, 5, None, None]
    assert records[1]["quota_entity"] == "user=al%2Cice%3D%25,client-id=app"
    assert records[1]["quota_limit"] == 2048.0 and records[1]["quota_kind"] == "request_rate"
    assert all(validate_record(r) == [] for r in records)


def test_other_apis_responses_go_to_the_writer_within_the_budget() -> None:
    from kio.schema.errors import ErrorCode

    from tests.unit.proxy.access_log_traffic import heartbeat_v4_response

    response = heartbeat_v4_response(ErrorCode.rebalance_in_progress, 40)

    def heartbeat() -> InFlight:
        entry = InFlight(1, ApiKey.HEARTBEAT, 4, "app", 30, 100)
        entry.broker_response = response
        entry.upstream_response_bytes = entry.response_bytes = len(response)
        entry.response_received_ms = 102
        return entry

    batch = LogBatch()
    for i in range(3):  # room for two
        batch.add(CTX, heartbeat(), 1_767_225_600_000 + i, 2 * len(response))
    assert [row for row, *_ in batch.deferred] == [0, 1] and batch.deferred_bytes == 2 * len(response)
    records = records_of(batch)
    assert [r["error_codes"] for r in records] == [[27], [27], []]     # past the budget: none
    assert [r["broker_throttle_time_ms"] for r in records] == [40] * 3  # read on the loop
    assert [r["upstream_latency_ms"] for r in records] == [2.0] * 3


def test_metadata_in_a_batch_names_the_topic_ids_of_the_records() -> None:
    from protocol.fastpath import read_request_header
    from tests.unit.proxy.access_log_traffic import metadata_v12_response, produce_v13_request

    metadata = InFlight(1, ApiKey.METADATA, 12, "app", 30, 100)
    metadata.broker_response = metadata_v12_response()
    metadata.upstream_response_bytes = len(metadata.broker_response)
    payload = produce_v13_request(TOPIC_ID)
    produce = InFlight(2, ApiKey.PRODUCE, 13, "c", len(payload), 100, expects_response=False)
    produce.produce_parts(payload, read_request_header(payload))
    names: dict[bytes, str] = {}
    records = records_of(one_batch(produce, metadata), names)
    assert names == {TOPIC_ID.bytes: "orders"}
    assert records[0]["topics"][0]["topic"] == "orders"  # type: ignore[index]
    assert records[1]["error_codes"] == [3]   # the Metadata's unknown topic
    assert records_of(one_batch(produce))[0]["topics"][0]["topic"] == TOPIC_ID.bytes.hex()  # type: ignore[index]


def test_a_full_batch_drops_and_counts_without_touching_the_entry() -> None:
    writer = AccessLogWriter(Path("/nonexistent"), "unit", queue_size=100)
    for i in range(130):
        writer.add(CTX, InFlight(i, ApiKey.API_VERSIONS, 3, "app", 30, 100), 1_767_225_600_000)
    assert writer.waiting == 100 and writer.dropped == 30 and writer.drops["queue_full"] == 30
    assert len(writer._take()) == 100 and writer.waiting == 0


def test_a_batch_is_sent_before_a_small_queue_fills() -> None:
    from proxy.ops.access_log import SEND_ROWS, send_threshold

    assert send_threshold(100) == 50 and send_threshold(100_000) == SEND_ROWS == 8192
    assert send_threshold(1) == 1


def test_a_row_that_cannot_be_built_costs_that_record_only() -> None:
    writer = AccessLogWriter(Path("/nonexistent"), "unit")
    bad = InFlight(1, ApiKey.API_VERSIONS, 3, "app", 30, 100)
    bad.correlation_id = 2**40  # out of the int32 column's range: the row is refused whole
    writer.add(CTX, InFlight(0, ApiKey.API_VERSIONS, 3, "app", 30, 100), 1_767_225_600_000)
    writer.add(CTX, bad, 1_767_225_600_001)
    writer.add(CTX, InFlight(2, ApiKey.API_VERSIONS, 3, "app", 30, 100), 1_767_225_600_002)
    assert writer.unreadable == 1 and writer.failed == 1
    batch = writer._take()
    assert [r["correlation_id"] for r in records_of(batch)] == [0, 2]
    assert {len(getattr(batch, name)) for name in ("ts_ms", "conn", "api_key", "errors", "topics_end")} == {2}


# ------------------------------------------------------------------ golden: main's writer, same traffic


def _serve(messages: list[bytes], root: Path, log_format: str) -> list[int]:
    receiver, sender = Pipe(duplex=False)

    def feed() -> None:
        for message in [*messages, b""]:
            sender.send_bytes(message)

    feeder = threading.Thread(target=feed)
    feeder.start()
    counters = [0] * len(access_log_files.COUNTERS)
    access_log_files.serve(receiver, str(root), "golden", log_format, 1 << 30, 1, None, counters)
    feeder.join()
    return counters


@pytest.fixture
def no_signal_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # serve() ignores SIGTERM for its process


@pytest.mark.usefixtures("no_signal_handlers")
@pytest.mark.parametrize("log_format", ["parquet", "json"])
@pytest.mark.parametrize("per_batch", [57, 5])
def test_the_columnar_log_writes_what_mains_row_by_row_writer_wrote(
        tmp_path: Path, log_format: str, per_batch: int) -> None:
    """`data/access_log_golden.*` were written by main's writer (payloads shipped, rows re-walked
    in the writer process) from `access_log_traffic.drive`; the same traffic through the columnar
    log, in one batch or in batches of 5, gives the same Parquet columns and the same JSON bytes."""
    writer = AccessLogWriter(tmp_path / "unused", "golden", log_format=log_format, worker=1)
    stage = AccessLogStage(writer, FakeClock(1000))
    stage._epoch_offset_ms = 1_767_225_600_000  # as when the golden files were made
    messages: list[bytes] = []

    class Cut(StageBase):  # after the log's own hook: the batch taken at `per_batch` records
        def on_complete(self, ctx: ConnectionContext, entry: InFlight, sent_ms: int) -> None:
            if writer.waiting == per_batch:
                messages.append(writer._take().message())

    assert drive(Pipeline([stage, Cut()])) == 57
    assert len(messages) == 57 // per_batch
    if writer.waiting:
        messages.append(writer._take().message())
    assert _serve(messages, tmp_path / "logs", log_format)[:2] == [57, 0]
    (path,) = (tmp_path / "logs").rglob("*.*")
    if log_format == "json":
        assert path.read_bytes() == (GOLDEN / "access_log_golden.jsonl").read_bytes()
        return
    golden, new = pq.read_table(GOLDEN / "access_log_golden.parquet"), pq.read_table(path)
    assert new.schema.equals(golden.schema)
    for name in FIELD_NAMES:
        assert new.column(name).equals(golden.column(name)), name
