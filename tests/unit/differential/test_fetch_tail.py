"""The compiled finder of a streamed Fetch response's top-level tag section (protocol._speedups)
against its reference, `protocol.fetch_tail.FetchTailFinder`.

Both are fed the same response in the same chunks (bytes, memoryview or bytearray, as the stream
hands them over): every `feed` must return the same count, and at the end both must agree on
`found` and hold the same tail. The responses are kio builds of every flexible Fetch version (with
and without leader endpoints), hand-built shapes (aborted transactions, tagged fields, long record
sets, a v12 topic name), the same cut short or with one byte changed, and arbitrary bytes.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.index import load_response_schema

from protocol import fetch_tail
from protocol._wire import encode_uvarint
from protocol.apis import ApiKey
from tests.unit.differential.impls import compiled, outcome
from tests.unit.differential.test_byte_path import SETTINGS, fetch_shapes
from tests.unit.protocol.kio_support import KIO_EXAMPLES, kio_entities, kio_versions, response_payload
from tests.unit.protocol.test_rewrite import body_with_endpoints

FLEXIBLE_FETCH = [v for v in kio_versions(ApiKey.FETCH) if v >= 12]
KINDS = (bytes, memoryview, bytearray)


def pieces(payload: bytes, cuts: list[int]) -> list[bytes]:
    ends = sorted({c % (len(payload) + 1) for c in cuts} | {len(payload)})
    out, start = [], 0
    for end in ends:
        out.append(payload[start:end])
        start = end
    return out


def same_walk(payload: bytes, version: int, cuts: list[int], kinds: list[int]) -> tuple[bool, bytes]:
    """Both finders over `payload` in the chunks `cuts` makes; (found, tail), which they agree on."""
    pure, built = fetch_tail.FetchTailFinder(version), compiled().FetchTailFinder(version)
    for i, piece in enumerate(pieces(payload, cuts)):
        kind = KINDS[kinds[i % len(kinds)] if kinds else 0]
        assert built.feed(kind(piece)) == pure.feed(kind(piece)), f"chunk {i} of {len(payload)} bytes"
    assert built.found is pure.found
    assert bytes(built.tail) == bytes(pure.tail)
    return pure.found, bytes(pure.tail)


cuts_strategy = st.lists(st.integers(min_value=0, max_value=1 << 16), max_size=8)
kinds_strategy = st.lists(st.integers(0, 2), max_size=4)


@pytest.mark.both_twins
@pytest.mark.parametrize("version", FLEXIBLE_FETCH)
@KIO_EXAMPLES
@given(data=st.data(), cuts=cuts_strategy, kinds=kinds_strategy)
def test_kio_builds_in_any_chunking(version: int, data: st.DataObject, cuts: list[int],
                                    kinds: list[int]) -> None:
    schema = load_response_schema(ApiKey.FETCH, version)
    has_tag = "node_endpoints" in schema.__dataclass_fields__
    body = body_with_endpoints(ApiKey.FETCH, version, data) if has_tag else data.draw(kio_entities(schema))
    payload = response_payload(body)
    found, tail = same_walk(payload, version, cuts, kinds)
    assert found  # a well-formed response always reaches its tag section
    if has_tag and body.node_endpoints:
        assert tail[:1] != b"\x00"  # held: the section with the endpoints
    cut = data.draw(st.integers(min_value=0, max_value=len(payload)))
    same_walk(payload[:cut], version, cuts, kinds)
    i = data.draw(st.integers(min_value=0, max_value=len(payload) - 1))
    same_walk(payload[:i] + bytes([data.draw(st.integers(0, 255))]) + payload[i + 1:], version, cuts, kinds)


@pytest.mark.both_twins
@pytest.mark.parametrize("version", range(12, 19))
@SETTINGS
@given(data=st.data(), cuts=cuts_strategy, kinds=kinds_strategy)
def test_hand_built_shapes_in_any_chunking(version: int, data: st.DataObject, cuts: list[int],
                                           kinds: list[int]) -> None:
    head = data.draw(fetch_shapes(version))
    tags = data.draw(st.sampled_from([b"\x00", b"\x01\x00\x01\x01", b"\x02\x05\x01Z\x06\x00"]))
    found, tail = same_walk(head + tags, version, cuts, kinds)
    assert found and tail == tags
    cut = data.draw(st.integers(min_value=0, max_value=len(head) - 1))
    assert same_walk(head[:cut], version, cuts, kinds)[0] is False  # cut before its tags: never found
    i = data.draw(st.integers(min_value=0, max_value=len(head) - 1))
    same_walk(head[:i] + bytes([data.draw(st.integers(0, 255))]) + head[i + 1:] + tags, version, cuts, kinds)


@pytest.mark.both_twins
@SETTINGS
@given(payload=st.binary(max_size=400), version=st.integers(12, 18), cuts=cuts_strategy, kinds=kinds_strategy)
def test_arbitrary_bytes(payload: bytes, version: int, cuts: list[int], kinds: list[int]) -> None:
    same_walk(payload, version, cuts, kinds)


def one_partition(topic: bytes, aborted: bytes, records: int, tags: bytes) -> bytes:
    return b"".join([
        struct.pack(">i", 9), b"\x00",          # correlation_id, response header tags
        struct.pack(">ihi", 0, 0, 77),          # throttle_time_ms, error_code, session_id
        b"\x02", topic,                         # responses: 1 topic (its id, or a v12 name)
        b"\x02",                                #   partitions: 1
        struct.pack(">ihqqq", 0, 0, 9, 9, 0),   #     index, error, high_watermark, lso, log_start
        aborted,                                #     aborted_transactions
        struct.pack(">i", -1),                  #     preferred_read_replica
        encode_uvarint(records + 1), b"r" * records,  # records
        b"\x00", b"\x00",                       #     partition tags, topic tags
        tags,                                   # top-level tags
    ])


@pytest.mark.both_twins
@pytest.mark.parametrize("chunk", [1, 7, 1448, 1 << 20])
def test_steps_split_across_chunks_and_the_step_size_limit(chunk: int) -> None:
    """Thousands of aborted transactions (each a step, buffered when split), a v12 topic name of
    32 KiB (one step, buffered whole when split), and a name claiming more than the step limit
    (never whole: both give up at the same byte and forward the rest)."""
    aborted = encode_uvarint(5001) + b"".join(struct.pack(">qq", 5, i) + b"\x00" for i in range(5000))
    big_name = encode_uvarint(32_768) + b"n" * 32_767
    too_long = encode_uvarint(200_000) + b"n" * 70_000
    for payload, version, expect_found in [
            (one_partition(bytes(16), aborted, 30_000, b"\x00"), 16, True),
            (one_partition(big_name, b"\x01", 10, b"\x00"), 12, True),
            (one_partition(too_long, b"\x01", 10, b"\x00"), 12, False)]:
        cuts = list(range(chunk, len(payload), chunk))
        found, _ = same_walk(payload, version, cuts, [0, 1])
        assert found is expect_found


@pytest.mark.both_twins
@pytest.mark.parametrize("version", [-1, 0, 11])
def test_a_version_without_tags_is_refused_alike(version: int) -> None:
    expected: Any = outcome(fetch_tail.FetchTailFinder, version)
    assert expected[0] == "raised"
    assert outcome(compiled().FetchTailFinder, version) == expected
