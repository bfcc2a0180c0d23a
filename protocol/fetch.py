"""Fetch: the request's session fields (header-only) and the broker's throttled empty response.

When a consumer is over its quota, a broker does not send the data it read: it answers with an
empty Fetch response carrying throttle_time_ms (error_code 0, no topics; the session id is kept
for an incremental fetch session and is 0 for a sessionless or full fetch), then mutes the client
(KafkaApis.handleFetchRequest, `getThrottledResponse`). The proxy copies this, so it needs the
request's fetch session (v7+) and a way to build that response.

Request body layout up to the session fields: replica_id int32 (v0-14; a tagged field from v15),
max_wait_ms int32, min_bytes int32, max_bytes int32 (v3+), isolation_level int8 (v4+),
session_id int32 (v7+), session_epoch int32 (v7+).
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from kio.schema.errors import ErrorCode

from protocol._wire import (
    I32,
    INT32_MAX,
    encode_i32,
    read_array_len,
    read_i32,
    read_string,
    skip,
    skip_tagged_fields,
)
from protocol.apis import ApiKey, response_header_version
from protocol.encode import encode_response, response_schema
from protocol.errors import EncodeError, UnsupportedVersion
from protocol.headers import RequestHeader

FETCH_MAX_VERSION: Final = 18
_KIO_MIN_FETCH_VERSION: Final = 4

SESSIONLESS_SESSION_ID: Final = 0  # FetchMetadata.INVALID_SESSION_ID
SESSIONLESS_SESSION_EPOCH: Final = -1  # FetchMetadata.FINAL_EPOCH


@dataclass(frozen=True, slots=True)
class FetchSession:
    """The fetch session a request refers to (KIP-227). Before v7: (0, -1), i.e. no session."""

    session_id: int
    session_epoch: int


def _body_offsets(version: int) -> tuple[int, int]:
    """Where, from the start of a Fetch request's body, min_bytes sits and what follows
    isolation_level begins (the session fields from v7, else the topics).

    Layout: replica_id int32 (until v14; a tagged field from v15), max_wait_ms int32, min_bytes
    int32, max_bytes int32 (v3+), isolation_level int8 (v4+).
    """
    min_bytes_at = (4 if version <= 14 else 0) + 4
    after_fixed = min_bytes_at + 4 + (4 if version >= 3 else 0) + (1 if version >= 4 else 0)
    return min_bytes_at, after_fixed


def read_fetch_session(payload: bytes, header: RequestHeader) -> FetchSession:
    """The request's session_id and session_epoch (v7+), or (0, -1) for older versions.

    Raises UnsupportedVersion above v18, DecodeError on truncation, ValueError for a non-Fetch header.
    """
    if header.api_key != ApiKey.FETCH:
        raise ValueError(f"not a Fetch request: api_key={header.api_key}")
    version = header.api_version
    if version > FETCH_MAX_VERSION:
        raise UnsupportedVersion(ApiKey.FETCH, version, "session position not verified")
    if version < 7:
        return FetchSession(SESSIONLESS_SESSION_ID, SESSIONLESS_SESSION_EPOCH)
    pos = header.body_offset + _body_offsets(version)[1]
    session_id = read_i32(payload, pos, "fetch session_id")
    session_epoch = read_i32(payload, pos + 4, "fetch session_epoch")
    return FetchSession(session_id, session_epoch)


def empty_fetch_response(
    correlation_id: int, api_version: int, throttle_time_ms: int, session_id: int
) -> bytes:
    """The broker's throttled Fetch response payload: error_code 0, no topics, `session_id` kept.

    `session_id` is written from v7 (pass 0 for a sessionless or full fetch) and ignored before.
    throttle_time_ms is clamped to [0, 2**31-1]. v4-v18 are built with kio; v0-v3 (which kio
    0.6 no longer has) by hand: [throttle_time_ms int32 (v1+)] + an empty responses array.
    Raises UnsupportedVersion outside v0-v18, EncodeError for an out-of-range id.
    """
    if not 0 <= api_version <= FETCH_MAX_VERSION:
        raise UnsupportedVersion(ApiKey.FETCH, api_version, "cannot build a Fetch response")
    throttle_time_ms = max(0, min(throttle_time_ms, INT32_MAX))
    header_version = response_header_version(ApiKey.FETCH, api_version)
    if api_version < _KIO_MIN_FETCH_VERSION:
        throttle = I32.pack(throttle_time_ms) if api_version >= 1 else b""
        return encode_i32(correlation_id, "correlation_id") + throttle + b"\x00\x00\x00\x00"
    try:
        struct.pack(">i", session_id)
    except struct.error as exc:
        raise EncodeError(f"session_id={session_id} does not fit in an int32") from exc
    fields: dict[str, object] = {
        "throttle_time": datetime.timedelta(milliseconds=throttle_time_ms),
        "responses": (),
    }
    if api_version >= 7:
        fields["error_code"] = ErrorCode.none
        fields["session_id"] = session_id
    body = response_schema(ApiKey.FETCH, api_version)(**fields)
    return encode_response(header_version, correlation_id, body)


def cap_fetch_max_bytes(payload: bytes, header: RequestHeader, max_bytes: int) -> bytes:
    """The request with max_bytes (and min_bytes) lowered to at most `max_bytes` (KAFKA-9677).

    A broker caps a consumer's fetch at what its quota allows in one window (quota x (samples-1)
    x window) so that one response cannot earn a throttle far longer than the window. Request
    layout: replica_id int32 (until v14), max_wait_ms int32, min_bytes int32, max_bytes int32
    (v3+). Returns `payload` itself when nothing needs lowering or the version has no max_bytes.
    """
    if header.api_key != ApiKey.FETCH:
        raise ValueError(f"not a Fetch request: api_key={header.api_key}")
    version = header.api_version
    if version > FETCH_MAX_VERSION:
        raise UnsupportedVersion(ApiKey.FETCH, version, "max_bytes position not verified")
    if version < 3:
        return payload
    return cap_min_max_bytes(payload, header.body_offset + _body_offsets(version)[0], max_bytes, "fetch")


def cap_min_max_bytes(payload: bytes, min_pos: int, max_bytes: int, what: str) -> bytes:
    """Lower the adjacent int32 min_bytes (at `min_pos`) and max_bytes fields of a fetch-like
    request to at most `max_bytes` (at least 1); `payload` itself when neither is above it."""
    cap = max(1, min(max_bytes, INT32_MAX))
    max_pos = min_pos + 4
    min_bytes = read_i32(payload, min_pos, f"{what} min_bytes")
    current = read_i32(payload, max_pos, f"{what} max_bytes")
    if current <= cap and min_bytes <= cap:
        return payload
    out = bytearray(payload)
    I32.pack_into(out, max_pos, min(current, cap))
    I32.pack_into(out, min_pos, min(min_bytes, cap))
    return bytes(out)


@dataclass(frozen=True, slots=True)
class TopicPartitions:
    """One topic of a fetch-like request: its name (Fetch v0-12) or 16-byte id (v13+, ShareFetch)
    and the partition indexes listed for it."""

    name: str | None
    topic_id: bytes | None
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class FetchRequestTopics:
    """The topics a Fetch (or ShareFetch) request lists, and those it forgets (KIP-227 incremental
    sessions, v7+). `session_epoch`: -1 a sessionless full fetch, 0 a full fetch that opens a
    session, above 0 an incremental fetch (it lists only the partitions that changed)."""

    session_epoch: int
    topics: tuple[TopicPartitions, ...]
    forgotten: tuple[TopicPartitions, ...]


# per partition after its index: current_leader_epoch (v9+), fetch_offset, last_fetched_epoch
# (v12+), log_start_offset (v5+), partition_max_bytes; replica_directory_id (v17+) is a tag
def _partition_rest_bytes(version: int) -> int:
    return (4 if version >= 9 else 0) + 8 + (4 if version >= 12 else 0) + (8 if version >= 5 else 0) + 4


def fetch_request_topics(payload: bytes, header: RequestHeader) -> FetchRequestTopics:
    """The topics and partitions a Fetch request (v0-v18) lists and forgets, without decoding the
    rest (no offsets are read): what a topic quota needs to cap the request's max_bytes.

    Raises UnsupportedVersion above v18, DecodeError if the layout does not add up, ValueError for
    a non-Fetch header.
    """
    if header.api_key != ApiKey.FETCH:
        raise ValueError(f"not a Fetch request: api_key={header.api_key}")
    version = header.api_version
    if not 0 <= version <= FETCH_MAX_VERSION:
        raise UnsupportedVersion(ApiKey.FETCH, version, "topic layout not verified")
    flexible = version >= 12
    by_id = version >= 13
    pos = header.body_offset + _body_offsets(version)[1]
    epoch = SESSIONLESS_SESSION_EPOCH
    if version >= 7:
        epoch = read_i32(payload, pos + 4, "fetch session_epoch")
        pos += 8
    rest = _partition_rest_bytes(version)
    topics, pos = _read_topics(payload, pos, flexible, by_id, "fetch", rest, partition_tags=flexible)
    forgotten: tuple[TopicPartitions, ...] = ()
    if version >= 7:
        forgotten, pos = _read_topics(payload, pos, flexible, by_id, "fetch forgotten", None,
                                      partition_tags=False)
    return FetchRequestTopics(epoch, topics, forgotten)


def _read_topics(payload: bytes, pos: int, flexible: bool, by_id: bool, what: str,
                 partition_rest: int | None, *, partition_tags: bool,
                 skip_partition_extra: Callable[[bytes, int], int] | None = None,
                 ) -> tuple[tuple[TopicPartitions, ...], int]:
    """An array of topics: name or id, then partitions. `partition_rest` is how many fixed bytes
    follow each partition index (None: the partitions are a plain int32 array, as in forgotten
    topics); `skip_partition_extra` skips what follows those (ShareFetch's acknowledgements)."""
    n_topics, pos = read_array_len(payload, pos, flexible, f"{what} topics", 2)
    out: list[TopicPartitions] = []
    for _ in range(n_topics):
        name: str | None = None
        topic_id: bytes | None = None
        if by_id:
            end = skip(payload, pos, 16, f"{what} topic_id")
            topic_id = payload[pos:end]
            pos = end
        else:
            name, pos = read_string(payload, pos, flexible, f"{what} topic")
        item = 4 if partition_rest is None else 4 + partition_rest
        n_parts, pos = read_array_len(payload, pos, flexible, f"{what} partitions", item)
        parts: list[int] = []
        for _ in range(n_parts):
            parts.append(read_i32(payload, pos, f"{what} partition"))
            pos += 4
            if partition_rest is not None:
                pos = skip(payload, pos, partition_rest, f"{what} partition")
            if skip_partition_extra is not None:
                pos = skip_partition_extra(payload, pos)
            if partition_tags:
                pos = skip_tagged_fields(payload, pos, f"{what} partition tags")
        if flexible:
            pos = skip_tagged_fields(payload, pos, f"{what} topic tags")
        out.append(TopicPartitions(name, topic_id, tuple(parts)))
    return tuple(out), pos
