"""The topics a Fetch or ShareFetch request lists and forgets (`fetch_request_topics`,
`share_fetch_request_topics`): read without decoding offsets, checked against kio's encoding at
every version kio has, with random bodies."""

from __future__ import annotations

import struct
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.index import load_request_schema

from protocol import (
    ApiKey,
    DecodeError,
    RequestHeader,
    UnsupportedVersion,
    decode_request_body,
    encode_request,
    read_request_header,
)
from protocol.fetch import FetchRequestTopics, TopicPartitions, fetch_request_topics
from protocol.share import cap_share_fetch_max_records, share_fetch_request_topics
from tests.unit.protocol.kio_support import kio_entities, kio_versions


def _expected(topics: Any, by_id: bool, name_field: str,
              partition_field: str | None) -> tuple[TopicPartitions, ...]:
    out = []
    for t in topics:
        parts = tuple(int(p if partition_field is None else getattr(p, partition_field))
                      for p in t.partitions)
        if by_id:
            raw = None if t.topic_id is None else t.topic_id.bytes
            out.append(TopicPartitions(None, raw or bytes(16), parts))
        else:
            out.append(TopicPartitions(getattr(t, name_field), None, parts))
    return tuple(out)


@pytest.mark.parametrize("api_version", kio_versions(ApiKey.FETCH))
@given(data=st.data())
def test_fetch_topics_at_every_kio_version(api_version: int, data: st.DataObject) -> None:
    body = data.draw(kio_entities(load_request_schema(ApiKey.FETCH, api_version)))
    header_version = 2 if api_version >= 12 else 1
    payload = encode_request(RequestHeader(1, api_version, 5, "consumer", header_version, 0), body)
    got = fetch_request_topics(payload, read_request_header(payload))
    by_id = api_version >= 13
    assert got.topics == _expected(body.topics, by_id, "topic", "partition")
    if api_version >= 7:
        assert got.session_epoch == body.session_epoch
        assert got.forgotten == _expected(body.forgotten_topics_data, by_id, "topic", None)
    else:
        assert got.session_epoch == -1 and got.forgotten == ()


def test_fetch_v2_golden_by_name() -> None:
    # v0-v3 are older than kio's Fetch: byte by byte
    payload = b"".join([
        struct.pack(">hhi", 1, 2, 3), struct.pack(">h", 1), b"c",  # Fetch v2, correlation 3, "c"
        struct.pack(">iii", -1, 500, 1),       # replica_id, max_wait_ms, min_bytes
        struct.pack(">i", 2),                  # topics: 2
        struct.pack(">h", 1), b"a", struct.pack(">i", 2),   # "a", 2 partitions
        struct.pack(">iqi", 0, 10, 1 << 20), struct.pack(">iqi", 3, 11, 1 << 20),
        struct.pack(">h", 2), b"bb", struct.pack(">i", 1),  # "bb", 1 partition
        struct.pack(">iqi", 7, 12, 1 << 20),
    ])
    assert fetch_request_topics(payload, read_request_header(payload)) == FetchRequestTopics(
        -1, (TopicPartitions("a", None, (0, 3)), TopicPartitions("bb", None, (7,))), ())


def test_fetch_errors() -> None:
    payload = b"".join([struct.pack(">hhi", 1, 2, 3), struct.pack(">h", 1), b"c",
                        struct.pack(">iii", -1, 500, 1), struct.pack(">i", 1), struct.pack(">h", 1), b"a",
                        struct.pack(">i", 1), struct.pack(">iqi", 0, 10, 1)])
    with pytest.raises(DecodeError):
        fetch_request_topics(payload[:-3], read_request_header(payload))
    hostile = payload[:-(4 + 2 + 1 + 4 + 16)] + struct.pack(">i", 1 << 30)  # a billion topics
    with pytest.raises(DecodeError):
        fetch_request_topics(hostile, read_request_header(hostile))
    with pytest.raises(UnsupportedVersion):
        fetch_request_topics(payload, RequestHeader(1, 19, 3, "c", 2, 0))
    with pytest.raises(ValueError):
        fetch_request_topics(payload, RequestHeader(0, 2, 3, "c", 1, 0))


@pytest.mark.parametrize("api_version", kio_versions(ApiKey.SHARE_FETCH))
@given(data=st.data())
def test_share_fetch_topics_at_every_kio_version(api_version: int, data: st.DataObject) -> None:
    body = data.draw(kio_entities(load_request_schema(ApiKey.SHARE_FETCH, api_version)))
    payload = encode_request(RequestHeader(ApiKey.SHARE_FETCH, api_version, 5, "consumer", 2, 0), body)
    got = share_fetch_request_topics(payload, read_request_header(payload))
    assert got.session_epoch == body.share_session_epoch
    assert got.topics == _expected(body.topics, True, "", "partition_index")
    assert got.forgotten == _expected(body.forgotten_topics_data, True, "", None)


@pytest.mark.parametrize("api_version", kio_versions(ApiKey.SHARE_FETCH))
@given(data=st.data(), cap=st.integers(-5, 2**31 - 1))
def test_share_fetch_max_records_is_capped_with_batch_size_and_nothing_else(
        api_version: int, data: st.DataObject, cap: int) -> None:
    body = data.draw(kio_entities(load_request_schema(ApiKey.SHARE_FETCH, api_version)))
    payload = encode_request(RequestHeader(ApiKey.SHARE_FETCH, api_version, 5, "consumer", 2, 0), body)
    capped = cap_share_fetch_max_records(payload, read_request_header(payload), cap)
    out = decode_request_body(capped, read_request_header(capped))
    most = max(1, cap)
    assert out.max_records == min(body.max_records, most) and out.batch_size == min(body.batch_size, most)
    assert replace(out, max_records=body.max_records, batch_size=body.batch_size) == body
    if body.max_records <= most and body.batch_size <= most:
        assert capped is payload


def test_share_fetch_v0_is_not_read() -> None:
    with pytest.raises(UnsupportedVersion):
        share_fetch_request_topics(b"", RequestHeader(ApiKey.SHARE_FETCH, 0, 3, "c", 2, 0))
