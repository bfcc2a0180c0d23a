"""The access log's compiled capture (`proxy.ops._speedups.AccessLogHooks`) against the stage's own
Python hooks and the batch's Python (`AccessLogStage`, `AccessLogWriter.add`, `LogBatch.add`), the
readable reference it stands in for.

The same traffic goes through a stage on each: the golden test's fixed mix, which walks every
branch of what a record says (Produce of several versions, malformed, acks=0; Fetch whole,
streamed, truncated, larger than the log reads; ApiVersions; Metadata and other APIs whose
responses go to the writer process; requests Sluice answered; matched, shadow and no quota
decisions), in batches cut at random points and with a batch limit that drops records; and
random Produce, Fetch and ApiVersions exchanges whose responses are whole, cut or garbage. Both
must build the same batches, byte for byte as they cross the pipe to the writer, and count the
same drops and unreadable records.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from protocol.apis import ApiKey
from protocol.headers import read_request_header
from proxy.flow.inflight import InFlight, QuotaNote
from proxy.flow.pipeline import ConnectionContext, Pipeline, StageBase
from proxy.ops import access_log
from proxy.ops.access_log import AccessLogStage, AccessLogWriter
from quotas.clock import FakeClock
from quotas.entity import ClientIdentity
from tests.unit.differential.impls import Loose, built
from tests.unit.protocol.test_records import produce_v3_request
from tests.unit.proxy.access_log_traffic import api_versions_v3_response, decisions, drive, request_frame

CTX = ConnectionContext(3, "10.0.0.7:5211", "broker 1", 1, principal="alice",
                        client_software_name="librdkafka", client_software_version="2.6.0")


def compiled() -> Any:
    """proxy.ops._speedups."""
    return built(access_log.COMPILED_MODULE, "proxy.ops._speedups")


class Cutter(StageBase):
    """After the log's own hook: the batch taken whenever it holds `every` records."""

    def __init__(self, writer: AccessLogWriter, every: int) -> None:
        self.writer, self.every, self.messages = writer, every, []

    def on_complete(self, ctx: ConnectionContext, entry: InFlight, sent_ms: int) -> None:
        if self.writer.waiting >= self.every:
            self.messages.append(self.writer._take().message())


def stage_pair(tmp_path: Path, queue_size: int) -> list[tuple[AccessLogStage, AccessLogWriter]]:
    """(a stage on the compiled hooks, a stage on its own Python hooks), each with its writer (not
    started: the batches are taken by hand)."""
    out = []
    for hooks in ("compiled", "reference"):
        writer = AccessLogWriter(tmp_path / hooks, "golden", worker=1, queue_size=queue_size)
        stage = AccessLogStage(writer, FakeClock(1000))
        stage._epoch_offset_ms = 1_767_225_600_000
        if hooks == "compiled":
            fast = compiled().AccessLogHooks(stage, AccessLogStage.on_complete)
            stage.on_request = fast.on_request  # type: ignore[method-assign]
            stage.on_complete = fast.on_complete  # type: ignore[method-assign]
        else:
            vars(stage).pop("on_request", None)
            vars(stage).pop("on_complete", None)
        out.append((stage, writer))
    return out


def batches(writer: AccessLogWriter, cutter: Cutter) -> list[bytes]:
    return [*cutter.messages, writer._take().message()]


@pytest.mark.both_twins
@pytest.mark.parametrize(("every", "queue_size"), [(1000, 100_000), (5, 100_000), (1, 1), (7, 4), (1000, 3)])
def test_the_golden_traffic_makes_the_same_batches(tmp_path: Path, every: int, queue_size: int) -> None:
    seen = []
    for stage, writer in stage_pair(tmp_path, queue_size):
        cutter = Cutter(writer, every)
        assert drive(Pipeline([stage, cutter])) == 57
        seen.append((batches(writer, cutter), writer.dropped, writer.unreadable))
    assert seen[0] == seen[1]
    assert (seen[0][1] > 0) == (queue_size < min(every, 57))  # a batch at its limit drops, on both


def produce_response(correlation_id: int, version: int, code: int, throttle_ms: int) -> bytes:
    """Produce v3-v8: one topic "t", one partition; then throttle_time_ms."""
    if version < 3 or version > 8:
        raise ValueError(version)
    topic = struct.pack(">h", 1) + b"t"
    partition = struct.pack(">ihqq", 0, code, 5, -1) + (struct.pack(">q", 0) if version >= 5 else b"")
    if version >= 8:
        partition += struct.pack(">ii", 0, -1) + struct.pack(">h", -1)
    body = struct.pack(">i", 1) + topic + struct.pack(">i", 1) + partition + struct.pack(">i", throttle_ms)
    return struct.pack(">i", correlation_id) + body


exchange_st = st.tuples(
    st.sampled_from([ApiKey.PRODUCE, ApiKey.PRODUCE, ApiKey.API_VERSIONS, ApiKey.FETCH]),
    st.sampled_from(["whole", "cut", "garbage", "none", "answered"]),
    # the quota note's throttle; 2**31 does not fit its int32 column: the row is dropped whole, on both
    st.integers(-1, 30), st.one_of(st.integers(0, 500), st.just(2**31)),
    st.sampled_from(["none", "matched", "shadow", "unmatched"]),
    st.sampled_from(["app", None, "zoë"]), st.integers(0, 50))


@pytest.mark.both_twins
@settings(max_examples=150, deadline=None)
@given(exchanges=st.lists(exchange_st, max_size=40), every=st.integers(1, 50), queue_size=st.integers(1, 60))
@example(exchanges=[(ApiKey.PRODUCE, "whole", 0, 7, "matched", "app", 1),
                    (ApiKey.PRODUCE, "whole", 0, 2**31, "matched", "app", 1),  # dropped whole, on both
                    (ApiKey.API_VERSIONS, "whole", 0, 0, "none", "app", 1)], every=50, queue_size=60)
def test_random_exchanges_make_the_same_batches(tmp_path_factory: pytest.TempPathFactory,
                                                exchanges: list[tuple[Any, ...]], every: int,
                                                queue_size: int) -> None:
    tmp_path = tmp_path_factory.mktemp("hooks")
    seen = []
    for stage, writer in stage_pair(tmp_path, queue_size):
        cutter = Cutter(writer, every)
        pipeline = Pipeline([stage, cutter])
        now = 1_000
        for n, (api, how, code, throttle, quota, client, latency) in enumerate(exchanges):
            version = {ApiKey.PRODUCE: 3, ApiKey.API_VERSIONS: 3, ApiKey.FETCH: 4}[api]
            payload = produce_v3_request() if api == ApiKey.PRODUCE else request_frame(api, version, n)
            header = read_request_header(payload)
            entry = InFlight(n, api, version, client, len(payload), now)
            pipeline.on_request(CTX, entry, header, payload)
            if quota != "none":
                entry.quota = QuotaNote(ClientIdentity("alice", client), decisions(quota, api), throttle)
            wire_throttle = min(throttle, 2**31 - 1)  # the broker's own throttle_time_ms, an int32
            if api == ApiKey.PRODUCE:
                response = produce_response(n, version, max(code, 0), wire_throttle)
            elif api == ApiKey.API_VERSIONS:
                response = api_versions_v3_response(
                    ErrorCode.none if code <= 0 else ErrorCode.unsupported_version)
            else:
                response = struct.pack(">ii", n, wire_throttle) + b"\x00" * 12
            now += latency
            if how == "answered":
                entry.answer(response, now)
            elif how != "none":
                shown = {"whole": response, "cut": response[: max(4, len(response) // 2)],
                         "garbage": struct.pack(">i", n) + bytes([0xFF]) * 9}[how]
                entry.response_received_ms = now
                entry.upstream_response_bytes = len(response) if how == "cut" else len(shown)
                entry.response_bytes = len(shown)
                entry.broker_response = shown
            pipeline.on_complete(CTX, entry, now)
        seen.append((batches(writer, cutter), writer.dropped, writer.unreadable))
    assert seen[0] == seen[1]
    if seen[0][2]:  # the only rows that cannot be stored: a throttle past int32 (counted, not written)
        assert any(throttle >= 2**31 and quota != "none" for _, _, _, throttle, quota, _, _ in exchanges)


@pytest.mark.both_twins
def test_a_stage_runs_the_compiled_capture_when_it_is_built(tmp_path: Path) -> None:
    stage = AccessLogStage(AccessLogWriter(tmp_path, "x", worker=1), FakeClock(0))
    if access_log._CHOICE.active is None:
        assert stage.on_complete.__func__ is AccessLogStage.on_complete  # type: ignore[attr-defined]
    else:
        assert type(stage.on_complete.__self__) is compiled().AccessLogHooks  # type: ignore[attr-defined]


@pytest.mark.both_twins
@pytest.mark.parametrize("loose", ["entry", "context"])
def test_an_entry_or_context_of_another_class_is_the_references(tmp_path: Path, loose: str) -> None:
    ctx: Any = Loose(CTX) if loose == "context" else CTX
    seen = []
    for stage, writer in stage_pair(tmp_path, 100):
        pipeline = Pipeline([stage])
        for n in range(3):
            payload = produce_v3_request()
            entry = InFlight(n, ApiKey.PRODUCE, 3, "app", len(payload), 1_000 + n)
            pipeline.on_request(ctx, entry, read_request_header(payload), payload)
            entry.quota = QuotaNote(ClientIdentity("alice", "app"), decisions("matched", ApiKey.PRODUCE), 5)
            response = produce_response(n, 3, 0, 0)
            entry.response_received_ms, entry.upstream_response_bytes = 1_010 + n, len(response)
            entry.response_bytes, entry.broker_response = len(response), response
            pipeline.on_complete(ctx, Loose(entry) if loose == "entry" else entry, 1_010 + n)
        seen.append((batches(writer, Cutter(writer, 1000)), writer.dropped, writer.unreadable))
    assert seen[0] == seen[1]
    assert seen[0][1:] == (0, 0) and len(seen[0][0]) == 1  # three records, none dropped or unreadable
