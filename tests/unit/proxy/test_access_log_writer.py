"""The access-log writer: tuples handed over on the loop, records written by the writer process,
Parquet by default and JSON lines on request, every record valid against the shared contract."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from contracts.access_log import FIELD_NAMES, validate_record
from protocol.apis import ApiKey
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext, Pipeline, ResponseOutcome, StageBase
from proxy.ops.access_log import AccessLogStage, AccessLogWriter, row_of
from proxy.ops.access_log_files import build_record
from quotas.clock import FakeClock

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


def test_a_full_handoff_drops_and_counts_instead_of_blocking(tmp_path: Path) -> None:
    writer = AccessLogWriter(tmp_path / "logs", "unit", queue_size=100)  # not started: nothing drains
    serve_requests(writer, 150)
    assert len(writer.handoff) == 100 and writer.dropped == 50


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
    record = build_record(row_of(writer.handoff[0]), "unit", {})
    assert record["broker_throttle_time_ms"] == 450
