"""Fetch v16+ while streaming: the tag section is found chunk by chunk and rewritten to its length."""

from __future__ import annotations

import dataclasses
import struct
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_response_schema

from protocol._wire import encode_uvarint, read_uvarint
from protocol.apis import ApiKey
from protocol.errors import DecodeError
from protocol.fetch_tail import PADDING_TAG, FetchTailFinder, _read_tags, fit_tail
from protocol.rewrite import BrokerAddress, _fetch_top_level_tags_offset
from tests.unit.protocol.kio_support import KIO_EXAMPLES, kio_entities, response_payload

CORR = struct.pack(">i", 7)
TOPIC_ID = bytes(range(16))


def short_host(address: BrokerAddress) -> BrokerAddress:
    return BrokerAddress(address.node_id, "s", 40000 + address.node_id)


def long_host(address: BrokerAddress) -> BrokerAddress:
    return BrokerAddress(address.node_id, "sluice-listener.proxy.example.com", 40000 + address.node_id)


def endpoint(node_id: int, host: bytes, port: int) -> bytes:
    return b"".join([
        struct.pack(">i", node_id),          # node_id
        encode_uvarint(len(host) + 1), host,  # host
        struct.pack(">i", port),             # port
        b"\x00",                             # rack = null
        b"\x00",                             # tags
    ])


def tags_with_endpoint(host: bytes, port: int) -> bytes:
    data = b"\x02" + endpoint(2, host, port)  # node_endpoints: 1 entry
    return b"\x01" + b"\x00" + encode_uvarint(len(data)) + data  # 1 field: tag 0, size, data


def fetch_v16(records: bytes, tags: bytes) -> bytes:
    return b"".join([
        CORR, b"\x00",                       # correlation_id, response header tags
        struct.pack(">ihi", 0, 0, 77),       # throttle_time_ms, error_code, session_id
        b"\x02", TOPIC_ID,                   # responses: 1 topic, topic_id (v13+)
        b"\x03",                             #   partitions: 2
        struct.pack(">ih", 0, 6),            #     partition_index 0, error NOT_LEADER_OR_FOLLOWER
        struct.pack(">qqq", -1, -1, -1),     #     high_watermark, last_stable_offset, log_start_offset
        b"\x01",                             #     aborted_transactions = []
        struct.pack(">i", -1),               #     preferred_read_replica
        b"\x01",                             #     records = empty
        b"\x00",                             #     partition tags
        struct.pack(">ih", 1, 0),            #     partition_index 1, error 0
        struct.pack(">qqq", 9, 9, 0),        #     high_watermark, last_stable_offset, log_start_offset
        b"\x02", struct.pack(">qq", 5, 3), b"\x00",  # aborted_transactions: 1 (producer, offset, tags)
        struct.pack(">i", -1),               #     preferred_read_replica
        bytes([(len(records) + 1) & 0x7F | 0x80, (len(records) + 1) >> 7]), records,  # records
        b"\x00",                             #     partition tags
        b"\x00",                             #   topic tags
        tags,                                # top-level tags
    ])


RECORDS = bytes(range(256)) * 40  # 10 KiB, contains every byte value, including tag-like ones


def stream(payload: bytes, chunk: int) -> tuple[bytes, FetchTailFinder]:
    finder = FetchTailFinder(16)
    forwarded = bytearray()
    for at in range(0, len(payload), chunk):
        part = payload[at:at + chunk]
        n = finder.feed(part)
        forwarded += part[:n]
    return bytes(forwarded), finder


@pytest.mark.parametrize("chunk", [1, 3, 64, 255, 4096, 1 << 20])
def test_finder_holds_back_exactly_the_tag_section(chunk: int) -> None:
    tags = tags_with_endpoint(b"broker-2.internal", 9092)
    payload = fetch_v16(RECORDS, tags)
    forwarded, finder = stream(payload, chunk)
    assert finder.found
    assert bytes(finder.tail) == tags
    assert forwarded == payload[:-len(tags)]


def test_many_aborted_transactions_stream_in_steps_that_do_not_grow_with_the_response() -> None:
    """A read_committed fetch can carry thousands of aborted transactions. Each is its own parse
    step, so what the finder buffers between chunks stays a few bytes: when the whole partition
    header was one step, it was buffered and re-parsed from its start at every chunk (quadratic:
    50,000 aborted transactions in 1,448-byte chunks took 2.6 s of CPU; found by fuzzing)."""
    n_aborted = 10_000
    # every tenth aborted transaction carries a tag section of 50 empty fields (each a step too)
    many_tags = encode_uvarint(50) + b"".join(encode_uvarint(100 + i) + b"\x00" for i in range(50))
    aborted = b"".join(struct.pack(">qq", 5, offset) + (many_tags if offset % 10 == 0 else b"\x00")
                       for offset in range(n_aborted))
    tags = tags_with_endpoint(b"broker-2.internal", 9092)
    payload = b"".join([
        CORR, b"\x00",                       # correlation_id, response header tags
        struct.pack(">ihi", 0, 0, 77),       # throttle_time_ms, error_code, session_id
        b"\x02", TOPIC_ID,                   # responses: 1 topic, topic_id (v13+)
        b"\x02",                             #   partitions: 1
        struct.pack(">ih", 0, 0),            #     partition_index 0, error 0
        struct.pack(">qqq", 9, 9, 0),        #     high_watermark, last_stable_offset, log_start_offset
        encode_uvarint(n_aborted + 1), aborted,  # aborted_transactions: 10,000 (producer, offset, tags)
        struct.pack(">i", -1),               #     preferred_read_replica
        b"\x01",                             #     records = empty
        b"\x00",                             #     partition tags
        b"\x00",                             #   topic tags
        tags,                                # top-level tags
    ])
    finder, most_buffered, forwarded = FetchTailFinder(16), 0, 0
    for at in range(0, len(payload), 1448):  # one Ethernet MSS per read
        forwarded += finder.feed(payload[at:at + 1448])
        most_buffered = max(most_buffered, len(finder._buf))
    assert finder.found and bytes(finder.tail) == tags
    assert forwarded == len(payload) - len(tags)
    assert most_buffered < 64  # one aborted transaction is 17 bytes; the old single step was 170,000


@pytest.mark.parametrize("where", ["header", "partition", "topic"])
def test_tagged_field_data_passes_through_without_being_buffered(where: str) -> None:
    """Tagged fields before the top-level section (response header, partition, topic) are read
    field by field, and a field's data passes through like records: a 100,000-byte unknown field
    is neither held nor re-parsed at every chunk (nor refused as a step over the 64 KiB limit)."""
    big = b"\x01" + encode_uvarint(40) + encode_uvarint(100_000) + bytes(100_000)  # 1 field: tag 40
    tags = tags_with_endpoint(b"broker-2.internal", 9092)
    payload = b"".join([
        CORR, big if where == "header" else b"\x00",    # correlation_id, response header tags
        struct.pack(">ihi", 0, 0, 77),       # throttle_time_ms, error_code, session_id
        b"\x02", TOPIC_ID,                   # responses: 1 topic, topic_id (v13+)
        b"\x02",                             #   partitions: 1
        struct.pack(">ih", 0, 0),            #     partition_index 0, error 0
        struct.pack(">qqq", 9, 9, 0),        #     high_watermark, last_stable_offset, log_start_offset
        b"\x01",                             #     aborted_transactions = []
        struct.pack(">i", -1),               #     preferred_read_replica
        b"\x01",                             #     records = empty
        big if where == "partition" else b"\x00",       # partition tags
        big if where == "topic" else b"\x00",           # topic tags
        tags,                                # top-level tags
    ])
    finder, most_buffered, forwarded = FetchTailFinder(16), 0, 0
    for at in range(0, len(payload), 1448):
        forwarded += finder.feed(payload[at:at + 1448])
        most_buffered = max(most_buffered, len(finder._buf))
    assert finder.found and bytes(finder.tail) == tags
    assert forwarded == len(payload) - len(tags)
    assert most_buffered < 64


def test_fit_tail_shorter_host_is_padded_to_the_same_length() -> None:
    tags = tags_with_endpoint(b"broker-2.internal", 9092)
    new, original, kept = fit_tail(tags, short_host)
    assert (original, kept) == ([BrokerAddress(2, "broker-2.internal", 9092)], True)
    assert len(new) == len(tags)
    mapped = tags_with_endpoint(b"s", 40002)
    pad = len(tags) - len(mapped)  # 16 bytes: 1 tag + 1 size + 14 zero bytes
    data = b"\x02" + endpoint(2, b"s", 40002)
    assert new == b"".join([
        b"\x02",                             # 2 tagged fields now
        b"\x00", bytes([len(data)]), data,   # tag 0: the mapped node_endpoints
        bytes([PADDING_TAG]), bytes([pad - 2]), bytes(pad - 2),  # tag 127: padding, zeros
    ])


def test_fit_tail_longer_host_leaves_the_endpoints_out() -> None:
    tags = tags_with_endpoint(b"b2", 9092)
    new, original, kept = fit_tail(tags, long_host)
    assert (original, kept) == ([BrokerAddress(2, "b2", 9092)], False)
    assert len(new) == len(tags)
    fields = _read_tags(new, "t")
    assert [tag for tag, _ in fields] == [PADDING_TAG]  # only padding: no address at all
    assert b"b2" not in new and b"sluice" not in new


def test_fit_tail_same_length_and_no_endpoints() -> None:
    tags = tags_with_endpoint(b"x", 40002)
    assert fit_tail(tags, short_host) == (tags_with_endpoint(b"s", 40002), [BrokerAddress(2, "x", 40002)],
                                          True)
    assert fit_tail(b"\x00", short_host) == (b"\x00", [], True)
    other = b"\x01\x05\x01Z"  # an unknown tag only: left alone
    assert fit_tail(other, short_host)[0] == other
    with pytest.raises(DecodeError):
        fit_tail(b"\x01\x00\x05ab", short_host)


@pytest.mark.parametrize("deficit", range(1, 300))
def test_every_deficit_but_one_can_be_padded(deficit: int) -> None:
    host = b"h" * (deficit + 1)
    tags = tags_with_endpoint(host, 9092)
    new, _, kept = fit_tail(tags, lambda a: BrokerAddress(a.node_id, "h", 9092))
    assert len(new) == len(tags)
    assert kept == (deficit != 1)  # one byte short is the one size no tagged field can fill
    fields = dict(_read_tags(new, "t"))
    assert all(set(data) <= {0} for tag, data in fields.items() if tag >= PADDING_TAG)


def test_malformed_response_is_never_found() -> None:
    finder = FetchTailFinder(16)
    garbage = CORR + b"\x00" + struct.pack(">ihi", 0, 0, 0) + b"\xff\xff\xff\xff\xff\xff" + bytes(5000)
    assert finder.feed(garbage) == len(garbage)
    assert not finder.found


def _tags_offset(payload: bytes, version: int) -> int:
    _, body = read_uvarint(payload, 4, "header tags")  # header tag section: 0 fields
    return _fetch_top_level_tags_offset(payload, body, version)


@pytest.mark.parametrize("version", [16, 17, 18])
@settings(KIO_EXAMPLES, max_examples=15)
@given(data=st.data())
def test_matches_kio_responses_in_any_chunking(version: int, data: st.DataObject) -> None:
    cls = load_response_schema(ApiKey.FETCH, version)
    body = data.draw(kio_entities(cls))
    endpoint_cls = typing.get_type_hints(cls)["node_endpoints"].__args__[0]
    endpoints = data.draw(st.lists(st.builds(
        endpoint_cls, node_id=st.integers(0, 5), host=st.text(max_size=40),
        port=st.integers(0, 65535), rack=st.none() | st.text(max_size=3)), max_size=3))
    body = dataclasses.replace(body, node_endpoints=tuple(endpoints))
    payload = response_payload(body)
    chunk = data.draw(st.integers(1, 300))
    forwarded, finder = stream(payload, chunk)
    tags_at = _tags_offset(payload, version)
    assert finder.found and forwarded == payload[:tags_at] and bytes(finder.tail) == payload[tags_at:]
    mapper: Any = data.draw(st.sampled_from([short_host, long_host]))
    new, _, kept = fit_tail(bytes(finder.tail), mapper)
    assert len(new) == len(finder.tail)
    mapped = dataclasses.replace(body, node_endpoints=tuple(
        dataclasses.replace(e, host=mapper(BrokerAddress(e.node_id, e.host, e.port)).host,
                            port=40000 + e.node_id)
        for e in endpoints) if kept else ())
    expected = response_payload(mapped)
    expected_fields = [f for f in _read_tags(expected[tags_at:], "e")]
    got = _read_tags(new, "n")
    assert [f for f in got if f[0] < PADDING_TAG] == expected_fields
    assert all(set(d) <= {0} for t, d in got if t >= PADDING_TAG)
    assert kept or endpoints
