"""Produce request `acks` peek, with golden bytes and kio-encoded requests at every version."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.index import load_request_schema

from protocol import (
    ApiKey,
    DecodeError,
    RequestHeader,
    UnsupportedVersion,
    encode_request,
    read_produce_acks,
    read_request_header,
)
from tests.unit.protocol.kio_support import KIO_EXAMPLES, kio_entities, kio_versions


def header_v1(api_version: int) -> bytes:
    return b"".join([
        struct.pack(">h", 0),            # api_key = Produce
        struct.pack(">h", api_version),  # api_version
        struct.pack(">i", 1),            # correlation_id
        struct.pack(">h", 1), b"p",      # client_id = "p"
    ])


@pytest.mark.parametrize("api_version", [0, 1, 2])
def test_v0_to_v2_acks_is_the_first_field(api_version: int) -> None:
    payload = header_v1(api_version) + b"".join([
        struct.pack(">h", -1),          # acks = all
        struct.pack(">i", 30000),       # timeout_ms
        struct.pack(">i", 0),           # topic_data = []
    ])
    assert read_produce_acks(payload, read_request_header(payload)) == -1


@pytest.mark.parametrize(("transactional_id", "acks"), [(None, 0), (b"txn-1", 1)])
def test_v3_skips_the_transactional_id(transactional_id: bytes | None, acks: int) -> None:
    tid = struct.pack(">h", -1) if transactional_id is None else (
        struct.pack(">h", len(transactional_id)) + transactional_id)
    payload = header_v1(3) + b"".join([
        tid,                            # transactional_id (nullable string, int16 length)
        struct.pack(">h", acks),        # acks
        struct.pack(">i", 30000),       # timeout_ms
        struct.pack(">i", 0),           # topic_data = []
    ])
    assert read_produce_acks(payload, read_request_header(payload)) == acks


@pytest.mark.parametrize(("transactional_id", "acks"), [(b"\x00", 0), (b"\x04txn", -1)])
def test_v9_compact_transactional_id(transactional_id: bytes, acks: int) -> None:
    payload = b"".join([
        struct.pack(">hhi", 0, 9, 1),   # api_key = Produce, api_version = 9, correlation_id
        struct.pack(">h", -1),          # client_id = null
        b"\x01\x00\x01x",               # header tagged fields: tag 0, 1 byte (skipped)
        transactional_id,               # transactional_id (compact nullable string)
        struct.pack(">h", acks),        # acks
        struct.pack(">i", 30000),       # timeout_ms
        b"\x01",                        # topic_data = [] (compact)
        b"\x00",                        # tagged fields
    ])
    assert read_produce_acks(payload, read_request_header(payload)) == acks


@pytest.mark.parametrize("api_version", kio_versions(ApiKey.PRODUCE))
@KIO_EXAMPLES
@given(data=st.data())
def test_every_kio_version(api_version: int, data: st.DataObject) -> None:
    body = data.draw(kio_entities(load_request_schema(ApiKey.PRODUCE, api_version)))
    header_version = 2 if api_version >= 9 else 1
    payload = encode_request(RequestHeader(0, api_version, 5, "client", header_version, 0), body)
    assert read_produce_acks(payload, read_request_header(payload)) == body.acks


def test_truncated() -> None:
    payload = header_v1(3) + struct.pack(">h", 5) + b"txn"  # transactional_id cut short
    with pytest.raises(DecodeError, match="transactional_id"):
        read_produce_acks(payload, read_request_header(payload))
    payload = header_v1(3) + struct.pack(">h", -1) + b"\x00"  # acks cut short
    with pytest.raises(DecodeError, match="acks"):
        read_produce_acks(payload, read_request_header(payload))


def test_unverified_version_and_wrong_api() -> None:
    payload = struct.pack(">hhih", 0, 14, 1, -1) + b"\x00" * 8
    with pytest.raises(UnsupportedVersion):
        read_produce_acks(payload, read_request_header(payload))
    payload = struct.pack(">hhih", 1, 4, 1, -1) + b"\x00" * 8
    with pytest.raises(ValueError, match="not a Produce request"):
        read_produce_acks(payload, read_request_header(payload))
