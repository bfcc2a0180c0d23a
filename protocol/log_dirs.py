"""Pure framing for storage polling: Metadata (which brokers are active, where) and
DescribeLogDirs v4 (KIP-827: each log dir's total and usable bytes). No I/O here; `proxy.ops.disk_guard`
sends the frames over its own connections.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from protocol.apis import ApiKey, request_header_version
from protocol.encode import decode_response_body, encode_request, request_schema
from protocol.errors import DecodeError
from protocol.headers import RequestHeader, read_response_correlation_id

METADATA_VERSION = 12
DESCRIBE_LOG_DIRS_VERSION = 4
CLIENT_ID = "sluice-storage"


@dataclass(frozen=True, slots=True)
class LogDirSize:
    log_dir: str
    total_bytes: int
    usable_bytes: int


def request_frame(api_key: int, version: int, correlation_id: int, body: Any) -> bytes:
    """A size-prefixed request frame."""
    header = RequestHeader(api_key, version, correlation_id, CLIENT_ID,
                           request_header_version(api_key, version), 0)
    payload = encode_request(header, body)
    return struct.pack(">i", len(payload)) + payload


def metadata_frame(correlation_id: int) -> bytes:
    """Metadata v12 for no topic: just the brokers."""
    body = request_schema(ApiKey.METADATA, METADATA_VERSION)(
        topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    return request_frame(ApiKey.METADATA, METADATA_VERSION, correlation_id, body)


def describe_log_dirs_frame(correlation_id: int) -> bytes:
    """DescribeLogDirs v4 for no topic: every log dir with its sizes, no partition list."""
    body = request_schema(ApiKey.DESCRIBE_LOG_DIRS, DESCRIBE_LOG_DIRS_VERSION)(topics=())
    return request_frame(ApiKey.DESCRIBE_LOG_DIRS, DESCRIBE_LOG_DIRS_VERSION, correlation_id, body)


def _decode(payload: bytes, api_key: int, version: int, correlation_id: int) -> Any:
    got = read_response_correlation_id(payload)  # DecodeError under 4 bytes (a struct.error before)
    if got != correlation_id:
        raise DecodeError(f"correlation id {got}, expected {correlation_id}", 0)
    return decode_response_body(payload, api_key, version)


def parse_brokers(payload: bytes, correlation_id: int) -> dict[int, tuple[str, int]]:
    """node id -> (host, port) of every broker in a Metadata v12 response."""
    response = _decode(payload, ApiKey.METADATA, METADATA_VERSION, correlation_id)
    return {int(b.node_id): (str(b.host), int(b.port)) for b in response.brokers}


def parse_log_dirs(payload: bytes, correlation_id: int) -> list[LogDirSize]:
    """The log dirs of a DescribeLogDirs v4 response that have sizes: offline dirs (an error)
    and brokers older than 3.3 (-1) are left out, as Strimzi does."""
    response = _decode(payload, ApiKey.DESCRIBE_LOG_DIRS, DESCRIBE_LOG_DIRS_VERSION, correlation_id)
    if int(response.error_code) != 0:
        raise DecodeError(f"DescribeLogDirs error code {int(response.error_code)}", 0)
    return [LogDirSize(str(r.log_dir), int(r.total_bytes), int(r.usable_bytes)) for r in response.results
            if int(r.error_code) == 0 and int(r.total_bytes) >= 0 and int(r.usable_bytes) >= 0]
