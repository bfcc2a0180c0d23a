"""Fetch session peek and the broker-style throttled empty Fetch response."""

from __future__ import annotations

import datetime
import struct
from typing import Any

import pytest
from aiokafka.protocol import fetch as aiokafka_fetch
from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.consumer.fetch import FetchResponse as KpFetchResponse
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from protocol import (
    ApiKey,
    DecodeError,
    EncodeError,
    FetchSession,
    RequestHeader,
    UnsupportedVersion,
    decode_response_body,
    empty_fetch_response,
    encode_request,
    read_fetch_session,
    read_request_header,
    read_throttle_time_ms,
)
from protocol.fetch import cap_fetch_max_bytes
from tests.unit.protocol.kio_support import KIO_EXAMPLES, kio_entities, kio_versions

# --- read_fetch_session --------------------------------------------------------------------------


def test_v7_golden() -> None:
    payload = b"".join([
        struct.pack(">hhi", 1, 7, 3),   # api_key = Fetch, api_version = 7, correlation_id
        struct.pack(">h", 1), b"c",     # client_id = "c"
        struct.pack(">i", -1),          # replica_id (consumer)
        struct.pack(">i", 500),         # max_wait_ms
        struct.pack(">i", 1),           # min_bytes
        struct.pack(">i", 52428800),    # max_bytes
        struct.pack(">b", 0),           # isolation_level
        struct.pack(">i", 1234),        # session_id
        struct.pack(">i", 5),           # session_epoch
        struct.pack(">i", 0),           # topics = []
        struct.pack(">i", 0),           # forgotten_topics_data = []
    ])
    assert read_fetch_session(payload, read_request_header(payload)) == FetchSession(1234, 5)


def test_v15_golden_without_replica_id() -> None:
    payload = b"".join([
        struct.pack(">hhi", 1, 15, 3),  # api_key = Fetch, api_version = 15, correlation_id
        struct.pack(">h", -1),          # client_id = null
        b"\x00",                        # header tagged fields
        struct.pack(">i", 500),         # max_wait_ms (replica_id is a tagged field from v15)
        struct.pack(">i", 1),           # min_bytes
        struct.pack(">i", 1024),        # max_bytes
        struct.pack(">b", 1),           # isolation_level
        struct.pack(">i", 0),           # session_id = 0: full fetch
        struct.pack(">i", 0),           # session_epoch = 0: create a session
        b"\x01", b"\x01", b"\x01",      # topics, forgotten_topics_data = [], rack_id = ""
        b"\x00",                        # tagged fields
    ])
    assert read_fetch_session(payload, read_request_header(payload)) == FetchSession(0, 0)


def test_before_v7_there_is_no_session() -> None:
    payload = struct.pack(">hhih", 1, 4, 3, -1) + b"\x00" * 17
    assert read_fetch_session(payload, read_request_header(payload)) == FetchSession(0, -1)


@pytest.mark.parametrize("api_version", kio_versions(ApiKey.FETCH))
@KIO_EXAMPLES
@given(data=st.data())
def test_session_at_every_kio_version(api_version: int, data: st.DataObject) -> None:
    body = data.draw(kio_entities(load_request_schema(ApiKey.FETCH, api_version)))
    header_version = 2 if api_version >= 12 else 1
    payload = encode_request(RequestHeader(1, api_version, 5, "consumer", header_version, 0), body)
    session = read_fetch_session(payload, read_request_header(payload))
    if api_version >= 7:
        assert session == FetchSession(body.session_id, body.session_epoch)
    else:
        assert session == FetchSession(0, -1)


def test_session_errors() -> None:
    truncated = struct.pack(">hhih", 1, 7, 3, -1) + b"\x00" * 23  # body: 17 + session_id + 2 bytes
    with pytest.raises(DecodeError, match="session_epoch"):
        read_fetch_session(truncated, read_request_header(truncated))
    future = struct.pack(">hhih", 1, 19, 3, -1) + b"\x00" * 40
    with pytest.raises(UnsupportedVersion):
        read_fetch_session(future, read_request_header(future))
    produce = struct.pack(">hhih", 0, 7, 3, -1) + b"\x00" * 40
    with pytest.raises(ValueError):
        read_fetch_session(produce, read_request_header(produce))


# --- empty_fetch_response ------------------------------------------------------------------------


def test_empty_response_v1_golden() -> None:
    assert empty_fetch_response(9, 1, 250, 77) == b"".join([
        struct.pack(">i", 9),           # correlation_id
        struct.pack(">i", 250),         # throttle_time_ms
        struct.pack(">i", 0),           # responses = [] (session_id is not in v1)
    ])


def test_empty_response_v0_golden() -> None:
    assert empty_fetch_response(9, 0, 250, 0) == struct.pack(">ii", 9, 0)  # corr, responses = []


def test_empty_response_v7_golden() -> None:
    assert empty_fetch_response(9, 7, 250, 77) == b"".join([
        struct.pack(">i", 9),           # correlation_id
        struct.pack(">i", 250),         # throttle_time_ms
        struct.pack(">h", 0),           # error_code = NONE
        struct.pack(">i", 77),          # session_id (kept for an incremental session)
        struct.pack(">i", 0),           # responses = []
    ])


def test_empty_response_v16_golden() -> None:
    assert empty_fetch_response(9, 16, 250, 0) == b"".join([
        struct.pack(">i", 9),           # correlation_id
        b"\x00",                        # response header v1: no tagged fields
        struct.pack(">i", 250),         # throttle_time_ms
        struct.pack(">h", 0),           # error_code = NONE
        struct.pack(">i", 0),           # session_id = 0 (sessionless or full fetch)
        b"\x01",                        # responses = [] (compact)
        b"\x00",                        # tagged fields (no node_endpoints)
    ])


@pytest.mark.parametrize("api_version", range(19))
def test_empty_response_decodes_everywhere(api_version: int) -> None:
    payload = empty_fetch_response(0x0A0B0C0D, api_version, 1500, 42)
    expected_session = 42 if api_version >= 7 else None
    if api_version >= 1:
        assert read_throttle_time_ms(payload, ApiKey.FETCH, api_version) == 1500

    # kafka-python (its schema starts at v4 but it decodes the older field layouts too)
    kp = KpFetchResponse.decode(payload, version=api_version, header=True)
    assert kp.header.correlation_id == 0x0A0B0C0D
    assert list(kp.responses) == []
    if api_version >= 1:
        assert kp.throttle_time_ms == 1500
    if expected_session is not None:
        assert (kp.error_code, kp.session_id) == (0, expected_session)

    # kio, for the versions it has
    if api_version >= 4:
        body = decode_response_body(payload, ApiKey.FETCH, api_version)
        assert body.throttle_time == datetime.timedelta(milliseconds=1500)
        assert body.responses == ()
        if expected_session is not None:
            assert (body.error_code, body.session_id) == (ErrorCode.none, expected_session)

    # aiokafka's hand-written structs (non-flexible versions only)
    if api_version <= 11:
        aio: Any = getattr(aiokafka_fetch, f"FetchResponse_v{api_version}").decode(payload[4:])
        assert aio.topics == []
        if api_version >= 7:
            assert (aio.throttle_time_ms, aio.error_code, aio.session_id) == (1500, 0, 42)


def test_empty_response_clamps_throttle() -> None:
    assert read_throttle_time_ms(empty_fetch_response(1, 18, 2**40, 0), ApiKey.FETCH, 18) == 2**31 - 1
    assert read_throttle_time_ms(empty_fetch_response(1, 18, -5, 0), ApiKey.FETCH, 18) == 0


def test_empty_response_errors() -> None:
    with pytest.raises(UnsupportedVersion):
        empty_fetch_response(1, 19, 100, 0)
    with pytest.raises(EncodeError):
        empty_fetch_response(1, 12, 100, 2**31)
    with pytest.raises(EncodeError):
        empty_fetch_response(2**31, 2, 100, 0)


# --------------------------------------------------------------------------- KAFKA-9677 cap


def _fetch_request_v12(min_bytes: int, max_bytes: int) -> tuple[RequestHeader, bytes]:
    head = b"".join([
        struct.pack(">hhih", 1, 12, 5, 1), b"c",   # api_key Fetch, v12, correlation 5, client_id "c"
        b"\x00",                                   # header tagged fields
    ])
    body = b"".join([
        struct.pack(">i", -1),                     # replica_id
        struct.pack(">i", 500),                    # max_wait_ms
        struct.pack(">i", min_bytes),              # min_bytes
        struct.pack(">i", max_bytes),              # max_bytes
        b"\x00",                                   # isolation_level
        b"rest of the request",                    # session, topics... (not read)
    ])
    return RequestHeader(1, 12, 5, "c", 2, len(head)), head + body


def test_cap_fetch_max_bytes_lowers_max_and_min_bytes() -> None:
    header, payload = _fetch_request_v12(min_bytes=2_000_000, max_bytes=52_428_800)
    capped = cap_fetch_max_bytes(payload, header, 1_000_000)
    body = header.body_offset
    assert struct.unpack_from(">iii", capped, body + 4) == (500, 1_000_000, 1_000_000)
    assert capped[body + 16:] == payload[body + 16:] and len(capped) == len(payload)


def test_cap_fetch_max_bytes_leaves_small_fetches_alone() -> None:
    header, payload = _fetch_request_v12(min_bytes=1, max_bytes=65_536)
    assert cap_fetch_max_bytes(payload, header, 1_000_000) is payload
