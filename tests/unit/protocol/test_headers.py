"""Request/response header parsing: golden bytes, tagged fields, truncation, and kio as oracle."""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.request_header.v1.header import RequestHeader as KioRequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as KioRequestHeaderV2
from kio.serial import entity_writer

from protocol import (
    DecodeError,
    RequestHeader,
    read_request_header,
    read_response_correlation_id,
    request_header_version,
    response_body_offset,
)

BODY = b"\xbb\xbb\xbb"


def test_v1_header_golden() -> None:
    payload = b"".join([
        struct.pack(">h", 0),           # api_key = Produce
        struct.pack(">h", 3),           # api_version = 3 (not flexible: header v1)
        struct.pack(">i", 7),           # correlation_id
        struct.pack(">h", 3), b"cli",   # client_id = "cli" (int16 length)
        BODY,
    ])
    assert read_request_header(payload) == RequestHeader(
        api_key=0, api_version=3, correlation_id=7, client_id="cli", header_version=1, body_offset=13
    )


def test_v2_header_golden() -> None:
    payload = b"".join([
        struct.pack(">h", 1),                  # api_key = Fetch
        struct.pack(">h", 12),                 # api_version = 12 (flexible: header v2)
        struct.pack(">i", -5),                 # correlation_id (any int32)
        struct.pack(">h", 10), b"consumer-1",  # client_id: still an int16 length in v2
        b"\x00",                               # header tagged fields: none
        BODY,
    ])
    header = read_request_header(payload)
    assert header == RequestHeader(1, 12, -5, "consumer-1", 2, 21)
    assert payload[header.body_offset :] == BODY


def test_v2_header_with_tagged_fields() -> None:
    payload = b"".join([
        struct.pack(">h", 3),           # api_key = Metadata
        struct.pack(">h", 12),          # api_version = 12 (header v2)
        struct.pack(">i", 1),           # correlation_id
        struct.pack(">h", 1), b"c",     # client_id = "c"
        b"\x02",                        # 2 tagged fields
        b"\x00", b"\x03", b"xyz",       #   tag 0, 3 bytes
        b"\x85\x01", b"\x00",           #   tag 133 (2-byte varint), 0 bytes
        BODY,
    ])
    header = read_request_header(payload)
    assert header.body_offset == len(payload) - len(BODY)
    assert header.client_id == "c"


@pytest.mark.parametrize(("api_key", "api_version", "header_version"), [(0, 3, 1), (1, 12, 2)])
def test_null_client_id(api_key: int, api_version: int, header_version: int) -> None:
    payload = b"".join([
        struct.pack(">hhi", api_key, api_version, 9),  # api_key, api_version, correlation_id
        struct.pack(">h", -1),                         # client_id = null
        b"\x00" if header_version == 2 else b"",       # empty tag section (v2 only)
        BODY,
    ])
    header = read_request_header(payload)
    assert header.client_id is None
    assert header.header_version == header_version
    assert payload[header.body_offset :] == BODY


def test_empty_client_id_is_not_null() -> None:
    payload = struct.pack(">hhih", 18, 0, 1, 0)  # ApiVersions v0, client_id = ""
    assert read_request_header(payload).client_id == ""


def test_controlled_shutdown_v0_has_no_client_id() -> None:
    payload = b"".join([
        struct.pack(">h", 7),    # api_key = ControlledShutdown
        struct.pack(">h", 0),    # api_version = 0: request header v0
        struct.pack(">i", 11),   # correlation_id
        struct.pack(">i", 1),    # body: broker_id
    ])
    assert read_request_header(payload) == RequestHeader(7, 0, 11, None, 0, 8)


def test_unknown_api_key_parses_as_header_v1() -> None:
    payload = struct.pack(">hhih", 500, 3, 77, 2) + b"id" + BODY
    assert read_request_header(payload) == RequestHeader(500, 3, 77, "id", 1, 12)


def test_invalid_utf8_client_id_is_replaced() -> None:
    payload = struct.pack(">hhih", 18, 0, 1, 2) + b"\xff\xfe"
    assert read_request_header(payload).client_id == "\ufffd\ufffd"


@pytest.mark.parametrize("cut", range(14))
def test_truncated_request_header(cut: int) -> None:
    full = struct.pack(">hhih", 1, 12, 1, 3) + b"abc" + b"\x01\x00\x01z"  # v2, one tagged field
    assert read_request_header(full).body_offset == len(full)
    with pytest.raises(DecodeError) as exc_info:
        read_request_header(full[:cut])
    assert exc_info.value.offset is not None
    assert "request header" in str(exc_info.value)


def test_negative_client_id_length() -> None:
    with pytest.raises(DecodeError, match="client_id length -2"):
        read_request_header(struct.pack(">hhih", 0, 3, 1, -2))


def test_negative_api_version() -> None:
    with pytest.raises(DecodeError, match="negative api_version"):
        read_request_header(struct.pack(">hhih", 0, -1, 1, 0))


def test_overlong_tag_varint() -> None:
    payload = struct.pack(">hhih", 1, 12, 1, 0) + b"\xff\xff\xff\xff\xff\x01"
    with pytest.raises(DecodeError, match="longer than 5 bytes"):
        read_request_header(payload)


@given(
    api_key=st.integers(min_value=-5, max_value=120),
    api_version=st.integers(min_value=0, max_value=20),
    correlation_id=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    client_id=st.none() | st.text(max_size=20),
    body=st.binary(max_size=8),
)
def test_matches_kio_encoding(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None, body: bytes
) -> None:
    if (api_key, api_version) == (7, 0):
        api_version = 1  # ControlledShutdown v0 uses header v0, which kio does not have
    kio_cls = KioRequestHeaderV2 if request_header_version(api_key, api_version) == 2 else KioRequestHeaderV1
    header = kio_cls(
        request_api_key=api_key, request_api_version=api_version,
        correlation_id=correlation_id, client_id=client_id,
    )
    buf = io.BytesIO()
    entity_writer(kio_cls)(buf, header)
    encoded = buf.getvalue()
    assert read_request_header(encoded + body) == RequestHeader(
        api_key, api_version, correlation_id, client_id, kio_cls.__version__, len(encoded)
    )


def test_response_correlation_id() -> None:
    assert read_response_correlation_id(struct.pack(">i", -3) + b"rest") == -3
    with pytest.raises(DecodeError, match="correlation_id"):
        read_response_correlation_id(b"\x00\x00\x01")


def test_response_body_offset() -> None:
    assert response_body_offset(struct.pack(">i", 1) + BODY, 0) == 4
    assert response_body_offset(struct.pack(">i", 1) + b"\x00" + BODY, 1) == 5
    tagged = struct.pack(">i", 1) + b"\x01" + b"\x07\x02ab" + BODY  # one tag: 7, 2 bytes
    assert response_body_offset(tagged, 1) == len(tagged) - len(BODY)


def test_response_body_offset_errors() -> None:
    with pytest.raises(DecodeError):
        response_body_offset(b"\x00\x00", 0)
    with pytest.raises(DecodeError):
        response_body_offset(struct.pack(">i", 1), 1)  # missing tag section
    with pytest.raises(DecodeError, match="tagged fields data"):
        response_body_offset(struct.pack(">i", 1) + b"\x01\x07\x09ab", 1)  # 9 bytes announced, 2 there
    with pytest.raises(ValueError):
        response_body_offset(struct.pack(">i", 1), 2)
