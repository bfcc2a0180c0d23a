"""Fuzz targets: every decoder of `protocol` that reads client or broker bytes, fed arbitrary bytes.

Each target takes one `bytes` input and calls one decoder family with it. The contract is the one
`protocol.errors` states: bad input raises `ProtocolError` (or a subclass: `DecodeError`,
`FrameTooLarge`, `UnsupportedVersion`, `SaslTokenError`, `ProxyHeaderError`) and nothing else,
and every call returns promptly. A target swallows exactly the allowed errors; anything else
escapes and is a finding.

The first bytes of an input choose what a decoder needs besides the payload (an API version, a
mechanism, a chunk size), so one byte string drives the whole call and a coverage-guided fuzzer
can mutate all of it. `SEEDS` holds valid frames of each target (drawn from kio's schemas), so
mutation starts from structures deep enough to reach the record walks.

Used by tests/fuzz/test_decoders.py (hypothesis, a short budget in CI) and bench/bench_fuzz.py
(atheris, coverage-guided, >= 1,000,000 inputs).
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from protocol.apis import ApiKey, request_header_version
from protocol.encode import decode_request_body, decode_response_body
from protocol.errors import ProtocolError
from protocol.fetch import cap_fetch_max_bytes, read_fetch_session
from protocol.fetch_tail import FetchTailFinder, fit_tail
from protocol.framing import FrameSplitter
from protocol.headers import (
    RequestHeader,
    read_request_header,
    read_response_correlation_id,
    response_body_offset,
)
from protocol.log_dirs import parse_brokers, parse_log_dirs
from protocol.produce import read_produce_acks
from protocol.proxy_protocol import parse_proxy_header
from protocol.quota_client import QuotaAdminError, QuotaClient, Stream
from protocol.records import (
    count_records,
    fetch_response_partitions,
    produce_request_partitions,
    produce_response_errors,
    response_error_codes,
    topic_ids_from_metadata_response,
)
from protocol.rewrite import (
    BrokerAddress,
    cap_api_versions_response,
    read_api_versions_entries,
    read_api_versions_request_client_software,
    rewrite_describe_cluster_response,
    rewrite_fetch_response_node_endpoints,
    rewrite_find_coordinator_response,
    rewrite_metadata_response,
    rewrite_produce_response_node_endpoints,
)
from protocol.sasl import (
    OAUTHBEARER,
    PLAIN,
    candidate_principal,
    exchange_succeeded,
    jwt_claim,
    parse_oauthbearer_initial,
    parse_scram_client_first,
    plain_authcid,
    read_sasl_authenticate_request,
    read_sasl_authenticate_response,
    read_sasl_handshake_request,
    read_sasl_handshake_response,
)
from protocol.share import (
    cap_share_fetch_max_bytes,
    rewrite_share_acknowledge_response,
    rewrite_share_fetch_response,
)
from protocol.throttle import patch_throttle_time, read_throttle_time_ms

Target = Callable[[bytes], None]
MECHANISMS: Final = (PLAIN, "SCRAM-SHA-256", "SCRAM-SHA-512", OAUTHBEARER, "GSSAPI")
# Every API key Kafka 4.3 knows, plus a few it does not (the decoders must refuse those cleanly).
API_KEYS: Final = (*tuple(int(k) for k in ApiKey), -1, 99, 32767)


def to_proxy(address: BrokerAddress) -> BrokerAddress:
    """A mapper that changes every field's length, so the splice really re-encodes."""
    return BrokerAddress(address.node_id, f"sluice-{address.node_id}.example", 19092 + address.node_id % 1000)


def _version(data: bytes, modulo: int = 20) -> int:
    return data[0] % modulo if data else 0


def request_payload(api_key: int, api_version: int, rest: bytes, client_id: bytes = b"fuzz") -> bytes:
    """A request frame payload with a valid header for (api_key, api_version) and `rest` as body."""
    head = struct.pack(">hhi", api_key, api_version, 7)
    if request_header_version(api_key, api_version) == 0:
        return head + rest
    head += struct.pack(">h", len(client_id)) + client_id
    if request_header_version(api_key, api_version) == 2:
        head += b"\x00"
    return head + rest


def _request(api_key: int, data: bytes) -> tuple[bytes, RequestHeader]:
    """First byte: the version; the rest: the body after a valid header."""
    payload = request_payload(api_key, _version(data), data[1:])
    return payload, read_request_header(payload)


# ----------------------------------------------------------------------------- targets


def framing(data: bytes) -> None:
    """FrameSplitter: the first byte sets the chunk size (1-32) the stream arrives in."""
    chunk = (data[0] % 32 + 1) if data else 1
    splitter = FrameSplitter(max_frame_bytes=1 << 16)
    for i in range(1, len(data), chunk):
        splitter.feed(data[i: i + chunk])
        if data[0] & 0x80:  # cut-through: peek at the head, then take what has arrived
            pending = splitter.pending_frame(8)
            if pending is not None:
                splitter.take_partial()
            continue
        while (frame := splitter.next_frame()) is not None:
            if frame[:1] == b"\x01":
                splitter.unread([frame[1:]])
                assert splitter.next_frame() == frame[1:]
    assert splitter.buffered_bytes >= 0


def headers(data: bytes) -> None:
    read_request_header(data)
    read_response_correlation_id(data)
    response_body_offset(data, data[0] % 2 if data else 0)


def sasl_frames(data: bytes) -> None:
    payload, header = _request(ApiKey.SASL_HANDSHAKE, data)
    read_sasl_handshake_request(payload, header)
    payload, header = _request(ApiKey.SASL_AUTHENTICATE, data)
    read_sasl_authenticate_request(payload, header)
    read_sasl_handshake_response(data)
    read_sasl_authenticate_response(data[1:], _version(data, 3))


def sasl_tokens(data: bytes) -> None:
    """The first client message of each mechanism, and the server's last token."""
    mechanism = MECHANISMS[data[0] % len(MECHANISMS)] if data else PLAIN
    candidate_principal(mechanism, data[1:], "sub")
    exchange_succeeded(mechanism, data[1] % 4 if len(data) > 1 else 0, data[2:])
    for parse in (plain_authcid, parse_scram_client_first, parse_oauthbearer_initial):
        with contextlib.suppress(ProtocolError):
            parse(data)
    jwt_claim(str(data, "utf-8", "replace"), "sub")


def proxy_protocol(data: bytes) -> None:
    versions = ((1,), (2,), (1, 2))[data[0] % 3] if data else (1, 2)
    parse_proxy_header(data[1:], versions)
    parse_proxy_header(memoryview(data), (1, 2))


def rewrite(data: bytes) -> None:
    """Address rewrites and ApiVersions caps of broker responses; the first byte: the version."""
    version, payload = _version(data), data[1:]
    for rewrite_one in (rewrite_metadata_response, rewrite_find_coordinator_response,
                        rewrite_describe_cluster_response, rewrite_produce_response_node_endpoints,
                        rewrite_fetch_response_node_endpoints, rewrite_share_fetch_response,
                        rewrite_share_acknowledge_response):
        with contextlib.suppress(ProtocolError):
            rewrite_one(payload, version, to_proxy)
    with contextlib.suppress(ProtocolError):
        cap_api_versions_response(payload, version % 5, {0: 9, 1: 12, 3: 12, 18: 3})
    read_api_versions_entries(payload, version % 5)


def api_versions_request(data: bytes) -> None:
    payload, header = _request(ApiKey.API_VERSIONS, data)
    read_api_versions_request_client_software(payload, header)


def throttle(data: bytes) -> None:
    """throttle_time_ms read and patched in any API's response; bytes 0-1: the API key and version."""
    api_key = API_KEYS[data[0] % len(API_KEYS)] if data else 0
    version = data[1] % 20 if len(data) > 1 else 0
    payload = data[2:]
    try:
        read_throttle_time_ms(payload, api_key, version)
    finally:
        patch_throttle_time(payload, api_key, version, 1234)


def produce(data: bytes) -> None:
    payload, header = _request(ApiKey.PRODUCE, data)
    with contextlib.suppress(ProtocolError):
        read_produce_acks(payload, header)
    with contextlib.suppress(ProtocolError):
        produce_request_partitions(payload, header)
    produce_response_errors(data[1:], _version(data))


def fetch(data: bytes) -> None:
    payload, header = _request(ApiKey.FETCH, data)
    with contextlib.suppress(ProtocolError):
        read_fetch_session(payload, header)
    with contextlib.suppress(ProtocolError):
        cap_fetch_max_bytes(payload, header, 65536)
    fetch_response_partitions(data[1:], _version(data))


def share(data: bytes) -> None:
    payload, header = _request(ApiKey.SHARE_FETCH, data)
    cap_share_fetch_max_bytes(payload, header, 65536)


def fetch_tail(data: bytes) -> None:
    """The streamed Fetch (v12+) tag-section finder, chunk by chunk, and the tail's rewrite."""
    version = 12 + _version(data, 7)
    chunk = (data[1] % 64 + 1) if len(data) > 1 else 1
    finder = FetchTailFinder(version)
    body = data[2:]
    for i in range(0, len(body), chunk):
        forwarded = finder.feed(body[i: i + chunk])
        assert 0 <= forwarded <= len(body[i: i + chunk])
    if finder.found:
        fit_tail(bytes(finder.tail), to_proxy)
    fit_tail(body, to_proxy)


def records(data: bytes) -> None:
    """The record-set counter at arbitrary bounds, topic ids, and every API's error codes."""
    if len(data) >= 4:
        start, end = data[0] % (len(data) + 1), len(data) - data[1] % (len(data) + 1)
        count_records(data, start, max(start, end))
    with contextlib.suppress(ProtocolError):
        topic_ids_from_metadata_response(data[1:], _version(data, 14))
    api_key = API_KEYS[data[0] % len(API_KEYS)] if data else 0
    response_error_codes(data[2:], api_key, data[1] % 20 if len(data) > 1 else 0)


_ADMIN_APIS: Final = (ApiKey.DESCRIBE_CLIENT_QUOTAS, ApiKey.ALTER_CLIENT_QUOTAS, ApiKey.API_VERSIONS,
                      ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE, ApiKey.METADATA,
                      ApiKey.DESCRIBE_LOG_DIRS)


def admin_requests(data: bytes) -> None:
    """The admin APIs Sluice answers itself decode the client's request with kio."""
    api_key = _ADMIN_APIS[data[0] % len(_ADMIN_APIS)] if data else ApiKey.DESCRIBE_CLIENT_QUOTAS
    payload = request_payload(api_key, data[1] % 8 if len(data) > 1 else 0, data[2:])
    decode_request_body(payload, read_request_header(payload))


def admin_responses(data: bytes) -> None:
    api_key = _ADMIN_APIS[data[0] % len(_ADMIN_APIS)] if data else ApiKey.DESCRIBE_CLIENT_QUOTAS
    decode_response_body(data[2:], api_key, data[1] % 8 if len(data) > 1 else 0)


def log_dirs(data: bytes) -> None:
    """The disk-usage guard reads Metadata v12 and DescribeLogDirs v4 responses of the brokers."""
    correlation_id = struct.unpack_from(">i", data, 0)[0] if len(data) >= 4 else 0
    with contextlib.suppress(ProtocolError):
        parse_brokers(data, correlation_id)
    parse_log_dirs(data, correlation_id)


class _ReplayStream:
    """A broker that answers anything with the fuzz input."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def sendall(self, data: bytes, /) -> None:
        pass

    def recv(self, size: int, /) -> bytes:
        out = self._data[self._pos: self._pos + size]
        self._pos += len(out)
        return out

    def close(self) -> None:
        pass


def quota_client(data: bytes) -> None:
    """`sluice quotas` reading a broker's (or Sluice's) answers: its documented error is
    QuotaAdminError, which carries the ProtocolError as its cause for undecodable bytes."""
    stream = _ReplayStream(data)

    def connect(host: str, port: int, timeout_s: float) -> Stream:
        return stream

    client = QuotaClient("127.0.0.1:9092", connect, client_id="fuzz")
    try:
        client.connect()
        client.describe([])
    except QuotaAdminError as exc:
        cause = exc.__cause__
        assert cause is None or isinstance(cause, (ProtocolError, OSError)), repr(cause)


@dataclass(frozen=True)
class FuzzTarget:
    name: str
    run: Target

    def call(self, data: bytes) -> None:
        """Run once: `ProtocolError` is the allowed outcome of bad input; anything else escapes."""
        with contextlib.suppress(ProtocolError):
            self.run(data)


TARGETS: Final = tuple(FuzzTarget(f.__name__, f) for f in (
    framing, headers, sasl_frames, sasl_tokens, proxy_protocol, rewrite, api_versions_request, throttle,
    produce, fetch, share, fetch_tail, records, admin_requests, admin_responses, log_dirs, quota_client,
))
BY_NAME: Final = {t.name: t for t in TARGETS}
