"""throttle_time_ms: located and patched in place, at every version of every API.

Oracles: hand-built golden bytes (with a comment per field) for the versions kio no longer has
(Produce v1-2, Fetch v0-3) and for unknown tagged fields; kio's encoder for everything it knows
(the patched frame must equal kio's encoding of the same entity with the new throttle); kafka-python
and aiokafka decoders as second opinions.
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
import uuid
from typing import Any

import pytest
from aiokafka.protocol.fetch import FetchResponse_v1, FetchResponse_v2, FetchResponse_v3
from aiokafka.protocol.produce import ProduceResponse_v1, ProduceResponse_v2
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer.fetch import FetchResponse as KpFetchResponse
from kafka.protocol.producer import ProduceResponse as KpProduceResponse
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from protocol import (
    ApiKey,
    DecodeError,
    UnsupportedVersion,
    decode_response_body,
    patch_throttle_time,
    plan_throttle_patch,
    read_throttle_time_ms,
    throttle_time_offset,
)
from protocol.throttle import MAX_KNOWN_RESPONSE_VERSION, produce_throttle_offset_walk
from tests.unit.protocol.kio_support import (
    KIO_EXAMPLES,
    changed_offsets,
    kio_api_keys,
    kio_entities,
    kio_versions,
    ms,
    response_payload,
)

INT32_MAX = 2**31 - 1
CORR = struct.pack(">i", 0x01020304)  # correlation_id used by every golden frame
throttles = st.integers(min_value=-(2**31), max_value=2**32)


def check_patch(payload: bytes, api_key: int, api_version: int, existing: int, new: int) -> bytes:
    """Patch `new` in; assert max() semantics and that at most the 4 throttle bytes changed."""
    offset = throttle_time_offset(payload, api_key, api_version)
    assert offset is not None
    assert read_throttle_time_ms(payload, api_key, api_version) == existing
    patched = patch_throttle_time(payload, api_key, api_version, new)
    wanted = max(existing, min(new, INT32_MAX))
    if wanted == existing:
        assert patched is payload
        assert plan_throttle_patch(payload, api_key, api_version, new) is None
    else:
        assert len(patched) == len(payload)
        assert set(changed_offsets(payload, patched)) <= set(range(offset, offset + 4))
        assert plan_throttle_patch(payload, api_key, api_version, new) == (offset, struct.pack(">i", wanted))
    assert read_throttle_time_ms(patched, api_key, api_version) == wanted
    return patched


def with_throttle(body: Any, throttle_ms: int) -> Any:
    return dataclasses.replace(body, throttle_time=datetime.timedelta(milliseconds=throttle_ms))


# --- Fetch ----------------------------------------------------------------------------------------


def test_fetch_v0_has_no_throttle_field() -> None:
    payload = CORR + struct.pack(">i", 0)  # correlation_id, responses = []
    assert throttle_time_offset(payload, ApiKey.FETCH, 0) is None
    assert read_throttle_time_ms(payload, ApiKey.FETCH, 0) is None
    assert patch_throttle_time(payload, ApiKey.FETCH, 0, 500) is payload


@pytest.mark.parametrize("api_version", [1, 2, 3])
def test_fetch_v1_to_v3_golden(api_version: int) -> None:
    payload = b"".join([
        CORR,                          # correlation_id (response header v0)
        struct.pack(">i", 25),         # throttle_time_ms = 25: the first body field
        struct.pack(">i", 1),          # responses: 1 topic
        struct.pack(">h", 1), b"t",    #   topic = "t"
        struct.pack(">i", 1),          #   partitions: 1
        struct.pack(">i", 0),          #     partition_index
        struct.pack(">h", 0),          #     error_code
        struct.pack(">q", 10),         #     high_watermark
        struct.pack(">i", 3), b"rec",  #     records (int32 length)
    ])
    assert throttle_time_offset(payload, ApiKey.FETCH, api_version) == 4
    patched = check_patch(payload, ApiKey.FETCH, api_version, existing=25, new=1000)
    assert patched[4:8] == struct.pack(">i", 1000)
    check_patch(payload, ApiKey.FETCH, api_version, existing=25, new=24)  # max(): no change


@pytest.mark.parametrize("struct_cls", [FetchResponse_v1, FetchResponse_v2, FetchResponse_v3])
@given(
    existing=st.integers(min_value=0, max_value=INT32_MAX),
    new=throttles,
    topics=st.lists(st.tuples(st.text(max_size=5), st.lists(
        st.tuples(st.integers(0, 99), st.integers(-1, 99), st.integers(-1, 2**40), st.binary(max_size=9)),
        max_size=3)), max_size=3),
)
@settings(max_examples=25)
def test_fetch_v1_to_v3_from_aiokafka(struct_cls: Any, existing: int, new: int, topics: Any) -> None:
    payload = CORR + struct_cls(existing, topics).encode()
    patched = check_patch(payload, ApiKey.FETCH, struct_cls.API_VERSION, existing, new)
    decoded = struct_cls.decode(patched[4:])
    assert decoded.throttle_time_ms == max(existing, min(new, INT32_MAX))
    assert decoded.topics == struct_cls.decode(payload[4:]).topics


def test_fetch_v12_golden_with_header_tags() -> None:
    payload = b"".join([
        CORR,                          # correlation_id
        b"\x01", b"\x09\x02zz",        # response header tagged fields: tag 9 (unknown), 2 bytes
        struct.pack(">i", 7),          # throttle_time_ms = 7
        struct.pack(">h", 0),          # error_code
        struct.pack(">i", 0),          # session_id
        b"\x01",                       # responses: compact array, 0 entries
        b"\x00",                       # tagged fields
    ])
    assert throttle_time_offset(payload, ApiKey.FETCH, 12) == 9
    check_patch(payload, ApiKey.FETCH, 12, existing=7, new=8)


def test_fetch_prefix_is_enough_to_patch() -> None:
    # A cut-through proxy may only hold the first chunk of a large Fetch response.
    prefix = CORR + b"\x00" + struct.pack(">i", 0) + b"\x00\x00"
    assert plan_throttle_patch(prefix, ApiKey.FETCH, 18, 300) == (5, struct.pack(">i", 300))


@pytest.mark.parametrize("api_version", kio_versions(ApiKey.FETCH))
@KIO_EXAMPLES
@given(data=st.data(), new=throttles)
def test_fetch_every_kio_version(api_version: int, data: st.DataObject, new: int) -> None:
    body = data.draw(kio_entities(load_response_schema(ApiKey.FETCH, api_version)))
    payload = response_payload(body)
    assert throttle_time_offset(payload, ApiKey.FETCH, api_version) == (5 if api_version >= 12 else 4)
    patched = check_patch(payload, ApiKey.FETCH, api_version, ms(body.throttle_time), new)
    wanted = max(ms(body.throttle_time), min(new, INT32_MAX))
    assert patched == response_payload(with_throttle(body, wanted))  # == kio's full rewrite
    decoded = KpFetchResponse.decode(patched, version=api_version, header=True)
    assert decoded.throttle_time_ms == wanted  # kafka-python agrees


# --- Produce --------------------------------------------------------------------------------------


def test_produce_v0_has_no_throttle_field() -> None:
    payload = CORR + struct.pack(">i", 0)
    assert throttle_time_offset(payload, ApiKey.PRODUCE, 0) is None


def test_produce_v2_golden() -> None:
    payload = b"".join([
        CORR,                          # correlation_id
        struct.pack(">i", 1),          # responses: 1 topic
        struct.pack(">h", 2), b"tp",   #   name = "tp"
        struct.pack(">i", 1),          #   partition_responses: 1
        struct.pack(">i", 3),          #     index
        struct.pack(">h", 0),          #     error_code
        struct.pack(">q", 99),         #     base_offset
        struct.pack(">q", -1),         #     log_append_time_ms (v2+)
        struct.pack(">i", 40),         # throttle_time_ms = 40: the last 4 bytes
    ])
    assert throttle_time_offset(payload, ApiKey.PRODUCE, 2) == len(payload) - 4
    assert produce_throttle_offset_walk(payload, 4, 2) == len(payload) - 4
    check_patch(payload, ApiKey.PRODUCE, 2, existing=40, new=41)


@pytest.mark.parametrize("struct_cls", [ProduceResponse_v1, ProduceResponse_v2])
@given(
    existing=st.integers(min_value=0, max_value=INT32_MAX),
    new=throttles,
    topics=st.lists(st.tuples(st.text(max_size=5), st.lists(
        st.tuples(st.integers(0, 99), st.integers(-1, 99), st.integers(-1, 2**40), st.integers(-1, 2**40)),
        max_size=3)), max_size=3),
)
@settings(max_examples=25)
def test_produce_v1_v2_from_aiokafka(struct_cls: Any, existing: int, new: int, topics: Any) -> None:
    if struct_cls is ProduceResponse_v1:
        topics = [(name, [p[:3] for p in parts]) for name, parts in topics]  # no timestamp in v1
    payload = CORR + struct_cls(topics, existing).encode()
    version = struct_cls.API_VERSION
    assert produce_throttle_offset_walk(payload, 4, version) == len(payload) - 4
    patched = check_patch(payload, ApiKey.PRODUCE, version, existing, new)
    assert struct_cls.decode(patched[4:]).throttle_time_ms == max(existing, min(new, INT32_MAX))


def produce_v10_with_unknown_tags() -> bytes:
    return b"".join([
        CORR, b"\x00",                       # correlation_id, header tagged fields: none
        b"\x02",                             # responses: compact array, 1 topic
        b"\x03", b"tp",                      #   name = "tp" (compact string)
        b"\x02",                             #   partition_responses: 1
        struct.pack(">i", 0),                #     index
        struct.pack(">h", 6),                #     error_code = NOT_LEADER_OR_FOLLOWER
        struct.pack(">q", -1),               #     base_offset
        struct.pack(">q", -1),               #     log_append_time_ms
        struct.pack(">q", -1),               #     log_start_offset
        b"\x02",                             #     record_errors: 1
        struct.pack(">i", 4),                #       batch_index
        b"\x04", b"bad",                     #       batch_index_error_message = "bad"
        b"\x01", b"\x2a\x01!",               #       tagged fields: tag 42 (unknown), 1 byte
        b"\x00",                             #     error_message = null
        b"\x02",                             #     tagged fields: 2
        b"\x00\x09", struct.pack(">ii", 1, 5), b"\x00",  # tag 0 current_leader: leader 1, epoch 5, tags
        b"\x63\x03abc",                      #       tag 99 (unknown), 3 bytes
        b"\x01", b"\x07\x00",                #   topic tagged fields: tag 7 (unknown), empty
        struct.pack(">i", 123),              # throttle_time_ms = 123
        b"\x01",                             # tagged fields: 1
        b"\x00\x0d", b"\x02",                #   tag 0 node_endpoints (13 bytes): 1 endpoint
        struct.pack(">i", 1), b"\x02h",      #     node_id 1, host "h"
        struct.pack(">i", 9092), b"\x00",    #     port, rack = null
        b"\x00",                             #     tagged fields
    ])


def test_produce_v10_golden_with_unknown_tags() -> None:
    payload = produce_v10_with_unknown_tags()
    offset = throttle_time_offset(payload, ApiKey.PRODUCE, 10)
    assert payload[offset : offset + 4] == struct.pack(">i", 123)
    check_patch(payload, ApiKey.PRODUCE, 10, existing=123, new=2100)
    # kafka-python skips unknown tags (KIP-482) and agrees on the value
    assert KpProduceResponse.decode(payload, version=10, header=True).throttle_time_ms == 123
    with pytest.raises(DecodeError):  # kio does not skip unknown tags
        decode_response_body(payload, ApiKey.PRODUCE, 10)


def test_produce_v10_trailing_garbage_is_detected() -> None:
    with pytest.raises(DecodeError, match="trailing bytes"):
        throttle_time_offset(produce_v10_with_unknown_tags() + b"\x00", ApiKey.PRODUCE, 10)


@pytest.mark.parametrize("api_version", kio_versions(ApiKey.PRODUCE))
@KIO_EXAMPLES
@given(data=st.data(), new=throttles)
def test_produce_every_kio_version(api_version: int, data: st.DataObject, new: int) -> None:
    body = data.draw(kio_entities(load_response_schema(ApiKey.PRODUCE, api_version)))
    payload = response_payload(body)
    body_offset = 5 if api_version >= 9 else 4
    walked = produce_throttle_offset_walk(payload, body_offset, api_version)
    assert throttle_time_offset(payload, ApiKey.PRODUCE, api_version) == walked
    if api_version <= 8:
        assert walked == len(payload) - 4
    patched = check_patch(payload, ApiKey.PRODUCE, api_version, ms(body.throttle_time), new)
    wanted = max(ms(body.throttle_time), min(new, INT32_MAX))
    assert patched == response_payload(with_throttle(body, wanted))  # == kio's full rewrite
    decoded = KpProduceResponse.decode(patched, version=api_version, header=True)
    assert decoded.throttle_time_ms == wanted  # kafka-python agrees


def test_produce_v13_uses_topic_id() -> None:
    payload = b"".join([
        CORR, b"\x00",                       # correlation_id, header tags
        b"\x02",                             # responses: 1 topic
        uuid.UUID(int=7).bytes,              #   topic_id (16 bytes) instead of a name
        b"\x01",                             #   partition_responses: none
        b"\x00",                             #   topic tags
        struct.pack(">i", 5),                # throttle_time_ms = 5
        b"\x00",                             # tags
    ])
    assert throttle_time_offset(payload, ApiKey.PRODUCE, 13) == len(payload) - 5
    assert decode_response_body(payload, ApiKey.PRODUCE, 13).throttle_time == datetime.timedelta(
        milliseconds=5
    )
    with pytest.raises(DecodeError):  # read as v12 (a name), the layout does not add up
        throttle_time_offset(payload, ApiKey.PRODUCE, 12)


# --- ApiVersions ---------------------------------------------------------------------------------


def test_api_versions_v3_golden() -> None:
    payload = b"".join([
        CORR,                                  # correlation_id (header v0 even though flexible)
        struct.pack(">h", 0),                  # error_code
        b"\x03",                               # api_keys: compact array, 2 entries
        struct.pack(">hhh", 0, 3, 13), b"\x00",  # Produce v3-13, no tags
        struct.pack(">hhh", 1, 4, 18),         # Fetch v4-18
        b"\x01\x05\x01z",                      #   tags: tag 5 (unknown), 1 byte
        struct.pack(">i", 11),                 # throttle_time_ms = 11
        b"\x00",                               # tagged fields (features, ...)
    ])
    assert throttle_time_offset(payload, ApiKey.API_VERSIONS, 3) == len(payload) - 5
    check_patch(payload, ApiKey.API_VERSIONS, 3, existing=11, new=12)


def test_api_versions_v0_format_error_has_no_throttle() -> None:
    # A broker answers an ApiVersions version it does not support in the v0 format.
    payload = b"".join([
        CORR,                                  # correlation_id
        struct.pack(">h", 35),                 # error_code = UNSUPPORTED_VERSION
        struct.pack(">i", 1),                  # api_keys: 1 entry (int32 length: v0 format)
        struct.pack(">hhh", 18, 0, 4),         #   ApiVersions v0-4
    ])
    assert throttle_time_offset(payload, ApiKey.API_VERSIONS, 4) is None
    assert patch_throttle_time(payload, ApiKey.API_VERSIONS, 4, 100) is payload
    assert throttle_time_offset(payload, ApiKey.API_VERSIONS, 5) is None  # a future client's v5


def test_api_versions_v1_golden() -> None:
    payload = b"".join([
        CORR,                                  # correlation_id
        struct.pack(">h", 0),                  # error_code
        struct.pack(">i", 1),                  # api_keys: 1 entry
        struct.pack(">hhh", 18, 0, 4),         #   ApiVersions v0-4
        struct.pack(">i", 0),                  # throttle_time_ms = 0
    ])
    assert throttle_time_offset(payload, ApiKey.API_VERSIONS, 1) == 16
    assert throttle_time_offset(payload, ApiKey.API_VERSIONS, 0) is None
    check_patch(payload, ApiKey.API_VERSIONS, 1, existing=0, new=10)


# --- Every API kio knows -------------------------------------------------------------------------


def _all_kio_response_versions() -> list[tuple[int, int]]:
    return [(key, version) for key in kio_api_keys() for version in kio_versions(key)]


@pytest.mark.parametrize(("api_key", "api_version"), _all_kio_response_versions())
@settings(max_examples=3, deadline=None, suppress_health_check=KIO_EXAMPLES.suppress_health_check)
@given(data=st.data())
def test_every_api_and_version_kio_knows(api_key: int, api_version: int, data: st.DataObject) -> None:
    cls = load_response_schema(api_key, api_version)
    body = data.draw(kio_entities(cls))
    payload = response_payload(body)
    if "throttle_time" not in cls.__dataclass_fields__:
        assert throttle_time_offset(payload, api_key, api_version) is None
        return
    existing = ms(body.throttle_time)
    new = existing + 1 if existing < INT32_MAX else 0
    patched = check_patch(payload, api_key, api_version, existing, new)
    assert patched == response_payload(with_throttle(body, max(existing, new)))


def test_known_versions_cover_kio() -> None:
    for key in kio_api_keys():
        assert MAX_KNOWN_RESPONSE_VERSION[key] == max(kio_versions(key))


@pytest.mark.parametrize(("api_key", "api_version"), [
    (ApiKey.METADATA, 2),          # throttle_time_ms from v3
    (ApiKey.LIST_OFFSETS, 1),      # from v2
    (ApiKey.SASL_HANDSHAKE, 1),    # never
    (ApiKey.SASL_AUTHENTICATE, 2), # never
    (ApiKey.LEADER_AND_ISR, 7),    # removed in Kafka 4.0; never had one
])
def test_versions_without_the_field(api_key: int, api_version: int) -> None:
    payload = CORR + b"\x00" * 8
    assert throttle_time_offset(payload, api_key, api_version) is None


@pytest.mark.parametrize(("api_key", "api_version", "offset"), [
    (ApiKey.OFFSET_COMMIT, 3, 4),    # first field, non-flexible: right after correlation_id
    (ApiKey.OFFSET_COMMIT, 8, 5),    # first field, flexible: after the header's tag section
    (ApiKey.JOIN_GROUP, 2, 4),
    (ApiKey.OFFSET_DELETE, 0, 6),    # after error_code
    (ApiKey.RENEW_DELEGATION_TOKEN, 1, 14),   # after error_code, expiry_timestamp_ms
    (ApiKey.EXPIRE_DELEGATION_TOKEN, 2, 15),  # the same, after a flexible header
])
def test_fixed_offsets_below_and_at_kio_versions(api_key: int, api_version: int, offset: int) -> None:
    payload = CORR + b"\x00" * 24
    assert throttle_time_offset(payload, api_key, api_version) == offset


def test_describe_delegation_token_v3_golden() -> None:
    payload = b"".join([
        CORR, b"\x00",                 # correlation_id, header tags
        struct.pack(">h", 0),          # error_code
        b"\x02",                       # tokens: 1
        b"\x05User", b"\x02a",         #   principal_type, principal_name
        b"\x05User", b"\x02b",         #   token_requester_principal_type, _name (v3+)
        struct.pack(">qqq", 1, 2, 3),  #   issue, expiry, max timestamps
        b"\x03id",                     #   token_id
        b"\x03\x01\x02",               #   hmac (compact bytes, 2 bytes)
        b"\x02", b"\x05User\x02c\x00", #   renewers: 1 (type, name, tags)
        b"\x00",                       #   token tags
        struct.pack(">i", 9),          # throttle_time_ms = 9
        b"\x00",                       # tags
    ])
    assert throttle_time_offset(payload, ApiKey.DESCRIBE_DELEGATION_TOKEN, 3) == len(payload) - 5
    check_patch(payload, ApiKey.DESCRIBE_DELEGATION_TOKEN, 3, existing=9, new=10)


# --- max() semantics, clamping, errors ------------------------------------------------------------


def test_max_semantics_and_clamp() -> None:
    payload = CORR + struct.pack(">i", 500)  # Fetch v1-ish: throttle_time_ms = 500
    assert patch_throttle_time(payload, ApiKey.FETCH, 1, 499) is payload
    assert patch_throttle_time(payload, ApiKey.FETCH, 1, 500) is payload
    assert patch_throttle_time(payload, ApiKey.FETCH, 1, 501)[4:] == struct.pack(">i", 501)
    assert patch_throttle_time(payload, ApiKey.FETCH, 1, 2**40)[4:] == struct.pack(">i", INT32_MAX)
    assert patch_throttle_time(payload, ApiKey.FETCH, 1, -7) is payload


@pytest.mark.parametrize(("api_key", "api_version"), [
    (ApiKey.PRODUCE, 14), (ApiKey.FETCH, 19), (ApiKey.METADATA, 14), (ApiKey.FETCH, -1), (200, 0),
])
def test_unverified_versions_are_refused(api_key: int, api_version: int) -> None:
    with pytest.raises(UnsupportedVersion):
        throttle_time_offset(CORR + b"\x00" * 16, api_key, api_version)


@pytest.mark.parametrize(("api_key", "api_version", "payload"), [
    (ApiKey.FETCH, 1, CORR + b"\x00\x00"),                 # throttle field cut short
    (ApiKey.FETCH, 12, CORR),                              # missing header tag section
    (ApiKey.PRODUCE, 8, CORR + b"\x00\x00\x00"),           # too short for array + throttle
    (ApiKey.PRODUCE, 9, CORR + b"\x00\x02\x03tp"),         # cut inside the topic
    (ApiKey.PRODUCE, 9, CORR + b"\x00\xff\xff\xff\x0f"),   # hostile topic count
    (ApiKey.PRODUCE, 9, CORR + b"\x00\x80\x80\x80\x80\x80"),  # varint too long
    (ApiKey.API_VERSIONS, 1, CORR + b"\x00\x00" + struct.pack(">i", 5)),  # 5 entries announced
    (ApiKey.API_VERSIONS, 1, CORR + b"\x00\x00" + struct.pack(">i", -3)),  # negative count
    (ApiKey.DESCRIBE_DELEGATION_TOKEN, 1, CORR + b"\x00\x00\x00\x00\x00\x01\x00\x05Us"),
    (ApiKey.CREATE_DELEGATION_TOKEN, 3, CORR + b"\x00\x00\x00\x05Us"),
])
def test_malformed_responses_raise_decode_error(api_key: int, api_version: int, payload: bytes) -> None:
    with pytest.raises(DecodeError):
        patch_throttle_time(payload, api_key, api_version, 100)


@pytest.mark.parametrize("api_version", [9, 12, 13])
def test_produce_long_arrays_and_names_take_the_slow_paths(api_version: int) -> None:
    # 130 partitions and a 200-byte topic name need two-byte varints; errors need the full readers.
    module = __import__(f"kio.schema.produce.v{api_version}.response", fromlist=["_"])
    partitions = tuple(
        module.PartitionProduceResponse(
            index=p, error_code=ErrorCode.none, base_offset=p, log_append_time=None, log_start_offset=0,
            record_errors=(module.BatchIndexAndErrorMessage(
                batch_index=1, batch_index_error_message="x" * 130),) if p % 50 == 0 else (),
            error_message="e" * 140 if p % 40 == 0 else None)
        for p in range(130))
    topic_key = {"topic_id": uuid.UUID(int=3)} if api_version >= 13 else {"name": "t" * 200}
    body = module.ProduceResponse(
        responses=(module.TopicProduceResponse(**topic_key, partition_responses=partitions),) * 2,
        throttle_time=datetime.timedelta(milliseconds=17))
    payload = response_payload(body)
    patched = check_patch(payload, ApiKey.PRODUCE, api_version, existing=17, new=900)
    assert patched == response_payload(with_throttle(body, 900))


def test_api_versions_unsupported_version_in_the_requested_version_keeps_its_throttle() -> None:
    # A v2 response may carry UNSUPPORTED_VERSION itself (then with throttle_time_ms); only a
    # payload that is exactly the v0 layout is the broker's v0 fallback (found by hypothesis).
    v2 = b"".join([
        CORR,                       # correlation_id (response header v0)
        struct.pack(">h", 35),      # error_code = UNSUPPORTED_VERSION
        struct.pack(">i", 0),       # api_keys: empty
        struct.pack(">i", 7),       # throttle_time_ms = 7
    ])
    assert throttle_time_offset(v2, ApiKey.API_VERSIONS, 2) == 10
    check_patch(v2, ApiKey.API_VERSIONS, 2, existing=7, new=100)
    v0_fallback = v2[:-4]           # the same without the throttle field: the v0 format
    assert throttle_time_offset(v0_fallback, ApiKey.API_VERSIONS, 2) is None
