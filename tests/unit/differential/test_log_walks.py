"""The access log's Produce walks: the compiled twin (`protocol._log_speedups`) and the readable
reference (`protocol.log_walks`) give the same answers, or raise the same errors, on the same
bytes: kio-built requests and responses of every version, the common shape built by hand (what
the compiled walk reads in C), truncated and padded frames, and random bytes. The topic and records
quotas read the same request walk (`InFlight.produce_parts`): the per-topic usage made from either
twin's answer equals the one made from the reference `records.produce_request_partitions`."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema

from protocol import log_fastpath, log_walks
from protocol._wire import encode_uvarint
from protocol.apis import ApiKey
from protocol.encode import encode_request
from protocol.errors import ProtocolError
from protocol.fastpath import read_request_header
from protocol.headers import RequestHeader
from protocol.records import produce_request_partitions
from proxy.stages.topic_usage import TopicNames, TopicUsage, _usage, produce_usage
from tests.unit.differential.impls import built, outcome
from tests.unit.protocol.kio_support import KIO_EXAMPLES, kio_versions, response_payload
from tests.unit.protocol.test_records import LEGACY, v2_batch, with_record_sets

SETTINGS = settings(max_examples=60, deadline=None)


def compiled() -> Any:
    """protocol._log_speedups."""
    return built(log_fastpath.COMPILED_MODULE, "protocol._log_speedups")


def same_parts(payload: bytes, header: RequestHeader) -> Any:
    fast = outcome(compiled().produce_log_parts, payload, header)
    assert fast == outcome(log_walks.produce_log_parts, payload, header)
    same_usage(payload, header)
    return fast


def reference_usage(payload: bytes, header: RequestHeader) -> TopicUsage | None:
    """The topic and records usage from the reference walk, as the quota stage made it before the
    access log's walk served both."""
    try:
        return _usage(produce_request_partitions(payload, header), TopicNames(), None)
    except (ProtocolError, ValueError):
        return None


def same_usage(payload: bytes, header: RequestHeader) -> None:
    expected = reference_usage(payload, header)
    for walk in (compiled().produce_log_parts, log_walks.produce_log_parts):
        try:
            parts = walk(payload, header)
        except (ProtocolError, ValueError):  # a header that is not a Produce one: never charged
            continue
        assert produce_usage(parts, payload, header, TopicNames()) == expected


def same_summary(payload: bytes, api_version: int) -> Any:
    fast = outcome(compiled().produce_log_summary, payload, api_version)
    assert fast == outcome(log_walks.produce_log_summary, payload, api_version)
    return fast


@pytest.mark.parametrize("api_version", kio_versions(ApiKey.PRODUCE))
@KIO_EXAMPLES
@given(data=st.data())
def test_produce_requests_of_every_kio_version(api_version: int, data: st.DataObject) -> None:
    drawn = data.draw(st.from_type(load_request_schema(ApiKey.PRODUCE, api_version)))
    body, _ = with_record_sets(data, drawn, "topic_data", "partition_data")
    header_version = 2 if api_version >= 9 else 1
    payload = encode_request(RequestHeader(0, api_version, 5, "client", header_version, 0), body)
    header = read_request_header(payload)
    same_parts(payload, header)
    cut = data.draw(st.integers(min_value=header.body_offset, max_value=len(payload)))
    same_parts(payload[:cut], header)          # truncated
    same_parts(payload + b"\x00", header)      # a trailing byte


BATCHES = st.sampled_from([b"", v2_batch(3, b"abc"), v2_batch(40, b"r" * 200), LEGACY,
                           v2_batch(2, b"de") + v2_batch(1, b"f")[:30], v2_batch(16, b"x" * 16_000)])


@pytest.mark.parametrize("api_version", range(9, 14))
@given(transactional=st.one_of(st.none(), st.text(max_size=20)),
       topics=st.lists(st.tuples(st.text(max_size=20), st.lists(
           st.tuples(st.integers(-(2**31), 2**31 - 1), st.one_of(st.none(), BATCHES)), max_size=4)),
           max_size=4))
@SETTINGS
def test_produce_requests_in_the_common_shape(
        api_version: int, transactional: str | None,
        topics: list[tuple[str, list[tuple[int, bytes | None]]]]) -> None:
    """What a modern producer sends (the compiled walk reads it in C), built by hand."""
    body = b"\x00" if transactional is None else _compact(transactional.encode())
    body += struct.pack(">hi", 1, 30_000) + encode_uvarint(len(topics) + 1)
    for name, partitions in topics:
        body += (name.encode()[:16].ljust(16, b"\x00")) if api_version >= 13 else _compact(name.encode())
        body += encode_uvarint(len(partitions) + 1)
        for index, records in partitions:
            body += struct.pack(">i", index)
            body += b"\x00" if records is None else _compact(records)
            body += b"\x00"
        body += b"\x00"
    payload = struct.pack(">hhih", 0, api_version, 7, 3) + b"cli\x00" + body + b"\x00"
    header = read_request_header(payload)
    kind, parts = same_parts(payload, header)
    assert kind == "ok" and parts is not None and len(parts) == sum(len(p) for _, p in topics)
    for cut in (len(payload) - 1, len(payload) // 2, header.body_offset + 1):
        same_parts(payload[:cut], header)


def _compact(raw: bytes) -> bytes:
    return encode_uvarint(len(raw) + 1) + raw


@pytest.mark.parametrize("api_version", kio_versions(ApiKey.PRODUCE))
@KIO_EXAMPLES
@given(data=st.data())
def test_produce_responses_of_every_kio_version(api_version: int, data: st.DataObject) -> None:
    payload = response_payload(data.draw(st.from_type(load_response_schema(ApiKey.PRODUCE, api_version))))
    same_summary(payload, api_version)
    cut = data.draw(st.integers(min_value=0, max_value=len(payload)))
    same_summary(payload[:cut], api_version)
    same_summary(payload + b"\x00", api_version)


@pytest.mark.parametrize("api_version", range(9, 14))
@given(topics=st.lists(st.tuples(st.binary(max_size=12), st.lists(
           st.tuples(st.integers(-1, 2**31 - 1), st.sampled_from([0, 0, 0, 6, 19, 87, -1, 32767])),
           max_size=6)), max_size=4),
       throttle=st.integers(-(2**31), 2**31 - 1))
@SETTINGS
def test_produce_responses_in_the_common_shape(api_version: int, throttle: int,
                                               topics: list[tuple[bytes, list[tuple[int, int]]]]) -> None:
    body = encode_uvarint(len(topics) + 1)
    for name, partitions in topics:
        body += (name[:16].ljust(16, b"\x00")) if api_version >= 13 else _compact(name)
        body += encode_uvarint(len(partitions) + 1)
        for index, error in partitions:
            body += struct.pack(">ihqqq", index, error, 5, -1, 0) + b"\x01\x00\x00"
        body += b"\x00"
    payload = struct.pack(">i", 9) + b"\x00" + body + struct.pack(">i", throttle) + b"\x00"
    kind, (codes, got_throttle) = same_summary(payload, api_version)
    expected = sorted({e for _, parts in topics for _, e in parts if e})
    assert kind == "ok" and list(codes) == expected and got_throttle == throttle
    for cut in (len(payload) - 1, len(payload) // 2, 5):
        same_summary(payload[:cut], api_version)


@pytest.mark.parametrize("api_version", range(3, 9))
@given(transactional=st.one_of(st.none(), st.text(max_size=20)),
       topics=st.lists(st.tuples(st.text(max_size=20), st.lists(
           st.tuples(st.integers(-(2**31), 2**31 - 1), st.one_of(st.none(), BATCHES)), max_size=4)),
           max_size=4))
@SETTINGS
def test_older_produce_requests_in_the_common_shape(
        api_version: int, transactional: str | None,
        topics: list[tuple[str, list[tuple[int, bytes | None]]]]) -> None:
    """What librdkafka and older clients send (v3-v8: int16 and int32 lengths, no tags), by hand."""
    body = struct.pack(">h", -1) if transactional is None else _legacy_string(transactional.encode())
    body += struct.pack(">hi", 1, 30_000) + struct.pack(">i", len(topics))
    for name, partitions in topics:
        body += _legacy_string(name.encode()) + struct.pack(">i", len(partitions))
        for index, record_set in partitions:
            body += struct.pack(">i", index)
            body += (struct.pack(">i", -1) if record_set is None
                     else struct.pack(">i", len(record_set)) + record_set)
    payload = struct.pack(">hhih", 0, api_version, 7, 3) + b"cli" + body
    header = read_request_header(payload)
    kind, parts = same_parts(payload, header)
    assert kind == "ok" and parts is not None and len(parts) == sum(len(p) for _, p in topics)
    for cut in (len(payload) - 1, len(payload) // 2, header.body_offset + 1):
        same_parts(payload[:cut], header)
    same_parts(payload + b"\x00", header)


@pytest.mark.parametrize("api_version", range(1, 9))
@given(topics=st.lists(st.tuples(st.binary(max_size=12), st.lists(
           st.tuples(st.integers(-1, 2**31 - 1), st.sampled_from([0, 0, 0, 6, 19, 87, -1, 32767]),
                     st.one_of(st.none(), st.binary(max_size=8))), max_size=6)), max_size=4),
       throttle=st.integers(-(2**31), 2**31 - 1))
@SETTINGS
def test_older_produce_responses_in_the_common_shape(
        api_version: int, throttle: int,
        topics: list[tuple[bytes, list[tuple[int, int, bytes | None]]]]) -> None:
    body = struct.pack(">i", len(topics))
    for name, partitions in topics:
        body += _legacy_string(name) + struct.pack(">i", len(partitions))
        for index, error, message in partitions:
            body += struct.pack(">ihq", index, error, 5)
            body += struct.pack(">q", -1) if api_version >= 2 else b""
            body += struct.pack(">q", 0) if api_version >= 5 else b""
            if api_version >= 8:
                body += struct.pack(">i", 0)  # no record errors, then the message (or null)
                body += struct.pack(">h", -1) if message is None else _legacy_string(message)
    payload = struct.pack(">i", 9) + body + struct.pack(">i", throttle)
    kind, (codes, got_throttle) = same_summary(payload, api_version)
    expected = sorted({e for _, parts in topics for _, e, _ in parts if e})
    assert kind == "ok" and list(codes) == expected and got_throttle == throttle
    for cut in (len(payload) - 1, len(payload) // 2, 5):
        same_summary(payload[:cut], api_version)


def _legacy_string(raw: bytes) -> bytes:
    return struct.pack(">h", len(raw)) + raw


@given(payload=st.binary(max_size=200), api_version=st.integers(0, 15))
@SETTINGS
def test_random_bytes(payload: bytes, api_version: int) -> None:
    same_summary(payload, api_version)
    frame = struct.pack(">hhih", 0, api_version, 7, 3) + b"cli" + (b"\x00" if api_version >= 9 else b"")
    try:
        header = read_request_header(frame + payload)
    except ProtocolError:  # a header the proxy would have refused before any walk
        return
    same_parts(frame + payload, header)


def test_a_skewed_copy_is_caught() -> None:
    """The comparison can fail: a walk that counts one record too many is told apart."""
    payload = b"".join([struct.pack(">hhih", 0, 9, 7, 3), b"cli\x00", b"\x00", struct.pack(">hi", 1, 1000),
                        b"\x02\x02t\x02", struct.pack(">i", 0), _compact(v2_batch(3, b"abc")),
                        b"\x00\x00\x00"])
    header = read_request_header(payload)
    parts = compiled().produce_log_parts(payload, header)
    assert parts == (("t", None, 0, 3, 64),)
    skewed = tuple((t, i, p, r + 1, b) for t, i, p, r, b in parts)
    assert skewed != log_walks.produce_log_parts(payload, header)
    assert produce_usage(skewed, payload, header, TopicNames()) != reference_usage(payload, header)
