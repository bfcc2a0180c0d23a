"""Address rewrites (Metadata, FindCoordinator, DescribeCluster) and ApiVersions capping.

The oracle for every version kio knows is kio's full rewrite: decode, replace the addresses (or
versions), encode. The splice must give exactly the same bytes, and keep unknown tagged fields.
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
import typing
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import response as metadata_v12

from protocol import (
    PARSEABLE_MAX_VERSIONS,
    ApiKey,
    BrokerAddress,
    DecodeError,
    EncodeError,
    RequestHeader,
    UnsupportedVersion,
    cap_api_versions_response,
    decode_response_body,
    encode_request,
    read_api_versions_request_client_software,
    read_request_header,
    rewrite_describe_cluster_response,
    rewrite_fetch_response_node_endpoints,
    rewrite_find_coordinator_response,
    rewrite_metadata_response,
    rewrite_produce_response_node_endpoints,
)
from protocol.rewrite import node_endpoints_absent
from tests.unit.protocol.kio_support import (
    KIO_EXAMPLES,
    changed_offsets,
    kio_entities,
    kio_versions,
    response_payload,
)

CORR = struct.pack(">i", 0x01020304)


def to_proxy(address: BrokerAddress) -> BrokerAddress:
    return BrokerAddress(address.node_id, "sluice.proxy.example", 30000 + address.node_id % 1000)


def kio_map(entity: Any, id_field: str, mapper: Callable[[BrokerAddress], BrokerAddress]) -> Any:
    node_id = getattr(entity, id_field)
    if node_id < 0:  # not a broker (FindCoordinator's "no coordinator" entry): left alone
        return entity
    mapped = mapper(BrokerAddress(node_id, entity.host, entity.port))
    return dataclasses.replace(entity, **{id_field: mapped.node_id, "host": mapped.host, "port": mapped.port})


def addresses(entities: Any, id_field: str) -> list[BrokerAddress]:
    return [BrokerAddress(getattr(e, id_field), e.host, e.port)
            for e in entities if getattr(e, id_field) >= 0]


# --- Metadata -------------------------------------------------------------------------------------


def test_metadata_v0_golden() -> None:
    topics = b"".join([
        struct.pack(">i", 1),              # topics: 1
        struct.pack(">h", 0),              #   error_code
        struct.pack(">h", 1), b"t",        #   name = "t"
        struct.pack(">i", 0),              #   partitions = []
    ])
    payload = b"".join([
        CORR,                              # correlation_id
        struct.pack(">i", 2),              # brokers: 2 (no throttle_time_ms before v3)
        struct.pack(">i", 1),              #   node_id = 1
        struct.pack(">h", 2), b"b1",       #   host = "b1"
        struct.pack(">i", 9092),           #   port
        struct.pack(">i", 2),              #   node_id = 2
        struct.pack(">h", 2), b"b2",       #   host = "b2"
        struct.pack(">i", 9093),           #   port
        topics,
    ])
    new, original = rewrite_metadata_response(payload, 0, to_proxy)
    assert original == [BrokerAddress(1, "b1", 9092), BrokerAddress(2, "b2", 9093)]
    assert new == b"".join([
        CORR,
        struct.pack(">i", 2),
        struct.pack(">i", 1), struct.pack(">h", 20), b"sluice.proxy.example", struct.pack(">i", 30001),
        struct.pack(">i", 2), struct.pack(">h", 20), b"sluice.proxy.example", struct.pack(">i", 30002),
        topics,                            # copied unchanged
    ])


def test_metadata_v12_keeps_unknown_tags() -> None:
    def payload(host: bytes, port: int) -> bytes:
        return b"".join([
            CORR, b"\x01\x05\x01Z",            # correlation_id; header tags: tag 5 (unknown), 1 byte
            struct.pack(">i", 0),              # throttle_time_ms
            b"\x02",                           # brokers: 1
            struct.pack(">i", 3),              #   node_id
            bytes([len(host) + 1]), host,      #   host (compact string)
            struct.pack(">i", port),           #   port
            b"\x05rack",                       #   rack = "rack"
            b"\x01\x09\x02ok",                 #   tags: tag 9 (unknown), 2 bytes
            b"\x00",                           # cluster_id = null
            struct.pack(">i", 3),              # controller_id
            b"\x01",                           # topics = []
            struct.pack(">i", -2147483648),    # cluster_authorized_operations
            b"\x01\x04\x00",                   # tags: tag 4 (unknown), empty
        ])

    new, original = rewrite_metadata_response(payload(b"kafka-3", 9092), 12, to_proxy)
    assert original == [BrokerAddress(3, "kafka-3", 9092)]
    assert new == payload(b"sluice.proxy.example", 30003)
    with pytest.raises(DecodeError):  # what a kio full rewrite would hit
        decode_response_body(new, ApiKey.METADATA, 12)


@pytest.mark.parametrize("api_version", kio_versions(ApiKey.METADATA))
@settings(KIO_EXAMPLES, max_examples=6)  # Metadata entities are big: generation dominates
@given(data=st.data())
def test_metadata_equals_kio_full_rewrite(api_version: int, data: st.DataObject) -> None:
    body = data.draw(kio_entities(load_response_schema(ApiKey.METADATA, api_version)))
    payload = response_payload(body)
    new, original = rewrite_metadata_response(payload, api_version, to_proxy)
    assert original == addresses(body.brokers, "node_id")
    expected = dataclasses.replace(body, brokers=tuple(kio_map(b, "node_id", to_proxy) for b in body.brokers))
    assert new == response_payload(expected)


def big_metadata(partitions: int) -> Any:
    brokers = tuple(metadata_v12.MetadataResponseBroker(node_id=i, host=f"kafka-{i}.internal", port=9092,
                                                        rack=f"rack-{i % 3}") for i in range(3))
    parts = tuple(metadata_v12.MetadataResponsePartition(
        error_code=ErrorCode.none, partition_index=p, leader_id=p % 3, leader_epoch=7,
        replica_nodes=(p % 3, (p + 1) % 3, (p + 2) % 3), isr_nodes=(p % 3, (p + 1) % 3),
        offline_replicas=()) for p in range(partitions))
    topic = metadata_v12.MetadataResponseTopic(error_code=ErrorCode.none, name="events", topic_id=None,
                                               is_internal=False, partitions=parts)
    return metadata_v12.MetadataResponse(throttle_time=datetime.timedelta(0), brokers=brokers,
                                         cluster_id="c", controller_id=1, topics=(topic,))


def test_metadata_10k_partitions_splice_is_exact_and_reads_only_the_brokers() -> None:
    body = big_metadata(10_000)
    payload = response_payload(body)
    decoded = decode_response_body(payload, ApiKey.METADATA, 12)
    expected = response_payload(dataclasses.replace(
        decoded, brokers=tuple(kio_map(b, "node_id", to_proxy) for b in decoded.brokers)))
    assert rewrite_metadata_response(payload, 12, to_proxy)[0] == expected
    # Cheap because the 10,000 partitions after the brokers are copied, never walked: garbage there
    # (no longer decodable by kio) passes through unchanged. (Its speed is measured in bench_protocol.)
    half = len(payload) // 2
    garbled = payload[:half] + bytes(b ^ 0xA5 for b in payload[half:])
    spliced, _ = rewrite_metadata_response(garbled, 12, to_proxy)
    assert spliced[len(spliced) - (len(payload) - half):] == garbled[half:]
    assert spliced[:len(spliced) - (len(payload) - half)] == expected[:len(expected) - (len(payload) - half)]


# --- FindCoordinator ------------------------------------------------------------------------------


def test_find_coordinator_v0_golden() -> None:
    payload = b"".join([
        CORR,                              # correlation_id
        struct.pack(">h", 0),              # error_code (no throttle_time_ms in v0)
        struct.pack(">i", 2),              # node_id
        struct.pack(">h", 2), b"b2",       # host
        struct.pack(">i", 9092),           # port
    ])
    new, original = rewrite_find_coordinator_response(payload, 0, to_proxy)
    assert original == [BrokerAddress(2, "b2", 9092)]
    assert new == CORR + struct.pack(">hih", 0, 2, 20) + b"sluice.proxy.example" + struct.pack(">i", 30002)


def test_find_coordinator_v4_skips_failed_lookups() -> None:
    def coordinator(key: bytes, node_id: int, host: bytes, port: int, error: int) -> bytes:
        return b"".join([
            bytes([len(key) + 1]), key,    # key (compact string)
            struct.pack(">i", node_id),    # node_id
            bytes([len(host) + 1]), host,  # host
            struct.pack(">i", port),       # port
            struct.pack(">h", error),      # error_code
            b"\x00",                       # error_message = null
            b"\x00",                       # tags
        ])
    failed = coordinator(b"g2", -1, b"", -1, 15)  # COORDINATOR_NOT_AVAILABLE
    prefix = CORR + b"\x00" + struct.pack(">i", 0) + b"\x03"  # header tags, throttle, 2 coordinators
    payload = prefix + coordinator(b"g1", 1, b"b1", 9092, 0) + failed + b"\x00"
    new, original = rewrite_find_coordinator_response(payload, 4, to_proxy)
    assert original == [BrokerAddress(1, "b1", 9092)]
    assert new == prefix + coordinator(b"g1", 1, b"sluice.proxy.example", 30001, 0) + failed + b"\x00"


@pytest.mark.parametrize("api_version", kio_versions(ApiKey.FIND_COORDINATOR))
@KIO_EXAMPLES
@given(data=st.data())
def test_find_coordinator_equals_kio_full_rewrite(api_version: int, data: st.DataObject) -> None:
    body = data.draw(kio_entities(load_response_schema(ApiKey.FIND_COORDINATOR, api_version)))
    payload = response_payload(body)
    new, original = rewrite_find_coordinator_response(payload, api_version, to_proxy)
    if api_version <= 3:
        assert original == addresses([body], "node_id")
        expected = kio_map(body, "node_id", to_proxy)
    else:
        assert original == addresses(body.coordinators, "node_id")
        expected = dataclasses.replace(
            body, coordinators=tuple(kio_map(c, "node_id", to_proxy) for c in body.coordinators))
    assert new == response_payload(expected)


# --- DescribeCluster ------------------------------------------------------------------------------


@pytest.mark.parametrize("api_version", kio_versions(ApiKey.DESCRIBE_CLUSTER))
@KIO_EXAMPLES
@given(data=st.data())
def test_describe_cluster_equals_kio_full_rewrite(api_version: int, data: st.DataObject) -> None:
    body = data.draw(kio_entities(load_response_schema(ApiKey.DESCRIBE_CLUSTER, api_version)))
    payload = response_payload(body)
    new, original = rewrite_describe_cluster_response(payload, api_version, to_proxy)
    assert original == addresses(body.brokers, "broker_id")
    expected = dataclasses.replace(
        body, brokers=tuple(kio_map(b, "broker_id", to_proxy) for b in body.brokers))
    assert new == response_payload(expected)


def test_describe_cluster_v2_golden() -> None:
    def payload(host: bytes, port: int) -> bytes:
        return b"".join([
            CORR, b"\x00",                  # correlation_id, header tags
            struct.pack(">i", 0),           # throttle_time_ms
            struct.pack(">h", 0),           # error_code
            b"\x00",                        # error_message = null
            struct.pack(">b", 1),           # endpoint_type = brokers (v1+)
            b"\x02c",                       # cluster_id = "c"
            struct.pack(">i", 1),           # controller_id
            b"\x02",                        # brokers: 1
            struct.pack(">i", 1),           #   broker_id
            bytes([len(host) + 1]), host,   #   host
            struct.pack(">i", port),        #   port
            b"\x00",                        #   rack = null
            b"\x01",                        #   is_fenced = true (v2+)
            b"\x00",                        #   tags
            struct.pack(">i", -2147483648), # cluster_authorized_operations
            b"\x00",                        # tags
        ])
    new, original = rewrite_describe_cluster_response(payload(b"b1", 9092), 2, to_proxy)
    assert (new, original) == (payload(b"sluice.proxy.example", 30001), [BrokerAddress(1, "b1", 9092)])


# --- Errors ---------------------------------------------------------------------------------------


def test_truncation_at_every_cut_is_a_decode_error() -> None:
    payload = response_payload(big_metadata(1))
    brokers_end = payload.index(b"\x02c" + struct.pack(">i", 1))  # cluster_id "c", controller_id 1
    for cut in range(brokers_end):
        with pytest.raises(DecodeError):
            rewrite_metadata_response(payload[:cut], 12, to_proxy)
    # past the brokers array nothing is parsed: the rest is copied as it is
    assert rewrite_metadata_response(payload[:brokers_end], 12, to_proxy)[1] == addresses(
        big_metadata(1).brokers, "node_id")


@pytest.mark.parametrize(("rewrite", "api_version"), [
    (rewrite_metadata_response, 14),
    (rewrite_find_coordinator_response, 7),
    (rewrite_describe_cluster_response, 3),
    (rewrite_metadata_response, -1),
])
def test_unverified_versions_are_refused(rewrite: Any, api_version: int) -> None:
    with pytest.raises(UnsupportedVersion):
        rewrite(CORR + b"\x00" * 32, api_version, to_proxy)


def test_null_host_and_hostile_count() -> None:
    null_host = CORR + struct.pack(">iih", 1, 1, -1) + struct.pack(">i", 9092)  # v0, host = null
    with pytest.raises(DecodeError, match="null host"):
        rewrite_metadata_response(null_host, 0, to_proxy)
    hostile = CORR + struct.pack(">i", 2**31 - 1)  # 2 billion brokers announced
    with pytest.raises(DecodeError, match="cannot fit"):
        rewrite_metadata_response(hostile, 0, to_proxy)


def test_unencodable_mapped_address() -> None:
    payload = CORR + struct.pack(">iih", 1, 1, 1) + b"b" + struct.pack(">ii", 9092, 0)  # v0, no topics
    with pytest.raises(EncodeError):
        rewrite_metadata_response(payload, 0, lambda a: BrokerAddress(a.node_id, "h" * 40000, 1))
    with pytest.raises(EncodeError):
        rewrite_metadata_response(payload, 0, lambda a: BrokerAddress(a.node_id, "h", 2**31))
    with pytest.raises(EncodeError):
        rewrite_metadata_response(payload, 0, lambda a: BrokerAddress(a.node_id, "\udc80", 1))


# --- ApiVersions ----------------------------------------------------------------------------------


def api_versions_v2(entries: list[tuple[int, int, int]], error_code: int = 0) -> bytes:
    return b"".join([
        CORR,                                          # correlation_id (header v0 always)
        struct.pack(">h", error_code),                 # error_code
        struct.pack(">i", len(entries)),               # api_keys
        *(struct.pack(">hhh", *e) for e in entries),   #   api_key, min_version, max_version
        struct.pack(">i", 0),                          # throttle_time_ms
    ])


def test_cap_in_place_v2() -> None:
    payload = api_versions_v2([(0, 3, 13), (1, 4, 18), (3, 0, 13), (18, 0, 4)])
    capped = cap_api_versions_response(payload, 2, {0: 11, 1: 20, 18: 4})
    assert capped == api_versions_v2([(0, 3, 11), (1, 4, 18), (3, 0, 13), (18, 0, 4)])
    assert changed_offsets(payload, capped) == [15]  # low byte of Produce's max_version


def test_cap_never_raises_and_unchanged_is_same_object() -> None:
    payload = api_versions_v2([(0, 3, 13)])
    assert cap_api_versions_response(payload, 2, {0: 13, 1: 0}) is payload
    assert cap_api_versions_response(payload, 2, {0: 99}) is payload


def test_cap_below_min_drops_the_api() -> None:
    payload = api_versions_v2([(0, 3, 13), (1, 4, 18), (3, 0, 13)])
    assert cap_api_versions_response(payload, 2, {1: 3, 0: 9}) == api_versions_v2([(0, 3, 9), (3, 0, 13)])


def test_cap_v3_flexible_with_entry_tags() -> None:
    def payload(entries: list[bytes]) -> bytes:
        return b"".join([
            CORR,                                       # correlation_id (header v0 even in v3)
            struct.pack(">h", 0),                       # error_code
            bytes([len(entries) + 1]),                  # api_keys (compact length)
            *entries,
            struct.pack(">i", 0),                       # throttle_time_ms
            b"\x01\x03\x01\x01",                        # tags: zk_migration_ready = true
        ])
    produce = struct.pack(">hhh", 0, 3, 13) + b"\x01\x06\x01Z"   # with an unknown tag 6
    fetch = struct.pack(">hhh", 1, 4, 18) + b"\x00"
    metadata = struct.pack(">hhh", 3, 0, 13) + b"\x00"
    capped = cap_api_versions_response(payload([produce, fetch, metadata]), 3, {0: 12, 1: 2})
    assert capped == payload([struct.pack(">hhh", 0, 3, 12) + b"\x01\x06\x01Z", metadata])


def test_cap_leaves_errors_and_v0_fallback_alone() -> None:
    v0_format = api_versions_v2([(18, 0, 4)], error_code=35)[:-4]  # UNSUPPORTED_VERSION, no throttle
    assert cap_api_versions_response(v0_format, 4, {18: 2}) is v0_format
    assert cap_api_versions_response(v0_format, 5, {18: 2}) is v0_format  # a future client's v5
    failed = api_versions_v2([(0, 3, 13)], error_code=42)
    assert cap_api_versions_response(failed, 2, {0: 5}) is failed


@pytest.mark.parametrize("api_version", kio_versions(ApiKey.API_VERSIONS))
@KIO_EXAMPLES
@given(
    data=st.data(),
    entries=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 15), st.integers(0, 20)), max_size=12),
    caps=st.dictionaries(st.integers(0, 12), st.integers(-1, 20), max_size=10),
)
def test_cap_equals_kio_full_rewrite(
    api_version: int, data: st.DataObject, entries: list[tuple[int, int, int]], caps: dict[int, int]
) -> None:
    cls = load_response_schema(ApiKey.API_VERSIONS, api_version)
    entry_cls = typing.get_type_hints(cls)["api_keys"].__args__[0]
    body = data.draw(kio_entities(cls))
    body = dataclasses.replace(
        body,
        error_code=ErrorCode.none if data.draw(st.booleans()) else body.error_code,
        api_keys=tuple(entry_cls(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in entries),
    )
    payload = response_payload(body)
    capped = cap_api_versions_response(payload, api_version, caps)
    if body.error_code != ErrorCode.none:
        assert capped is payload
        return
    kept = []
    for entry in body.api_keys:
        cap = caps.get(entry.api_key)
        if cap is None or entry.max_version <= cap:
            kept.append(entry)
        elif cap >= entry.min_version:
            kept.append(dataclasses.replace(entry, max_version=cap))
    assert capped == response_payload(dataclasses.replace(body, api_keys=tuple(kept)))


def test_cap_with_parseable_max_versions() -> None:
    payload = api_versions_v2([(0, 3, 14), (1, 4, 19), (3, 0, 14), (18, 0, 5), (19, 2, 9)])
    capped = cap_api_versions_response(payload, 2, PARSEABLE_MAX_VERSIONS)
    assert capped == api_versions_v2([(0, 3, 13), (1, 4, 18), (3, 0, 13), (18, 0, 4), (19, 2, 9)])


def test_parseable_max_versions_match_kio() -> None:
    for api_key, max_version in PARSEABLE_MAX_VERSIONS.items():
        assert max_version == max(kio_versions(api_key)), api_key


def test_cap_errors() -> None:
    with pytest.raises(UnsupportedVersion):
        cap_api_versions_response(api_versions_v2([]), 5, {})
    with pytest.raises(DecodeError):
        cap_api_versions_response(api_versions_v2([(0, 3, 13)])[:12], 2, {0: 1})
    with pytest.raises(DecodeError):
        cap_api_versions_response(CORR + b"\x00", 2, {})


# --- ApiVersions request: client software ---------------------------------------------------------


def test_client_software_v3_golden() -> None:
    payload = b"".join([
        struct.pack(">hhi", 18, 3, 1),          # api_key = ApiVersions, api_version = 3, correlation_id
        struct.pack(">h", 3), b"cli",           # client_id = "cli"
        b"\x00",                                # header tags
        b"\x12", b"apache-kafka-java",          # client_software_name (compact: 17 + 1)
        b"\x06", b"4.3.1",                      # client_software_version (compact: 5 + 1)
        b"\x00",                                # tags
    ])
    header = read_request_header(payload)
    assert read_api_versions_request_client_software(payload, header) == ("apache-kafka-java", "4.3.1")


def test_client_software_before_v3() -> None:
    payload = struct.pack(">hhih", 18, 2, 1, -1)
    assert read_api_versions_request_client_software(payload, read_request_header(payload)) == (None, None)


@pytest.mark.parametrize("api_version", [3, 4])
@KIO_EXAMPLES
@given(data=st.data())
def test_client_software_every_kio_version(api_version: int, data: st.DataObject) -> None:
    body = data.draw(kio_entities(load_request_schema(ApiKey.API_VERSIONS, api_version)))
    payload = encode_request(RequestHeader(18, api_version, 1, "c", 2, 0), body)
    assert read_api_versions_request_client_software(payload, read_request_header(payload)) == (
        body.client_software_name, body.client_software_version)


def test_client_software_errors() -> None:
    truncated = struct.pack(">hhih", 18, 3, 1, -1) + b"\x00" + b"\x05ab"
    with pytest.raises(DecodeError, match="client_software_name"):
        read_api_versions_request_client_software(truncated, read_request_header(truncated))
    future = struct.pack(">hhih", 18, 5, 1, -1) + b"\x00\x01\x01\x00"
    with pytest.raises(UnsupportedVersion):
        read_api_versions_request_client_software(future, read_request_header(future))


# --- KIP-951 leader endpoints in Produce v10+ / Fetch v16+ ---------------------------------------


def body_with_endpoints(api_key: int, api_version: int, data: st.DataObject) -> Any:
    cls = load_response_schema(api_key, api_version)
    body = data.draw(kio_entities(cls))
    endpoint_cls = typing.get_type_hints(cls)["node_endpoints"].__args__[0]
    endpoints = data.draw(st.lists(st.builds(
        endpoint_cls, node_id=st.integers(-1, 5), host=st.text(max_size=140),
        port=st.integers(0, 65535), rack=st.none() | st.text(max_size=3)), max_size=3))
    return dataclasses.replace(body, node_endpoints=tuple(endpoints))


@pytest.mark.parametrize(("api_key", "api_version", "rewrite"), [
    *[(ApiKey.PRODUCE, v, rewrite_produce_response_node_endpoints) for v in (10, 11, 12, 13)],
    *[(ApiKey.FETCH, v, rewrite_fetch_response_node_endpoints) for v in (16, 17, 18)],
])
@settings(KIO_EXAMPLES, max_examples=10)
@given(data=st.data())
def test_node_endpoints_equal_kio_full_rewrite(
    api_key: int, api_version: int, rewrite: Any, data: st.DataObject
) -> None:
    body = body_with_endpoints(api_key, api_version, data)
    payload = response_payload(body)
    new, original = rewrite(payload, api_version, to_proxy)
    assert original == addresses(body.node_endpoints, "node_id")
    if not body.node_endpoints:
        assert new is payload
    expected = dataclasses.replace(
        body, node_endpoints=tuple(kio_map(e, "node_id", to_proxy) for e in body.node_endpoints))
    assert new == response_payload(expected)


@pytest.mark.parametrize(("api_key", "api_version"), [
    *[(ApiKey.PRODUCE, v) for v in (10, 11, 12, 13)], *[(ApiKey.FETCH, v) for v in (16, 17, 18)]])
@settings(KIO_EXAMPLES, max_examples=10)
@given(data=st.data())
def test_node_endpoints_absent_says_when_the_rewrite_has_nothing_to_map(
    api_key: int, api_version: int, data: st.DataObject
) -> None:
    body = body_with_endpoints(api_key, api_version, data)
    payload = response_payload(body)
    assert node_endpoints_absent(payload, api_key, api_version) is (not body.node_endpoints)
    cut = data.draw(st.integers(0, len(payload) - 1))
    assert node_endpoints_absent(payload[:cut], api_key, api_version) is False  # the rewrite reports it
    assert node_endpoints_absent(payload + b"\x00", api_key, api_version) is False


def test_node_endpoints_absent_is_false_before_kip_951_and_for_other_apis() -> None:
    produce = CORR + b"\x00" + b"\x01" + struct.pack(">i", 0) + b"\x00"  # no topics, throttle, no tags
    assert node_endpoints_absent(produce, ApiKey.PRODUCE, 10) is True
    assert node_endpoints_absent(produce, ApiKey.PRODUCE, 9) is False   # the stage never asks: no tag 0
    assert node_endpoints_absent(produce, ApiKey.PRODUCE, 14) is False  # a layout not verified
    assert node_endpoints_absent(produce, ApiKey.METADATA, 12) is False
    fetch = CORR + b"\x00" + struct.pack(">ihi", 0, 0, 0) + b"\x01" + b"\x00"
    assert node_endpoints_absent(fetch, ApiKey.FETCH, 16) is True
    assert node_endpoints_absent(fetch, ApiKey.FETCH, 15) is False


def test_produce_node_endpoints_golden_with_other_tags() -> None:
    def payload(host: bytes, port: int) -> bytes:
        endpoint = b"".join([
            b"\x02",                        # node_endpoints: 1
            struct.pack(">i", 2),           #   node_id
            bytes([len(host) + 1]), host,   #   host
            struct.pack(">i", port),        #   port
            b"\x00",                        #   rack = null
            b"\x00",                        #   tags
        ])
        return b"".join([
            CORR, b"\x00",                  # correlation_id, header tags
            b"\x01",                        # responses = []
            struct.pack(">i", 0),           # throttle_time_ms
            b"\x03",                        # tagged fields: 3
            b"\x00", bytes([len(endpoint)]), endpoint,  # tag 0: node_endpoints
            b"\x05\x01Z",                   # tag 5 (unknown), 1 byte: kept
            b"\x09\x00",                    # tag 9 (unknown), empty: kept
        ])
    new, original = rewrite_produce_response_node_endpoints(payload(b"b2", 9092), 10, to_proxy)
    assert original == [BrokerAddress(2, "b2", 9092)]
    assert new == payload(b"sluice.proxy.example", 30002)  # the tag's size grows with the host


def test_node_endpoints_absent_or_before_kip_951() -> None:
    produce_v9 = CORR + b"\x00" + b"\x01" + struct.pack(">i", 0) + b"\x00"
    assert rewrite_produce_response_node_endpoints(produce_v9, 9, to_proxy) == (produce_v9, [])
    assert rewrite_produce_response_node_endpoints(produce_v9, 10, to_proxy) == (produce_v9, [])
    fetch_v16 = CORR + b"\x00" + struct.pack(">ihi", 0, 0, 0) + b"\x01" + b"\x00"
    assert rewrite_fetch_response_node_endpoints(fetch_v16, 16, to_proxy)[0] is fetch_v16
    with pytest.raises(DecodeError, match="trailing"):
        rewrite_fetch_response_node_endpoints(fetch_v16 + b"\x00", 16, to_proxy)
    with pytest.raises(UnsupportedVersion):
        rewrite_fetch_response_node_endpoints(fetch_v16, 19, to_proxy)


def test_fetch_of_idle_partitions_is_walked_to_its_tags() -> None:
    """A full fetch answered for three partitions that hold nothing: each partition is the smallest
    one can be (37 bytes), and the walk must not take the three for more than the bytes left."""
    idle_partition = (
        struct.pack(">ih", 0, 0)          # partition_index 0, error_code 0
        + struct.pack(">qqq", 5, 5, 0)    # high_watermark, last_stable_offset, log_start_offset
        + b"\x01"                         # aborted_transactions: compact array of 0
        + struct.pack(">i", -1)           # preferred_read_replica: none
        + b"\x01"                         # records: compact bytes of length 0
        + b"\x00"                         # partition tags: none
    )
    assert len(idle_partition) == 37
    fetch_v17 = (
        CORR + b"\x00"                    # correlation id, response header tags
        + struct.pack(">ihi", 0, 0, 7)    # throttle_time_ms, error_code, session_id
        + b"\x02"                         # responses: compact array of 1
        + bytes(range(16))                # topic_id
        + b"\x04"                         # partitions: compact array of 3
        + idle_partition * 3
        + b"\x00"                         # topic tags
        + b"\x00"                         # top-level tags: no node_endpoints
    )
    assert rewrite_fetch_response_node_endpoints(fetch_v17, 17, to_proxy) == (fetch_v17, [])
