"""ShareFetch / ShareAcknowledge (KIP-932): leader endpoints mapped, max_bytes capped, byte for byte."""

from __future__ import annotations

import dataclasses
import struct
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema

from protocol.apis import ApiKey
from protocol.encode import encode_request
from protocol.errors import DecodeError, UnsupportedVersion
from protocol.headers import RequestHeader, read_request_header
from protocol.rewrite import BrokerAddress
from protocol.share import (
    cap_share_fetch_max_bytes,
    rewrite_share_acknowledge_response,
    rewrite_share_fetch_response,
)
from tests.unit.protocol.kio_support import KIO_EXAMPLES, changed_offsets, kio_entities, response_payload

CORR = struct.pack(">i", 7)
TOPIC_ID = bytes(range(16))


def to_proxy(address: BrokerAddress) -> BrokerAddress:
    return BrokerAddress(address.node_id, "sluice.proxy.example", 30000 + address.node_id % 1000)


def _endpoint(node_id: int, host: bytes, port: int, rack: bytes | None) -> bytes:
    return b"".join([
        struct.pack(">i", node_id),                          # node_id
        bytes([len(host) + 1]), host,                        # host (compact string)
        struct.pack(">i", port),                             # port
        b"\x00" if rack is None else bytes([len(rack) + 1]) + rack,  # rack (compact nullable)
        b"\x00",                                             # endpoint tags
    ])


def share_fetch_v1(endpoints: bytes, n_endpoints: int, records: bytes = b"RECS") -> bytes:
    return b"".join([
        CORR, b"\x00",                       # correlation_id, response header tags
        struct.pack(">i", 0),                # throttle_time_ms
        struct.pack(">h", 0),                # error_code
        b"\x00",                             # error_message = null
        struct.pack(">i", 30000),            # acquisition_lock_timeout_ms (v1+)
        b"\x02",                             # responses: 1 topic
        TOPIC_ID,                            #   topic_id
        b"\x03",                             #   partitions: 2
        struct.pack(">ih", 0, 6),            #     partition_index 0, error_code NOT_LEADER_OR_FOLLOWER
        b"\x00",                             #     error_message = null
        struct.pack(">h", 0),                #     acknowledge_error_code
        b"\x00",                             #     acknowledge_error_message = null
        struct.pack(">ii", 2, 5), b"\x00",   #     current_leader: leader_id 2, epoch 5, tags
        b"\x01",                             #     records = empty
        b"\x01",                             #     acquired_records = []
        b"\x00",                             #     partition tags
        struct.pack(">ih", 1, 0),            #     partition_index 1, error_code 0
        b"\x03er",                           #     error_message = "er" (copied as is)
        struct.pack(">h", 0), b"\x00",       #     acknowledge_error_code, message = null
        struct.pack(">ii", 1, 3), b"\x00",   #     current_leader 1, epoch 3, tags
        bytes([len(records) + 1]), records,  #     records
        b"\x02",                             #     acquired_records: 1
        struct.pack(">qqh", 10, 12, 1),      #       first_offset, last_offset, delivery_count
        b"\x00",                             #       tags
        b"\x01\x07\x01Z",                    #     partition tags: 1 unknown tag 7, 1 byte (kept)
        b"\x00",                             #   topic tags
        bytes([n_endpoints + 1]), endpoints,  # node_endpoints
        b"\x00",                             # top-level tags
    ])


def test_share_fetch_v1_golden() -> None:
    before = share_fetch_v1(_endpoint(2, b"b2", 9092, b"r1"), 1)
    new, original = rewrite_share_fetch_response(before, 1, to_proxy)
    assert original == [BrokerAddress(2, "b2", 9092)]
    assert new == share_fetch_v1(_endpoint(2, b"sluice.proxy.example", 30002, b"r1"), 1)


def test_share_fetch_without_endpoints_is_returned_as_is() -> None:
    payload = share_fetch_v1(b"", 0)
    assert rewrite_share_fetch_response(payload, 1, to_proxy) == (payload, [])


def test_share_fetch_errors() -> None:
    payload = share_fetch_v1(_endpoint(2, b"b2", 9092, None), 1)
    with pytest.raises(DecodeError, match="trailing"):
        rewrite_share_fetch_response(payload + b"\x00", 1, to_proxy)
    with pytest.raises(DecodeError):
        rewrite_share_fetch_response(payload[:-5], 1, to_proxy)
    with pytest.raises(UnsupportedVersion):
        rewrite_share_fetch_response(payload, 3, to_proxy)


def share_acknowledge_v2(endpoints: bytes, n_endpoints: int) -> bytes:
    return b"".join([
        CORR, b"\x00",                       # correlation_id, response header tags
        struct.pack(">ih", 0, 0),            # throttle_time_ms, error_code
        b"\x00",                             # error_message = null
        struct.pack(">i", 15000),            # acquisition_lock_timeout_ms (v2+)
        b"\x02", TOPIC_ID,                   # responses: 1 topic, topic_id
        b"\x02",                             #   partitions: 1
        struct.pack(">ih", 0, 6),            #     partition_index, error_code NOT_LEADER_OR_FOLLOWER
        b"\x00",                             #     error_message = null
        struct.pack(">ii", 3, 9), b"\x00",   #     current_leader 3, epoch 9, tags
        b"\x00",                             #     partition tags
        b"\x00",                             #   topic tags
        bytes([n_endpoints + 1]), endpoints,  # node_endpoints
        b"\x00",                             # top-level tags
    ])


def test_share_acknowledge_v2_golden() -> None:
    before = share_acknowledge_v2(_endpoint(3, b"b3", 9093, None) + _endpoint(1, b"b1", 9091, None), 2)
    new, original = rewrite_share_acknowledge_response(before, 2, to_proxy)
    assert original == [BrokerAddress(3, "b3", 9093), BrokerAddress(1, "b1", 9091)]
    proxy = b"sluice.proxy.example"
    assert new == share_acknowledge_v2(_endpoint(3, proxy, 30003, None) + _endpoint(1, proxy, 30001, None), 2)


def _with_endpoints(api_key: int, api_version: int, data: st.DataObject) -> Any:
    cls = load_response_schema(api_key, api_version)
    body = data.draw(kio_entities(cls))
    endpoint_cls = typing.get_type_hints(cls)["node_endpoints"].__args__[0]
    endpoints = data.draw(st.lists(st.builds(
        endpoint_cls, node_id=st.integers(0, 5), host=st.text(max_size=140),
        port=st.integers(0, 65535), rack=st.none() | st.text(max_size=3)), max_size=3))
    return dataclasses.replace(body, node_endpoints=tuple(endpoints))


@pytest.mark.parametrize(("api_key", "api_version", "rewrite"), [
    (ApiKey.SHARE_FETCH, 1, rewrite_share_fetch_response),
    (ApiKey.SHARE_FETCH, 2, rewrite_share_fetch_response),
    (ApiKey.SHARE_ACKNOWLEDGE, 1, rewrite_share_acknowledge_response),
    (ApiKey.SHARE_ACKNOWLEDGE, 2, rewrite_share_acknowledge_response),
])
@settings(KIO_EXAMPLES, max_examples=15)
@given(data=st.data())
def test_equals_kio_full_rewrite(api_key: int, api_version: int, rewrite: Any, data: st.DataObject) -> None:
    body = _with_endpoints(api_key, api_version, data)
    payload = response_payload(body)
    new, original = rewrite(payload, api_version, to_proxy)
    assert original == [BrokerAddress(e.node_id, e.host, e.port) for e in body.node_endpoints]
    mapped = tuple(dataclasses.replace(e, host="sluice.proxy.example", port=30000 + e.node_id)
                   for e in body.node_endpoints)
    assert new == response_payload(dataclasses.replace(body, node_endpoints=mapped))


def share_fetch_request(version: int, max_bytes: int, min_bytes: int) -> bytes:
    body = b"".join([
        b"\x03g1",                           # group_id = "g1"
        b"\x04mem",                          # member_id = "mem"
        struct.pack(">i", 4),                # share_session_epoch
        struct.pack(">i", 500),              # max_wait_ms
        struct.pack(">i", min_bytes),        # min_bytes
        struct.pack(">i", max_bytes),        # max_bytes
        struct.pack(">ii", 500, 500),        # max_records, batch_size (v1+)
        b"\x00\x00" if version >= 2 else b"",  # share_acquire_mode, is_renew_ack (v2+)
        b"\x01", b"\x01", b"\x00",           # topics = [], forgotten_topics_data = [], tags
    ])
    header = struct.pack(">hhi", ApiKey.SHARE_FETCH, version, 9) + b"\x00\x01c" + b"\x00"  # client "c"
    return header + body


@pytest.mark.parametrize("version", [1, 2])
def test_cap_share_fetch_max_bytes(version: int) -> None:
    payload = share_fetch_request(version, 52428800, 1)
    header = read_request_header(payload)
    capped = cap_share_fetch_max_bytes(payload, header, 1000)
    assert capped == share_fetch_request(version, 1000, 1)
    assert len(changed_offsets(payload, capped)) <= 4  # only max_bytes changed
    assert cap_share_fetch_max_bytes(payload, header, 60000000) is payload
    both = share_fetch_request(version, 5000, 3000)
    assert cap_share_fetch_max_bytes(both, read_request_header(both), 2000) == share_fetch_request(
        version, 2000, 2000)
    renew = share_fetch_request(version, 0, 0)  # KIP-1222 renew-only: must stay 0
    assert cap_share_fetch_max_bytes(renew, read_request_header(renew), 10) is renew


@pytest.mark.parametrize("version", [1, 2])
@settings(KIO_EXAMPLES, max_examples=10)
@given(data=st.data())
def test_cap_share_fetch_equals_kio(version: int, data: st.DataObject) -> None:
    body = data.draw(kio_entities(load_request_schema(ApiKey.SHARE_FETCH, version)))
    payload = encode_request(RequestHeader(ApiKey.SHARE_FETCH, version, 1, "c", 2, 0), body)
    capped = cap_share_fetch_max_bytes(payload, read_request_header(payload), 1000)
    expected = dataclasses.replace(body, max_bytes=min(body.max_bytes, 1000),
                                   min_bytes=min(body.min_bytes, 1000))
    assert capped == encode_request(RequestHeader(ApiKey.SHARE_FETCH, version, 1, "c", 2, 0), expected)


def test_share_fetch_response_partitions_give_records_and_bytes_per_partition() -> None:
    from protocol.share import share_fetch_response_partitions
    from tests.unit.protocol.test_records import kio_batch

    batch = kio_batch(5)
    parts = share_fetch_response_partitions(share_fetch_v1(_endpoint(2, b"b2", 9092, None), 1, batch), 1)
    assert [(p.topic, p.topic_id, p.partition, p.records, p.bytes, p.error_code) for p in parts] == [
        (None, TOPIC_ID, 0, 0, 0, 6), (None, TOPIC_ID, 1, 5, len(batch), 0)]
    with pytest.raises(DecodeError):
        share_fetch_response_partitions(share_fetch_v1(b"", 0, batch)[:-20], 1)
    with pytest.raises(UnsupportedVersion):
        share_fetch_response_partitions(share_fetch_v1(b"", 0, batch), 9)
