"""A fixed mix of traffic through the access-log stage, for the golden test of the columnar log.

Every branch of what a record says is exercised: Produce requests of several versions (names,
topic ids, legacy and null record sets, unknown tags, a malformed one), their responses (error
codes, broker throttle), acks=0, Fetch responses whole (error codes, a cut batch, tags), streamed
(only the head seen), truncated and larger than the log reads, Metadata with topic ids (which
name a Produce v13's topic), ApiVersions, another API's error codes through kio, requests Sluice
answered itself, quota decisions (matched, shadow, none), and null and non-ASCII strings.

`drive(pipeline, ...)` calls the pipeline's hooks in the order the connection does
(`proxy.pumps.connection`, `proxy.pumps.responses`, `proxy.pumps.fetch_stream`).
"""

from __future__ import annotations

import datetime
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from protocol.apis import ApiKey, request_header_version
from protocol.errors import ProtocolError
from protocol.headers import read_request_header
from proxy.flow.inflight import InFlight, QuotaNote
from proxy.flow.pipeline import ConnectionContext, Pipeline
from quotas.entity import ClientIdentity, QuotaEntity, QuotaKind, SensorKey
from quotas.manager import ThrottleDecision
from tests.unit.protocol.kio_support import response_payload
from tests.unit.protocol.test_records import (
    BATCH_2,
    BATCH_3,
    fetch_v4_response,
    fetch_v12_response_with_tags,
    kio_batch,
    produce_v3_request,
    produce_v9_request_with_unknown_tags,
    produce_v10_response,
    uvarint,
)

TOPIC_ID = uuid.UUID("9f1c3b54-2a1d-4b7e-8c55-0123456789ab")
UNKNOWN_ID = uuid.UUID(int=77)


@dataclass(frozen=True)
class Exchange:
    """One request and what came back: `response` whole, or `head` of a streamed one of `size`."""

    api_key: int
    api_version: int
    request: bytes
    response: bytes | None = None
    head: bytes | None = None
    size: int = 0
    expects_response: bool = True
    answered: bytes | None = None      # Sluice answered it itself
    client_id: str | None = "app"
    quota: str = "none"                # none, matched, shadow


def produce_v13_request(topic_id: uuid.UUID) -> bytes:
    batch = kio_batch(3)
    return b"".join([
        struct.pack(">hhi", 0, 13, 7), struct.pack(">h", 1), b"c", b"\x00",  # header v2
        b"\x03tx", struct.pack(">h", -1), struct.pack(">i", 5000),
        b"\x02", topic_id.bytes, b"\x02", struct.pack(">i", 2), uvarint(len(batch) + 1), batch,
        b"\x00", b"\x00", b"\x00"])


def produce_v3_response(codes: tuple[int, int, int], throttle_ms: int) -> bytes:
    """The answer to `produce_v3_request` (a/0, a/1, b/7)."""
    part = struct.Struct(">ihqq")
    return b"".join([
        struct.pack(">i", 7), struct.pack(">i", 2),
        struct.pack(">h", 1), b"a", struct.pack(">i", 2),
        part.pack(0, codes[0], 10, -1), part.pack(1, codes[1], -1, -1),
        struct.pack(">h", 1), b"b", struct.pack(">i", 1), part.pack(7, codes[2], 5, -1),
        struct.pack(">i", throttle_ms)])


def metadata_v12_response() -> bytes:
    from kio.schema.metadata.v12 import response as m12

    topic = m12.MetadataResponseTopic(error_code=ErrorCode.none, name="orders", topic_id=TOPIC_ID,
                                      partitions=())
    missing = m12.MetadataResponseTopic(error_code=ErrorCode.unknown_topic_or_partition, name="gone",
                                        topic_id=uuid.UUID(int=0), partitions=())
    return response_payload(m12.MetadataResponse(throttle_time=datetime.timedelta(milliseconds=5),
                                                 brokers=(), topics=(topic, missing)))


def api_versions_v3_response(error: ErrorCode) -> bytes:
    from kio.schema.api_versions.v3 import response as av3

    return response_payload(av3.ApiVersionsResponse(
        error_code=error, api_keys=(), throttle_time=datetime.timedelta(milliseconds=0),
        supported_features=(), finalized_features_epoch=-1, finalized_features=(),
        zk_migration_ready=False))


def heartbeat_v4_response(error: ErrorCode, throttle_ms: int) -> bytes:
    from kio.schema.heartbeat.v4 import response as hb4

    return response_payload(hb4.HeartbeatResponse(
        throttle_time=datetime.timedelta(milliseconds=throttle_ms), error_code=error))


def request_frame(api_key: int, api_version: int, correlation_id: int, body: bytes = b"") -> bytes:
    """A request with client id "app" and `body` (never walked by the log)."""
    tags = b"\x00" if request_header_version(api_key, api_version) >= 2 else b""
    return struct.pack(">hhih", api_key, api_version, correlation_id, 3) + b"app" + tags + body


def exchanges() -> Iterator[Exchange]:
    v3 = produce_v3_request()
    yield Exchange(ApiKey.PRODUCE, 3, v3, produce_v3_response((0, 6, 19), 120), quota="matched")
    yield Exchange(ApiKey.PRODUCE, 3, v3, produce_v3_response((0, 0, 0), 0))
    yield Exchange(ApiKey.PRODUCE, 9, produce_v9_request_with_unknown_tags(), expects_response=False)
    yield Exchange(ApiKey.PRODUCE, 13, produce_v13_request(UNKNOWN_ID), quota="shadow")  # no name known
    yield Exchange(ApiKey.METADATA, 12, request_frame(ApiKey.METADATA, 12, 7), metadata_v12_response())
    yield Exchange(ApiKey.PRODUCE, 13, produce_v13_request(TOPIC_ID))   # named by that Metadata
    bad = v3[:-5]
    yield Exchange(ApiKey.PRODUCE, 3, bad, produce_v3_response((0, 0, 0), 33))  # walk fails: throttle kept
    yield Exchange(ApiKey.PRODUCE, 10, _produce_v10_request(), produce_v10_response(), client_id=None)
    yield Exchange(ApiKey.FETCH, 4, request_frame(ApiKey.FETCH, 4, 7), fetch_v4_response(), quota="matched")
    yield Exchange(ApiKey.FETCH, 12, request_frame(ApiKey.FETCH, 12, 7), fetch_v12_response_with_tags())
    yield Exchange(ApiKey.FETCH, 4, request_frame(ApiKey.FETCH, 4, 7), head=struct.pack(">ii", 7, 250),
                   size=200_000)                                                    # streamed
    yield Exchange(ApiKey.FETCH, 4, request_frame(ApiKey.FETCH, 4, 7), b"\x00\x00\x00\x07\xff")  # truncated
    big = _fetch_v4_big_response()
    yield Exchange(ApiKey.FETCH, 4, request_frame(ApiKey.FETCH, 4, 7), big)          # whole, > 64 KiB
    yield Exchange(ApiKey.API_VERSIONS, 3, request_frame(ApiKey.API_VERSIONS, 3, 7),
                   api_versions_v3_response(ErrorCode.none), client_id="ünïcode, \"quoted\"")
    yield Exchange(ApiKey.API_VERSIONS, 3, request_frame(ApiKey.API_VERSIONS, 3, 7),
                   api_versions_v3_response(ErrorCode.unsupported_version))
    yield Exchange(ApiKey.HEARTBEAT, 4, request_frame(ApiKey.HEARTBEAT, 4, 7),
                   heartbeat_v4_response(ErrorCode.rebalance_in_progress, 40), quota="matched")
    yield Exchange(ApiKey.HEARTBEAT, 4, request_frame(ApiKey.HEARTBEAT, 4, 7), b"\x00\x00\x00\x07\x01")
    yield Exchange(ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, request_frame(ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, 7),
                   answered=struct.pack(">iiih", 7, 0, 0, 0))                        # Sluice's answer
    yield Exchange(ApiKey.METADATA, 1, request_frame(ApiKey.METADATA, 1, 7),
                   struct.pack(">i", 7) + b"\x00" * 8, client_id="")


def _produce_v10_request() -> bytes:
    return b"".join([
        struct.pack(">hhi", 0, 10, 7), struct.pack(">h", -1), b"\x00",   # null client id, header tags
        b"\x00", struct.pack(">h", 1), struct.pack(">i", 1000),
        b"\x02", b"\x03tp", b"\x03",
        struct.pack(">i", 0), uvarint(len(BATCH_3) + 1), BATCH_3, b"\x00",
        struct.pack(">i", 1), uvarint(len(BATCH_2) + 1), BATCH_2, b"\x00",
        b"\x00", b"\x00"])


def _fetch_v4_big_response() -> bytes:
    records = b"".join([BATCH_3] * 1100)   # 70,400 bytes
    return b"".join([
        struct.pack(">i", 7), struct.pack(">i", 0), struct.pack(">i", 1), struct.pack(">h", 1), b"f",
        struct.pack(">i", 1), struct.pack(">ihqq", 0, 0, 9, 9), struct.pack(">i", -1),
        struct.pack(">i", len(records)), records])


def decisions(kind: str, api_key: int) -> list[ThrottleDecision]:
    if kind == "none":
        return []
    quota_kind = QuotaKind.PRODUCE if api_key == ApiKey.PRODUCE else QuotaKind.REQUEST_RATE
    key = SensorKey(quota_kind, "alice", "app")
    unlimited = ThrottleDecision(quota_kind, key, 0, 1.0, None)
    small = ThrottleDecision(quota_kind, key, 5, 10.0, 1000.0, kind == "shadow",
                             QuotaEntity(user="alice"))
    large = ThrottleDecision(quota_kind, key, 80, 10.0, 2048.0, kind == "shadow",
                             QuotaEntity(user="al,ice=%", client_id="app"))
    return [unlimited, small, large] if kind == "matched" else [unlimited, small]


CONTEXTS = (
    ConnectionContext(3, "127.0.0.1:5000", "broker 1", 1, principal="alice",
                      client_software_name="test-client", client_software_version="1.0"),
    ConnectionContext(4, "[::1]:6000", "bootstrap", None),
)


def serve_one(pipeline: Pipeline, ctx: ConnectionContext, ex: Exchange, correlation_id: int, now_ms: int,
              wait_ms: int = 1, enforced_ms: int = 0, with_note: bool = False) -> None:
    """One exchange through the pipeline's hooks, received at `now_ms`, answered `wait_ms` later."""
    try:
        header = read_request_header(ex.request)
        client_id = header.client_id if ex.client_id == "app" else ex.client_id
    except ProtocolError:  # a malformed test request: it never reaches the stages' on_request
        header, client_id = None, ex.client_id
    entry = InFlight(correlation_id, ex.api_key, ex.api_version, client_id, len(ex.request), now_ms,
                     expects_response=ex.expects_response)
    if header is not None:
        pipeline.on_request(ctx, entry, header, ex.request)
    entry.quota = (QuotaNote(ClientIdentity.of(ctx.principal, entry.client_id),
                             decisions(ex.quota, ex.api_key), enforced_ms)
                   if ex.quota != "none" or with_note else None)
    if ex.answered is not None:
        now_ms += wait_ms
        entry.answer(ex.answered, now_ms)
    elif ex.head is not None:
        now_ms += wait_ms
        entry.response_received_ms = now_ms
        entry.upstream_response_bytes = ex.size
        pipeline.on_response(ctx, entry, ex.head)
        entry.response_bytes = ex.size
        entry.streamed = True
    elif ex.response is not None:
        now_ms += wait_ms
        entry.response_received_ms = now_ms
        entry.upstream_response_bytes = len(ex.response)
        outcome = pipeline.on_response(ctx, entry, ex.response)
        entry.response = outcome.payload
        entry.response_bytes = len(outcome.payload)
    pipeline.on_complete(ctx, entry, now_ms)


def drive(pipeline: Pipeline, rounds: int = 3, start_ms: int = 1_000) -> int:
    """Every exchange `rounds` times, on alternating contexts; returns the number of records."""
    now = start_ms
    n = 0
    for r in range(rounds):
        for i, ex in enumerate(exchanges()):
            ctx = CONTEXTS[(i + r) % len(CONTEXTS)]
            serve_one(pipeline, ctx, ex, r * 1000 + i, now, 1 + i % 4, 7 * (i % 3), bool(i % 2))
            now += 1 + i % 4
            n += 1
    return n
