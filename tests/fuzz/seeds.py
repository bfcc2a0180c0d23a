"""Valid inputs for each fuzz target (see targets.py), built from kio's schemas with hypothesis.

A target's first bytes choose its API version (and more); a seed puts the right choice in front of
a real request or response payload, so a mutation fuzzer starts inside the structures the record
walks, the splices and the tag-section finder follow.
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Iterator
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.static.primitive import Records

from protocol.apis import ApiKey, response_header_version
from protocol.encode import encode_request, encode_response
from protocol.errors import ProtocolError
from protocol.framing import size_prefix
from protocol.headers import read_request_header
from protocol.proxy_protocol import encode_v1, encode_v2
from tests.fuzz.targets import _ADMIN_APIS, API_KEYS, request_payload

# A v2 record batch header (61 bytes) with 2 records' worth of count, and arbitrary bytes: the
# record walks count records from batch headers.
_BATCH = (struct.pack(">qiiBihiqqqhii", 0, 49 + 12, 0, 2, 0, 0, 1, 0, 0, -1, -1, -1, 2)
          + b"\x0c\x00\x00\x00\x02k1\x00" * 2)
st.register_type_strategy(Records, st.one_of(st.binary(max_size=48), st.just(_BATCH)).map(Records))


def _draw(cls: Any, n: int) -> list[Any]:
    """n entities of a kio schema (hypothesis' from_type), outside a test."""
    out: list[Any] = []

    @settings(max_examples=n, database=None, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.from_type(cls))
    def collect(value: Any) -> None:
        out.append(value)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collect()
    return out[:n]


def _response(api_key: int, version: int, n: int, correlation_id: int = 0x01020304) -> list[bytes]:
    try:
        cls = load_response_schema(api_key, version)
    except Exception:  # kio has no such version
        return []
    out = []
    for body in _draw(cls, n):
        try:
            out.append(encode_response(response_header_version(api_key, version), correlation_id, body))
        except (ProtocolError, ValueError):
            continue
    return out


def _request_body(api_key: int, version: int, n: int) -> list[bytes]:
    """Request bodies (what follows the header) of a kio schema."""
    try:
        cls = load_request_schema(api_key, version)
    except Exception:
        return []
    out = []
    for body in _draw(cls, n):
        payload = request_payload(api_key, version, b"")
        header = read_request_header(payload)
        try:
            full = encode_request(header, body)
        except (ProtocolError, ValueError):
            continue
        out.append(full[header.body_offset:])
    return out


def _versions(first: int, last: int) -> range:
    return range(first, last + 1)


def seeds(name: str, n: int = 2) -> list[bytes]:
    """Seeds of one target; `n` drawn entities per schema and version."""
    return list(_seeds(name, n))


def _seeds(name: str, n: int) -> Iterator[bytes]:
    if name == "framing":
        frames = [size_prefix(len(p)) + p for p in (b"", b"abc", bytes(100), b"\x01xyz")]
        yield b"\x05" + b"".join(frames)
        yield b"\x83" + b"".join(frames)
    elif name == "headers":
        for api_key in (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE):
            for version in (0, 3, 12):
                yield request_payload(api_key, version, b"body")
    elif name == "sasl_frames":
        yield b"\x01" + struct.pack(">h", 5) + b"PLAIN"
        yield b"\x02\x0d\x00alice\x00secret\x00"
        yield b"\x01" + struct.pack(">hh", 0, -1) + struct.pack(">i", 0) + struct.pack(">q", 0)
    elif name == "sasl_tokens":
        yield b"\x00\x00alice\x00secret"
        yield b"\x01n,,n=al=2Cice,r=abcdef"
        yield b"\x02n,a=bob,n=bob,r=xyz,tokenauth=true"
        yield (b"\x03n,,\x01auth=Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJhbGljZSJ9.\x01\x01")
    elif name == "proxy_protocol":
        yield b"\x00" + encode_v1(("10.0.0.1", 1234), ("10.0.0.2", 9092)) + b"kafka"
        yield b"\x01" + encode_v2(("10.0.0.1", 1234), ("10.0.0.2", 9092)) + b"kafka"
        yield b"\x02" + encode_v2(("2001:db8::1", 1234), ("2001:db8::2", 9092), tlvs=b"\x04\x00\x01x")
        yield b"\x02" + encode_v2(None)
    elif name == "rewrite":
        for api_key, last in ((ApiKey.METADATA, 13), (ApiKey.FIND_COORDINATOR, 6),
                              (ApiKey.DESCRIBE_CLUSTER, 2), (ApiKey.PRODUCE, 13), (ApiKey.FETCH, 18),
                              (ApiKey.SHARE_FETCH, 2), (ApiKey.SHARE_ACKNOWLEDGE, 2),
                              (ApiKey.API_VERSIONS, 4)):
            for version in _versions(0, last):
                yield from (bytes([version]) + p for p in _response(api_key, version, n))
    elif name == "api_versions_request":
        for version in _versions(0, 4):
            yield from (bytes([version]) + b for b in _request_body(ApiKey.API_VERSIONS, version, n))
    elif name == "throttle":
        for i, api_key in enumerate(API_KEYS):
            if api_key < 0 or api_key > 100:
                continue
            for version in (0, 1, 4, 9, 12):
                yield from (bytes([i, version]) + p for p in _response(api_key, version, 1))
    elif name in ("produce", "fetch"):
        api_key, last = (ApiKey.PRODUCE, 13) if name == "produce" else (ApiKey.FETCH, 18)
        for version in _versions(0, last):
            yield from (bytes([version]) + b for b in _request_body(api_key, version, n))
            yield from (bytes([version]) + p for p in _response(api_key, version, n))
    elif name == "share":
        for version in _versions(0, 2):
            yield from (bytes([version]) + b for b in _request_body(ApiKey.SHARE_FETCH, version, n))
    elif name == "fetch_tail":
        for version in _versions(12, 18):
            yield from (bytes([version - 12, 7]) + p for p in _response(ApiKey.FETCH, version, n))
    elif name == "records":
        for version in _versions(0, 13):
            yield from (bytes([version]) + p for p in _response(ApiKey.METADATA, version, 1))
        for version in (3, 9, 13):
            for body in _request_body(ApiKey.PRODUCE, version, n):
                yield b"\x00\x00" + body
    elif name in ("admin_requests", "admin_responses"):
        for i, api_key in enumerate(_ADMIN_APIS):
            for version in range(8):
                if name == "admin_requests":
                    yield from (bytes([i, version]) + b for b in _request_body(api_key, version, 1))
                else:
                    yield from (bytes([i, version]) + p for p in _response(api_key, version, 1))
    elif name == "log_dirs":
        yield from _response(ApiKey.METADATA, 12, n)
        yield from _response(ApiKey.DESCRIBE_LOG_DIRS, 4, n)
    elif name == "quota_client":
        versions = _response(ApiKey.API_VERSIONS, 3, 1, correlation_id=1)
        described = _response(ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, n, correlation_id=2)
        for first in versions:
            for second in described:
                yield size_prefix(len(first)) + first + size_prefix(len(second)) + second
