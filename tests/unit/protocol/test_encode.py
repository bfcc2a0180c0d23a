"""The kio seam: full decodes/encodes, and kio's failures translated into ProtocolError."""

from __future__ import annotations

import datetime
import struct

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.heartbeat.v4.response import HeartbeatResponse
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic

from protocol import (
    ApiKey,
    DecodeError,
    EncodeError,
    ProtocolError,
    RequestHeader,
    UnsupportedVersion,
    decode_request_body,
    decode_response_body,
    encode_request,
    encode_response,
    read_request_header,
)


def test_request_round_trip_golden() -> None:
    body = MetadataRequest(topics=(MetadataRequestTopic(topic_id=None, name="t"),),
                           allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    payload = encode_request(RequestHeader(3, 12, 8, "cli", 2, 0), body)
    assert payload == b"".join([
        struct.pack(">hhi", 3, 12, 8),     # api_key = Metadata, api_version = 12, correlation_id
        struct.pack(">h", 3), b"cli",      # client_id
        b"\x00",                           # header tags
        b"\x02",                           # topics: 1
        b"\x00" * 16,                      #   topic_id = null uuid (all zeros)
        b"\x02t",                          #   name = "t"
        b"\x00",                           #   tags
        b"\x00",                           # allow_auto_topic_creation = false
        b"\x00",                           # include_topic_authorized_operations = false
        b"\x00",                           # tags
    ])
    assert decode_request_body(payload, read_request_header(payload)) == body


def test_response_golden_v0_and_v1_headers() -> None:
    body = HeartbeatResponse(throttle_time=datetime.timedelta(milliseconds=3), error_code=ErrorCode.none)
    assert encode_response(1, 5, body) == struct.pack(">i", 5) + b"\x00" + struct.pack(">ih", 3, 0) + b"\x00"
    assert encode_response(0, 5, body) == struct.pack(">i", 5) + struct.pack(">ih", 3, 0) + b"\x00"
    with pytest.raises(ValueError):
        encode_response(2, 5, body)


def test_response_header_with_unknown_tags_is_skipped_by_hand() -> None:
    payload = struct.pack(">i", 5) + b"\x01\x63\x01\x00" + struct.pack(">ih", 3, 0) + b"\x00"
    body = decode_response_body(payload, ApiKey.HEARTBEAT, 4)
    assert body.throttle_time == datetime.timedelta(milliseconds=3)


def test_bytearray_input_is_accepted() -> None:
    payload = bytearray(struct.pack(">i", 5) + b"\x00" + struct.pack(">ih", 3, 0) + b"\x00")
    assert decode_response_body(payload, ApiKey.HEARTBEAT, 4).error_code == ErrorCode.none


@pytest.mark.parametrize(("api_key", "api_version"), [(1000, 0), (ApiKey.PRODUCE, 2), (ApiKey.FETCH, 19)])
def test_unknown_to_kio_is_unsupported_version(api_key: int, api_version: int) -> None:
    with pytest.raises(UnsupportedVersion):
        decode_response_body(struct.pack(">i", 1) + b"\x00" * 8, api_key, api_version)
    payload = struct.pack(">hhih", api_key, api_version, 1, -1) + b"\x00" * 8
    with pytest.raises(UnsupportedVersion):
        decode_request_body(payload, read_request_header(payload))


@pytest.mark.parametrize(("body", "match"), [
    (struct.pack(">ih", 3, 0) + b"\x01\x63\x01\x00", "KeyError"),   # unknown tag 99 in the body
    (struct.pack(">ih", 3, 0), "truncated tagged fields"),         # tag section missing
    (struct.pack(">ih", 3, 999) + b"\x00", "ValueError"),          # error code unknown to kio
    (struct.pack(">ih", 3, 0) + b"\x00\x00", "trailing"),          # one byte too many
])
def test_kio_failures_become_decode_errors(body: bytes, match: str) -> None:
    payload = struct.pack(">i", 5) + b"\x00" + body
    with pytest.raises(DecodeError, match=match) as exc_info:
        decode_response_body(payload, ApiKey.HEARTBEAT, 4)
    assert isinstance(exc_info.value, ProtocolError)


def test_unencodable_values_become_encode_errors() -> None:
    body = HeartbeatResponse(throttle_time=datetime.timedelta(days=30), error_code=ErrorCode.none)
    with pytest.raises(EncodeError):  # 2,592,000,000 ms does not fit in an int32
        encode_response(1, 5, body)
    ok = HeartbeatResponse(throttle_time=datetime.timedelta(0), error_code=ErrorCode.none)
    with pytest.raises(EncodeError):
        encode_response(1, 2**31, ok)
    with pytest.raises(EncodeError):
        encode_request(RequestHeader(12, 4, 1, "x" * 40000, 2, 0), ok)
