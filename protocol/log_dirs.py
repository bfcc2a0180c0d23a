"""Pure framing for storage polling: Metadata (which brokers are active, where) and
DescribeLogDirs v4 (KIP-827: each log dir's total and usable bytes). No I/O here; `proxy.ops.disk_guard`
sends the frames over its own connections.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from protocol.apis import ApiKey, request_header_version
from protocol.encode import decode_response_body, encode_request, request_schema
from protocol.errors import DecodeError
from protocol.headers import RequestHeader, read_response_correlation_id

METADATA_VERSION = 12
DESCRIBE_LOG_DIRS_VERSION = 4
CLIENT_ID = "sluice-storage"
#: Kafka's error for a log dir the broker has taken offline (KIP-112: full or failed disk).
KAFKA_STORAGE_ERROR = ErrorCode.kafka_storage_error


@dataclass(frozen=True, slots=True)
class LogDirSize:
    log_dir: str
    total_bytes: int
    usable_bytes: int
    offline: bool = False


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
    return {int(b.node_id): (str(b.host), int(b.port)) for b in response.brokers or ()}  # null array


def parse_log_dirs(payload: bytes, correlation_id: int) -> list[LogDirSize]:
    """The log dirs of a DescribeLogDirs v4 response that have sizes, and the offline ones
    (KAFKA_STORAGE_ERROR, sizes 0, ``offline``: the storage policy counts them as full). Dirs with
    another error and sizes of brokers older than 3.3 (-1) are left out, as Strimzi does."""
    response = _decode(payload, ApiKey.DESCRIBE_LOG_DIRS, DESCRIBE_LOG_DIRS_VERSION, correlation_id)
    if int(response.error_code) != 0:
        raise DecodeError(f"DescribeLogDirs error code {int(response.error_code)}", 0)
    results = response.results or ()  # kio reads a null array as None
    sizes = [LogDirSize(str(r.log_dir), int(r.total_bytes), int(r.usable_bytes)) for r in results
             if int(r.error_code) == 0 and int(r.total_bytes) >= 0 and int(r.usable_bytes) >= 0]
    offline = [LogDirSize(str(r.log_dir), 0, 0, offline=True) for r in results
               if int(r.error_code) == KAFKA_STORAGE_ERROR]
    return sizes + offline


SASL_HANDSHAKE_VERSION = 1
SASL_AUTHENTICATE_VERSION = 2


def sasl_handshake_frame(correlation_id: int, mechanism: str) -> bytes:
    body = request_schema(ApiKey.SASL_HANDSHAKE, SASL_HANDSHAKE_VERSION)(mechanism=mechanism)
    return request_frame(ApiKey.SASL_HANDSHAKE, SASL_HANDSHAKE_VERSION, correlation_id, body)


def sasl_authenticate_frame(correlation_id: int, auth_bytes: bytes) -> bytes:
    body = request_schema(ApiKey.SASL_AUTHENTICATE, SASL_AUTHENTICATE_VERSION)(auth_bytes=auth_bytes)
    return request_frame(ApiKey.SASL_AUTHENTICATE, SASL_AUTHENTICATE_VERSION, correlation_id, body)


@dataclass(frozen=True, slots=True)
class SaslReply:
    """A SaslHandshake or SaslAuthenticate response: `error` is None on success (never the payload)."""

    error: str | None
    auth_bytes: bytes = b""


def parse_sasl_handshake(payload: bytes, correlation_id: int) -> SaslReply:
    response = _decode(payload, ApiKey.SASL_HANDSHAKE, SASL_HANDSHAKE_VERSION, correlation_id)
    if int(response.error_code) != 0:
        return SaslReply(f"mechanism not enabled (error {int(response.error_code)}; the broker offers "
                         f"{', '.join(response.mechanisms) or 'none'})")
    return SaslReply(None)


def parse_sasl_authenticate(payload: bytes, correlation_id: int) -> SaslReply:
    response = _decode(payload, ApiKey.SASL_AUTHENTICATE, SASL_AUTHENTICATE_VERSION, correlation_id)
    if int(response.error_code) != 0:
        return SaslReply(f"{response.error_message or 'authentication failed'} "
                         f"(error {int(response.error_code)})")
    return SaslReply(None, bytes(response.auth_bytes))
