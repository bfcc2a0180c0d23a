"""Per-partition traffic of Produce and Fetch (records counted from batch headers), and error codes.

Oracles: hand-built golden frames with a comment per field (non-flexible and flexible versions,
unknown tagged fields, topic ids, legacy and partial batches); kio-encoded Produce requests and
Fetch/Produce responses at every version kio has, whose record sets are made of real magic-v2
batches written by `kio.records` plus hand-built headers; kio's decoder and kafka-python's (which
skips unknown tags) read the golden frames back; aiokafka writes the Produce v1/v2 responses that
kio no longer has.

Cost (`timeit`, shared 2-core box under load, so upper bounds): a 1.6 MiB Fetch v17 response of
100 partitions x one 16 KiB batch walks in ~115 µs (kio's decode, which copies the records: ~490 µs);
the same bytes in 1,000 batches ~255 µs; 1,000 empty partitions ~0.8 ms (kio ~0.2 ms: per partition,
Python costs more than copying nothing). A Produce v9 request of 10 x 16 KiB partitions: ~13 µs.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import struct
import uuid
import zlib
from typing import Any

import pytest
from aiokafka.protocol.produce import ProduceResponse_v1, ProduceResponse_v2
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer.fetch import FetchResponse as KpFetchResponse
from kafka.protocol.producer import ProduceRequest as KpProduceRequest
from kafka.protocol.producer import ProduceResponse as KpProduceResponse
from kio.index import load_request_schema, load_response_schema
from kio.records.readers import read_batch
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.schema.errors import ErrorCode
from kio.static.primitive import Records, TZAwareMicros, i8, i16, i32, i64

from protocol import (
    ApiKey,
    DecodeError,
    PartitionTraffic,
    RequestHeader,
    UnsupportedVersion,
    decode_request_body,
    decode_response_body,
    encode_request,
    fetch_response_partitions,
    produce_request_partitions,
    produce_response_errors,
    produce_response_summary,
    read_request_header,
    response_error_codes,
    topic_ids_from_metadata_response,
)
from protocol.records import count_records
from tests.unit.protocol.kio_support import (
    KIO_EXAMPLES,
    kio_api_keys,
    kio_entities,
    kio_versions,
    response_payload,
)

CORR = struct.pack(">i", 0x01020304)  # correlation_id of every golden response
NULL_UUID = uuid.UUID(int=0)


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# --- Record sets ----------------------------------------------------------------------------------


def v2_batch(count: int, records: bytes = b"", *, attributes: int = 0, base_offset: int = 0) -> bytes:
    """A magic-v2 batch: the 61-byte header (valid crc) and `records`, which the walkers never read."""
    after_crc = b"".join([
        struct.pack(">h", attributes),           # attributes (bits 0-2: compression codec)
        struct.pack(">i", max(count - 1, 0)),    # lastOffsetDelta
        struct.pack(">q", 1_700_000_000_000),    # baseTimestamp
        struct.pack(">q", 1_700_000_000_000),    # maxTimestamp
        struct.pack(">q", -1),                   # producerId
        struct.pack(">h", -1),                   # producerEpoch
        struct.pack(">i", -1),                   # baseSequence
        struct.pack(">i", count),                # records count (batch offset 57)
        records,                                 # the records (maybe compressed)
    ])
    return b"".join([
        struct.pack(">q", base_offset),          # baseOffset
        struct.pack(">i", 9 + len(after_crc)),   # batchLength: from partitionLeaderEpoch to the end
        struct.pack(">i", 0),                    # partitionLeaderEpoch
        struct.pack(">b", 2),                    # magic = 2 (batch offset 16)
        struct.pack(">I", crc32c(after_crc)),    # crc: crc32c of everything after it
        after_crc,
    ])


def legacy_message(magic: int, value: bytes = b"v") -> bytes:
    """A one-message legacy message set (magic 0 or 1): no record count anywhere."""
    body = b"".join([
        struct.pack(">b", magic),                         # magic (entry offset 16, as in v2)
        struct.pack(">b", 0),                             # attributes
        struct.pack(">q", 0) if magic == 1 else b"",      # timestamp (magic 1 only)
        struct.pack(">i", -1),                            # key = null
        struct.pack(">i", len(value)), value,             # value
    ])
    message = struct.pack(">I", zlib.crc32(body)) + body  # crc (CRC-32 of the rest)
    return struct.pack(">qi", 0, len(message)) + message  # offset, message_size


@functools.cache
def kio_batch(n_records: int, value_size: int = 3) -> bytes:
    """A real batch of `n_records` records, written by kio.records."""
    ts = TZAwareMicros.parse(datetime.datetime(2024, 5, 1, tzinfo=datetime.UTC))
    records = tuple(
        Record(attributes=i8(0), timestamp=ts, offset=i64(i), key=None, value=b"x" * value_size, headers=())
        for i in range(n_records)
    )
    buf = io.BytesIO()
    write_new_batch(buf, NewRecordBatch(
        producer_id=i64(-1), producer_epoch=i16(-1), base_sequence=i32(-1), records=records,
        attributes=i16(0)))
    return buf.getvalue()


BATCH_3 = v2_batch(3, b"abc")  # 64 bytes, 3 records
BATCH_2 = v2_batch(2, b"de")   # 63 bytes, 2 records
LEGACY = legacy_message(1)


@st.composite
def record_sets(draw: st.DrawFn) -> tuple[bytes | None, int | None]:
    """(record set or None, the record count the walkers must report)."""
    if draw(st.integers(0, 5)) == 0:
        return None, 0
    parts: list[bytes] = []
    expected: int | None = 0
    before_last: int | None = 0
    kinds = draw(st.lists(st.sampled_from(["kio", "kio", "hand", "legacy"]), max_size=3))
    for kind in kinds:
        before_last = expected
        if kind == "kio":
            n = draw(st.integers(1, 4))
            parts.append(kio_batch(n, draw(st.integers(0, 40))))
        elif kind == "hand":  # a compressed batch, say: the count is in the clear
            n = draw(st.integers(0, 2**31 - 1))
            parts.append(v2_batch(n, draw(st.binary(max_size=12)), attributes=draw(st.integers(0, 4))))
        else:
            n = 0
            parts.append(legacy_message(draw(st.sampled_from([0, 1]))))
            expected = None
        expected = None if expected is None else expected + n
    data = b"".join(parts)
    if parts and draw(st.booleans()):  # the broker cut the last batch at max_bytes
        kept = len(parts[-1]) - draw(st.integers(1, len(parts[-1]) - 1))
        data = data[: len(data) - len(parts[-1]) + kept]
        # a cut batch is not counted (clients drop it); a cut legacy message is still recognised
        # as one when its magic byte (offset 16) survived the cut
        expected = None if kinds[-1] == "legacy" and kept > 16 else before_last
    return data, expected


def test_hand_built_header_is_a_real_batch() -> None:
    batch, _ = read_batch(v2_batch(0), 0)  # kio checks the length, crc and count
    assert (batch.batch_length, batch.records) == (49, ())
    real = kio_batch(4)
    assert read_batch(real, 0)[1] == len(real)
    assert count_records(real, 0, len(real)) == 4
    assert count_records(v2_batch(0), 0, 61) == 0


@pytest.mark.parametrize(("data", "expected"), [
    (b"", 0),                                                 # empty record set
    (BATCH_3 + BATCH_2, 5),                                   # two batches
    (v2_batch(7, b"\x00" * 9, attributes=4), 7),              # zstd-compressed: count in the clear
    (kio_batch(2) + kio_batch(1) + kio_batch(3), 6),          # real batches
    (LEGACY, None),                                           # magic 1
    (legacy_message(0), None),                                # magic 0 (shorter than a v2 header)
    (BATCH_3 + LEGACY, None),                                 # a legacy entry after a v2 batch
    (BATCH_3 + BATCH_2[:-1], 3),                              # partial last batch: not counted
    (BATCH_3 + BATCH_2[:40], 3),                              # partial last batch header: not counted
    (BATCH_3[:8] + struct.pack(">i", 48) + BATCH_3[12:], None),  # batchLength < 49
    (BATCH_3[:57] + struct.pack(">i", -1) + BATCH_3[61:], None),  # negative count
])
def test_count_records(data: bytes, expected: int | None) -> None:
    assert count_records(data, 0, len(data)) == expected
    framed = b"??" + data + b"!"  # only [start, end) is read
    assert count_records(framed, 2, 2 + len(data)) == expected


# --- Produce requests ------------------------------------------------------------------------------


def produce_v3_request() -> bytes:
    return b"".join([
        struct.pack(">hhi", 0, 3, 7),                # api_key = Produce, api_version = 3, correlation_id
        struct.pack(">h", 3), b"cli",                # client_id = "cli" (request header v1)
        struct.pack(">h", 2), b"tx",                 # transactional_id = "tx"
        struct.pack(">h", -1),                       # acks = all
        struct.pack(">i", 30000),                    # timeout_ms
        struct.pack(">i", 2),                        # topic_data: 2 topics
        struct.pack(">h", 1), b"a",                  #   name = "a"
        struct.pack(">i", 2),                        #   partition_data: 2
        struct.pack(">i", 0),                        #     index = 0
        struct.pack(">i", 127), BATCH_3, BATCH_2,    #     records: 127 bytes, batches of 3 and 2
        struct.pack(">i", 1),                        #     index = 1
        struct.pack(">i", -1),                       #     records = null
        struct.pack(">h", 1), b"b",                  #   name = "b"
        struct.pack(">i", 1),                        #   partition_data: 1
        struct.pack(">i", 7),                        #     index = 7
        struct.pack(">i", len(LEGACY)), LEGACY,      #     records: a magic-1 message set
    ])


def test_produce_v3_golden() -> None:
    payload = produce_v3_request()
    header = read_request_header(payload)
    assert produce_request_partitions(payload, header) == [
        PartitionTraffic("a", None, 0, 5, 127, 0),
        PartitionTraffic("a", None, 1, 0, 0, 0),
        PartitionTraffic("b", None, 7, None, len(LEGACY), 0),
    ]
    body = decode_request_body(payload, header)  # kio reads the same frame
    assert [(t.name, p.index, p.records) for t in body.topic_data for p in t.partition_data] == [
        ("a", 0, BATCH_3 + BATCH_2), ("a", 1, None), ("b", 7, LEGACY)]


BIG_BATCH = v2_batch(40, b"r" * 200)  # 261 bytes: a two-byte compact length


def produce_v9_request_with_unknown_tags() -> bytes:
    return b"".join([
        struct.pack(">hhi", 0, 9, 7),                # api_key, api_version = 9, correlation_id
        struct.pack(">h", -1),                       # client_id = null (int16 length in header v2 too)
        b"\x01", b"\x05\x01x",                       # header tagged fields: tag 5 (unknown), 1 byte
        b"\x00",                                     # transactional_id = null (compact string)
        struct.pack(">h", 1),                        # acks = 1
        struct.pack(">i", 1000),                     # timeout_ms
        b"\x02",                                     # topic_data: 1 (compact array, length + 1)
        b"\x02t",                                    #   name = "t"
        b"\x03",                                     #   partition_data: 2
        struct.pack(">i", 4),                        #     index = 4
        uvarint(len(BIG_BATCH) + 1), BIG_BATCH,      #     records (compact bytes, 2-byte length)
        b"\x01", b"\x63\x02hi",                      #     tagged fields: tag 99 (unknown), 2 bytes
        struct.pack(">i", 5),                        #     index = 5
        b"\x01",                                     #     records: empty (length + 1 = 1)
        b"\x00",                                     #     tagged fields: none
        b"\x01", b"\x07\x00",                        #   topic tagged fields: tag 7 (unknown), empty
        b"\x00",                                     # tagged fields: none
    ])


def test_produce_v9_golden_with_unknown_tags() -> None:
    payload = produce_v9_request_with_unknown_tags()
    assert produce_request_partitions(payload, read_request_header(payload)) == [
        PartitionTraffic("t", None, 4, 40, len(BIG_BATCH), 0),
        PartitionTraffic("t", None, 5, 0, 0, 0),
    ]
    decoded = KpProduceRequest.decode(payload, version=9, header=True)  # skips unknown tags
    assert [(t.name, p.index, len(p.records)) for t in decoded.topic_data for p in t.partition_data] == [
        ("t", 4, len(BIG_BATCH)), ("t", 5, 0)]
    with pytest.raises(DecodeError):  # kio does not skip unknown tags
        decode_request_body(payload, read_request_header(payload))


def test_produce_v13_golden_topic_id() -> None:
    topic_id = uuid.UUID("9f1c3b54-2a1d-4b7e-8c55-0123456789ab")
    batch = kio_batch(3)
    payload = b"".join([
        struct.pack(">hhi", 0, 13, 7),               # api_key, api_version = 13, correlation_id
        struct.pack(">h", 1), b"c",                  # client_id = "c"
        b"\x00",                                     # header tagged fields
        b"\x03tx",                                   # transactional_id = "tx"
        struct.pack(">h", -1),                       # acks = all
        struct.pack(">i", 5000),                     # timeout_ms
        b"\x02",                                     # topic_data: 1
        topic_id.bytes,                              #   topic_id (uuid) instead of a name
        b"\x02",                                     #   partition_data: 1
        struct.pack(">i", 2),                        #     index = 2
        uvarint(len(batch) + 1), batch,              #     records: a kio-written batch of 3
        b"\x00",                                     #     tags
        b"\x00",                                     #   topic tags
        b"\x00",                                     # tags
    ])
    header = read_request_header(payload)
    assert produce_request_partitions(payload, header) == [
        PartitionTraffic(None, topic_id.bytes, 2, 3, len(batch), 0)]
    assert decode_request_body(payload, header).topic_data[0].topic_id == topic_id


def with_record_sets(
    data: st.DataObject, body: Any, topics_field: str, partitions_field: str
) -> tuple[Any, list[tuple[Any, Any, int | None]]]:
    """`body` with each partition's records replaced by a drawn record set; (topic, partition, count)."""
    expected: list[tuple[Any, Any, int | None]] = []
    topics = []
    for topic in getattr(body, topics_field):
        partitions = []
        for partition in getattr(topic, partitions_field):
            records, count = data.draw(record_sets())
            new = dataclasses.replace(partition, records=None if records is None else Records(records))
            partitions.append(new)
            expected.append((topic, new, count))
        topics.append(dataclasses.replace(topic, **{partitions_field: tuple(partitions)}))
    return dataclasses.replace(body, **{topics_field: tuple(topics)}), expected


@pytest.mark.parametrize("api_version", kio_versions(ApiKey.PRODUCE))
@KIO_EXAMPLES
@given(data=st.data())
def test_produce_request_every_kio_version(api_version: int, data: st.DataObject) -> None:
    drawn = data.draw(kio_entities(load_request_schema(ApiKey.PRODUCE, api_version)))
    body, expected = with_record_sets(data, drawn, "topic_data", "partition_data")
    header_version = 2 if api_version >= 9 else 1
    payload = encode_request(RequestHeader(0, api_version, 5, "client", header_version, 0), body)
    by_id = api_version >= 13
    assert produce_request_partitions(payload, read_request_header(payload)) == [
        PartitionTraffic(
            None if by_id else topic.name,
            (topic.topic_id or NULL_UUID).bytes if by_id else None,
            partition.index,
            count,
            len(partition.records or b""),
            0,
        )
        for topic, partition, count in expected
    ]


# --- Produce responses -----------------------------------------------------------------------------


def test_produce_response_v2_golden() -> None:
    payload = b"".join([
        CORR,                                        # correlation_id
        struct.pack(">i", 2),                        # responses: 2 topics
        struct.pack(">h", 1), b"a",                  #   name = "a"
        struct.pack(">i", 2),                        #   partition_responses: 2
        struct.pack(">ih", 0, 6),                    #     index 0, error_code = NOT_LEADER_OR_FOLLOWER
        struct.pack(">qq", -1, -1),                  #     base_offset, log_append_time_ms
        struct.pack(">ih", 1, 0),                    #     index 1, error_code = NONE
        struct.pack(">qq", 50, -1),                  #     base_offset, log_append_time_ms
        struct.pack(">h", 1), b"b",                  #   name = "b"
        struct.pack(">i", 2),                        #   partition_responses: 2
        struct.pack(">ih", 0, 19),                   #     index 0, error_code = NOT_ENOUGH_REPLICAS
        struct.pack(">qq", -1, -1),                  #     base_offset, log_append_time_ms
        struct.pack(">ih", 1, 6),                    #     index 1, error_code = NOT_LEADER_OR_FOLLOWER
        struct.pack(">qq", -1, -1),                  #     base_offset, log_append_time_ms
        struct.pack(">i", 0),                        # throttle_time_ms
    ])
    assert produce_response_errors(payload, 2) == [6, 19]  # distinct, in order of appearance
    decoded = ProduceResponse_v2.decode(payload[4:])  # aiokafka agrees on the partitions
    assert [p[1] for _, parts in decoded.topics for p in parts] == [6, 0, 19, 6]


def produce_v10_response() -> bytes:
    return b"".join([
        CORR, b"\x00",                               # correlation_id, header tagged fields: none
        b"\x02",                                     # responses: 1 topic
        b"\x03tp",                                   #   name = "tp"
        b"\x03",                                     #   partition_responses: 2
        struct.pack(">ih", 0, 0),                    #     index 0, error_code = NONE
        struct.pack(">qqq", 8, -1, 0),               #     base_offset, log_append_time_ms, log_start_offset
        b"\x01",                                     #     record_errors: none
        b"\x00",                                     #     error_message = null
        b"\x00",                                     #     tagged fields
        struct.pack(">ih", 1, 87),                   #     index 1, error_code = INVALID_RECORD
        struct.pack(">qqq", -1, -1, -1),             #     base_offset, log_append_time_ms, log_start_offset
        b"\x02",                                     #     record_errors: 1
        struct.pack(">i", 4), b"\x04bad", b"\x00",   #       batch_index 4, message "bad", tags
        b"\x05oops",                                 #     error_message = "oops"
        b"\x02",                                     #     tagged fields: 2
        b"\x00\x09", struct.pack(">ii", 1, 5), b"\x00",  # tag 0 current_leader: leader 1, epoch 5, tags
        b"\x63\x01!",                                #       tag 99 (unknown), 1 byte
        b"\x00",                                     #   topic tagged fields
        struct.pack(">i", 12),                       # throttle_time_ms
        b"\x00",                                     # tagged fields
    ])


def test_produce_response_v10_golden() -> None:
    payload = produce_v10_response()
    assert produce_response_errors(payload, 10) == [87]
    decoded = KpProduceResponse.decode(payload, version=10, header=True)  # skips unknown tags
    assert [p.error_code for t in decoded.responses for p in t.partition_responses] == [0, 87]


@pytest.mark.parametrize("struct_cls", [ProduceResponse_v1, ProduceResponse_v2])
@given(topics=st.lists(st.tuples(st.text(max_size=5), st.lists(
    st.tuples(st.integers(0, 99), st.sampled_from([0, 0, 1, 6, 19, 87]), st.integers(-1, 2**40),
              st.integers(-1, 2**40)),
    max_size=4)), max_size=3))
@settings(max_examples=20)
def test_produce_response_v1_v2_from_aiokafka(struct_cls: Any, topics: Any) -> None:
    if struct_cls is ProduceResponse_v1:
        topics = [(name, [p[:3] for p in parts]) for name, parts in topics]  # no timestamp in v1
    payload = CORR + struct_cls(topics, 0).encode()
    codes = [p[1] for _, parts in topics for p in parts]
    assert produce_response_errors(payload, struct_cls.API_VERSION) == [
        c for i, c in enumerate(codes) if c and c not in codes[:i]]


@pytest.mark.parametrize("api_version", kio_versions(ApiKey.PRODUCE))
@KIO_EXAMPLES
@given(data=st.data())
def test_produce_response_errors_every_kio_version(api_version: int, data: st.DataObject) -> None:
    body = data.draw(kio_entities(load_response_schema(ApiKey.PRODUCE, api_version)))
    codes = [int(p.error_code) for t in body.responses for p in t.partition_responses]
    expected = [c for i, c in enumerate(codes) if c and c not in codes[:i]]
    payload = response_payload(body)
    assert produce_response_errors(payload, api_version) == expected
    assert response_error_codes(payload, ApiKey.PRODUCE, api_version) == expected  # the kio path
    if api_version >= 1:  # v0 has no throttle_time_ms (and is not a verified response layout)
        # one walk gives both: the throttle time is the one kio encoded
        throttle_ms = body.throttle_time // datetime.timedelta(milliseconds=1)
        assert produce_response_summary(payload, api_version) == (expected, throttle_ms)


# --- Fetch responses -------------------------------------------------------------------------------


def fetch_v4_response() -> bytes:
    cut = BATCH_3 + BATCH_2[:30]
    return b"".join([
        CORR,                                        # correlation_id (response header v0)
        struct.pack(">i", 0),                        # throttle_time_ms (no error_code before v7)
        struct.pack(">i", 1),                        # responses: 1 topic
        struct.pack(">h", 1), b"f",                  #   topic = "f"
        struct.pack(">i", 3),                        #   partitions: 3
        struct.pack(">ih", 0, 0),                    #     partition_index 0, error_code = NONE
        struct.pack(">qq", 100, 90),                 #     high_watermark, last_stable_offset
        struct.pack(">i", 1),                        #     aborted_transactions: 1
        struct.pack(">qq", 77, 80),                  #       producer_id, first_offset
        struct.pack(">i", len(cut)), cut,            #     records: a batch, then one cut at max_bytes
        struct.pack(">ih", 1, 1),                    #     partition_index 1, error_code = OFFSET_OUT_OF_RANGE
        struct.pack(">qq", -1, -1),                  #     high_watermark, last_stable_offset
        struct.pack(">i", -1),                       #     aborted_transactions = null
        struct.pack(">i", -1),                       #     records = null
        struct.pack(">ih", 2, 0),                    #     partition_index 2, error_code = NONE
        struct.pack(">qq", 10, 10),                  #     high_watermark, last_stable_offset
        struct.pack(">i", 0),                        #     aborted_transactions: empty
        struct.pack(">i", 127), BATCH_3, BATCH_2,    #     records: 3 + 2
    ])


def test_fetch_v4_golden() -> None:
    payload = fetch_v4_response()
    cut_size = len(BATCH_3) + 30
    assert fetch_response_partitions(payload, 4) == (0, [
        PartitionTraffic("f", None, 0, 3, cut_size, 0),       # the cut batch's 2 records do not count
        PartitionTraffic("f", None, 1, 0, 0, 1),
        PartitionTraffic("f", None, 2, 5, 127, 0),
    ])
    body = decode_response_body(payload, ApiKey.FETCH, 4)  # kio reads the same frame
    assert [(p.partition_index, len(p.records or b"")) for p in body.responses[0].partitions] == [
        (0, cut_size), (1, 0), (2, 127)]
    decoded = KpFetchResponse.decode(payload, version=4, header=True)  # so does kafka-python
    assert [p.error_code for t in decoded.responses for p in t.partitions] == [0, 1, 0]


def test_fetch_v11_golden() -> None:
    payload = b"".join([
        CORR,                                        # correlation_id
        struct.pack(">i", 0),                        # throttle_time_ms
        struct.pack(">h", 0),                        # error_code (v7+)
        struct.pack(">i", 99),                       # session_id (v7+)
        struct.pack(">i", 1),                        # responses: 1 topic
        struct.pack(">h", 2), b"ab",                 #   topic = "ab"
        struct.pack(">i", 2),                        #   partitions: 2
        struct.pack(">ih", 5, 0),                    #     partition_index 5, error_code = NONE
        struct.pack(">qqq", 30, 30, 0),              #     high_watermark, last_stable_offset, log_start (v5+)
        struct.pack(">i", -1),                       #     aborted_transactions = null
        struct.pack(">i", 2),                        #     preferred_read_replica (v11+)
        struct.pack(">i", 127), BATCH_3, BATCH_2,    #     records: 3 + 2
        struct.pack(">ih", 6, 6),                    #     partition_index 6, error_code = NOT_LEADER
        struct.pack(">qqq", -1, -1, -1),             #     high_watermark, last_stable_offset, log_start
        struct.pack(">i", -1),                       #     aborted_transactions = null
        struct.pack(">i", -1),                       #     preferred_read_replica
        struct.pack(">i", 0),                        #     records: empty
    ])
    assert fetch_response_partitions(payload, 11) == (0, [
        PartitionTraffic("ab", None, 5, 5, 127, 0),
        PartitionTraffic("ab", None, 6, 0, 0, 6),
    ])
    assert KpFetchResponse.decode(payload, version=11, header=True).session_id == 99
    assert response_error_codes(payload, ApiKey.FETCH, 11) == [6]


def fetch_v12_response_with_tags() -> bytes:
    return b"".join([
        CORR,                                        # correlation_id
        b"\x01", b"\x09\x02zz",                      # header tagged fields: tag 9 (unknown), 2 bytes
        struct.pack(">i", 5),                        # throttle_time_ms
        struct.pack(">h", 0),                        # error_code
        struct.pack(">i", 1234),                     # session_id
        b"\x02",                                     # responses: 1 (compact)
        b"\x02f",                                    #   topic = "f"
        b"\x03",                                     #   partitions: 2
        struct.pack(">ih", 3, 0),                    #     partition_index 3, error_code = NONE
        struct.pack(">qqq", 500, 480, 0),            #     high_watermark, last_stable_offset, log_start
        b"\x02",                                     #     aborted_transactions: 1
        struct.pack(">qq", 77, 470), b"\x00",        #       producer_id, first_offset, tags
        struct.pack(">i", -1),                       #     preferred_read_replica
        uvarint(len(BIG_BATCH) + 1), BIG_BATCH,      #     records: 40 records (2-byte compact length)
        b"\x04",                                     #     tagged fields: 4
        b"\x00\x0d", struct.pack(">iq", 4, 90), b"\x00",   # tag 0 diverging_epoch: epoch, end_offset, tags
        b"\x01\x09", struct.pack(">ii", 2, 8), b"\x00",    # tag 1 current_leader: leader, epoch, tags
        b"\x02\x0d", struct.pack(">qi", 60, 3), b"\x00",   # tag 2 snapshot_id: end_offset, epoch, tags
        b"\x2a\x03abc",                              #       tag 42 (unknown), 3 bytes
        struct.pack(">ih", 4, 74),                   #     partition 4, error_code = FENCED_LEADER_EPOCH
        struct.pack(">qqq", -1, -1, -1),             #     high_watermark, last_stable_offset, log_start
        b"\x00",                                     #     aborted_transactions = null
        struct.pack(">i", -1),                       #     preferred_read_replica
        b"\x00",                                     #     records = null
        b"\x00",                                     #     tagged fields: none
        b"\x01", b"\x05\x00",                        #   topic tagged fields: tag 5 (unknown), empty
        b"\x00",                                     # tagged fields: none
    ])


def test_fetch_v12_golden_with_partition_tags() -> None:
    payload = fetch_v12_response_with_tags()
    assert fetch_response_partitions(payload, 12) == (0, [
        PartitionTraffic("f", None, 3, 40, len(BIG_BATCH), 0),
        PartitionTraffic("f", None, 4, 0, 0, 74),
    ])
    decoded = KpFetchResponse.decode(payload, version=12, header=True)  # skips unknown tags
    partitions = decoded.responses[0].partitions
    assert [p.partition_index for p in partitions] == [3, 4]
    assert (partitions[0].diverging_epoch.epoch, partitions[0].current_leader.leader_id) == (4, 2)
    assert partitions[0].snapshot_id.end_offset == 60


def test_fetch_v16_golden_topic_id_and_node_endpoints() -> None:
    topic_id = uuid.UUID(int=0xABCDEF)
    payload = b"".join([
        CORR, b"\x00",                               # correlation_id, header tagged fields
        struct.pack(">i", 0),                        # throttle_time_ms
        struct.pack(">h", 0),                        # error_code
        struct.pack(">i", 0),                        # session_id
        b"\x02",                                     # responses: 1
        topic_id.bytes,                              #   topic_id (v13+)
        b"\x02",                                     #   partitions: 1
        struct.pack(">ih", 0, 6),                    #     partition_index 0, error_code = NOT_LEADER
        struct.pack(">qqq", -1, -1, -1),             #     high_watermark, last_stable_offset, log_start
        b"\x01",                                     #     aborted_transactions: empty
        struct.pack(">i", -1),                       #     preferred_read_replica
        b"\x01",                                     #     records: empty
        b"\x01", b"\x01\x09", struct.pack(">ii", 2, 9), b"\x00",  # tags: current_leader 2, epoch 9
        b"\x00",                                     #   topic tagged fields
        b"\x01",                                     # tagged fields: 1
        b"\x00\x0d", b"\x02",                        #   tag 0 node_endpoints (13 bytes): 1 endpoint
        struct.pack(">i", 2), b"\x02h",              #     node_id 2, host "h"
        struct.pack(">i", 9092), b"\x00", b"\x00",   #     port, rack = null, tags
    ])
    assert fetch_response_partitions(payload, 16) == (0, [
        PartitionTraffic(None, topic_id.bytes, 0, 0, 0, 6)])
    body = decode_response_body(payload, ApiKey.FETCH, 16)  # kio knows every tag here
    assert body.responses[0].topic_id == topic_id
    assert body.node_endpoints[0].port == 9092
    assert response_error_codes(payload, ApiKey.FETCH, 16) == [6]


@pytest.mark.parametrize("api_version", kio_versions(ApiKey.FETCH))
@KIO_EXAMPLES
@given(data=st.data())
def test_fetch_response_every_kio_version(api_version: int, data: st.DataObject) -> None:
    drawn = data.draw(kio_entities(load_response_schema(ApiKey.FETCH, api_version)))
    body, expected = with_record_sets(data, drawn, "responses", "partitions")
    payload = response_payload(body)
    by_id = api_version >= 13
    top_error = int(body.error_code) if api_version >= 7 else 0
    assert fetch_response_partitions(payload, api_version) == (top_error, [
        PartitionTraffic(
            None if by_id else topic.topic,
            (topic.topic_id or NULL_UUID).bytes if by_id else None,
            partition.partition_index,
            count,
            len(partition.records or b""),
            int(partition.error_code),
        )
        for topic, partition, count in expected
    ])


@pytest.mark.parametrize("size", [61, 126, 127, 16_383, 16_384, 2_097_151, 2_097_152])
def test_record_set_lengths_of_every_varint_width(size: int) -> None:
    # 1- to 4-byte compact lengths (the first three are decoded inline); a non-flexible twin.
    from kio.schema.fetch.v11 import response as f11
    from kio.schema.fetch.v17 import response as f17

    batch = v2_batch(size, b"r" * (size - 61))
    for module, version in ((f17, 17), (f11, 11)):
        body = module.FetchResponse(
            throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, responses=(
                module.FetchableTopicResponse(
                    **({"topic_id": uuid.UUID(int=5)} if version >= 13 else {"topic": "t"}),
                    partitions=(module.PartitionData(
                        partition_index=1, error_code=ErrorCode.none, high_watermark=0,
                        aborted_transactions=None, records=Records(batch)),) * 2),))
        _, partitions = fetch_response_partitions(response_payload(body), version)
        assert [(p.records, p.bytes) for p in partitions] == [(size, size)] * 2


# --- Metadata topic ids ----------------------------------------------------------------------------


def test_metadata_topic_ids_golden() -> None:
    from kio.schema.metadata.v12 import response as m12

    def topic(name: str | None, topic_id: uuid.UUID | None) -> Any:
        return m12.MetadataResponseTopic(
            error_code=ErrorCode.none, name=name, topic_id=topic_id, partitions=())

    body = m12.MetadataResponse(
        throttle_time=datetime.timedelta(0), brokers=(), topics=(
            topic("orders", uuid.UUID(int=1)),
            topic("legacy", None),               # no id: left out
            topic(None, uuid.UUID(int=3)),       # v12+: looked up by id, unknown name: left out
            topic("payments", uuid.UUID(int=2)),
        ))
    payload = response_payload(body)
    assert topic_ids_from_metadata_response(payload, 12) == {
        uuid.UUID(int=1).bytes: "orders", uuid.UUID(int=2).bytes: "payments"}
    assert topic_ids_from_metadata_response(b"", 9) == {}  # no ids before v10: nothing is read


@pytest.mark.parametrize("api_version", [v for v in kio_versions(ApiKey.METADATA) if v >= 10])
@KIO_EXAMPLES
@given(data=st.data())
def test_metadata_topic_ids_every_kio_version(api_version: int, data: st.DataObject) -> None:
    body = data.draw(kio_entities(load_response_schema(ApiKey.METADATA, api_version)))
    expected = {
        t.topic_id.bytes: t.name for t in body.topics
        if t.topic_id is not None and t.topic_id != NULL_UUID and t.name is not None}
    assert topic_ids_from_metadata_response(response_payload(body), api_version) == expected


# --- Generic error codes ---------------------------------------------------------------------------


def _asdict_error_codes(value: Any, found: list[int]) -> None:
    """A second opinion that walks dataclasses.asdict()'s dicts and lists."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "error_code" or key.endswith("_error_code"):
                if item and int(item) not in found:
                    found.append(int(item))
            else:
                _asdict_error_codes(item, found)
    elif isinstance(value, list | tuple):
        for item in value:
            _asdict_error_codes(item, found)


def _all_kio_response_versions() -> list[tuple[int, int]]:
    return [(key, version) for key in kio_api_keys() for version in kio_versions(key)]


@pytest.mark.parametrize(("api_key", "api_version"), _all_kio_response_versions())
@settings(max_examples=2, deadline=None, suppress_health_check=KIO_EXAMPLES.suppress_health_check)
@given(data=st.data())
def test_response_error_codes_every_api_kio_knows(
    api_key: int, api_version: int, data: st.DataObject
) -> None:
    body = data.draw(kio_entities(load_response_schema(api_key, api_version)))
    payload = response_payload(body)
    if api_key == ApiKey.API_VERSIONS and body.error_code == ErrorCode.unsupported_version:
        assert response_error_codes(payload, api_key, api_version) == [35]
        return
    expected: list[int] = []
    _asdict_error_codes(dataclasses.asdict(body), expected)
    assert response_error_codes(payload, api_key, api_version) == expected


def test_response_error_codes_nested_and_renamed_fields() -> None:
    from kio.schema.add_partitions_to_txn.v3 import response as txn

    body = txn.AddPartitionsToTxnResponse(throttle_time=datetime.timedelta(0), results_by_topic_v3_and_below=(
        txn.AddPartitionsToTxnTopicResult(name="t", results_by_partition=(
            txn.AddPartitionsToTxnPartitionResult(partition_index=0, partition_error_code=ErrorCode.none),
            txn.AddPartitionsToTxnPartitionResult(
                partition_index=1, partition_error_code=ErrorCode.invalid_txn_state),
            txn.AddPartitionsToTxnPartitionResult(
                partition_index=2, partition_error_code=ErrorCode.invalid_txn_state),
        )),))
    assert response_error_codes(response_payload(body), ApiKey.ADD_PARTITIONS_TO_TXN, 3) == [48]


def test_response_error_codes_api_versions_v0_fallback() -> None:
    payload = b"".join([
        CORR,                                        # correlation_id (header v0)
        struct.pack(">h", 35),                       # error_code = UNSUPPORTED_VERSION
        struct.pack(">i", 1),                        # api_keys: 1 (int32 length: the v0 format)
        struct.pack(">hhh", 18, 0, 4),               #   ApiVersions v0-4
    ])
    assert response_error_codes(payload, ApiKey.API_VERSIONS, 4) == [35]  # not decodable as v4


@pytest.mark.parametrize(("api_key", "api_version"), [(ApiKey.PRODUCE, 2), (ApiKey.FETCH, 19), (200, 0)])
def test_response_error_codes_unknown_versions(api_key: int, api_version: int) -> None:
    with pytest.raises(UnsupportedVersion):
        response_error_codes(CORR + b"\x00" * 8, api_key, api_version)


def test_response_error_codes_bad_input() -> None:
    with pytest.raises(DecodeError):
        response_error_codes(fetch_v12_response_with_tags()[:-3], ApiKey.FETCH, 12)
    with pytest.raises(DecodeError):  # an unknown tag: kio refuses, so does this
        response_error_codes(fetch_v12_response_with_tags(), ApiKey.FETCH, 12)
    with pytest.raises(DecodeError):
        topic_ids_from_metadata_response(CORR + b"\x00\x00", 12)
    with pytest.raises(UnsupportedVersion):
        topic_ids_from_metadata_response(CORR, 14)


# --- Malformed input -------------------------------------------------------------------------------


@pytest.mark.parametrize("frame", [produce_v3_request, produce_v9_request_with_unknown_tags])
def test_produce_request_every_truncation_and_trailing_byte(frame: Any) -> None:
    payload = frame()
    header = read_request_header(payload)
    for cut in range(header.body_offset, len(payload)):
        with pytest.raises(DecodeError):
            produce_request_partitions(payload[:cut], header)
    with pytest.raises(DecodeError, match="trailing bytes"):
        produce_request_partitions(payload + b"\x00", header)


@pytest.mark.parametrize(("frame", "api_version"), [
    (fetch_v4_response, 4), (fetch_v12_response_with_tags, 12)])
def test_fetch_response_every_truncation_and_trailing_byte(frame: Any, api_version: int) -> None:
    payload = frame()
    for cut in range(len(payload)):
        with pytest.raises(DecodeError):
            fetch_response_partitions(payload[:cut], api_version)
    with pytest.raises(DecodeError, match="trailing bytes"):
        fetch_response_partitions(payload + b"\x00", api_version)


def test_produce_response_every_truncation_and_trailing_byte() -> None:
    payload = produce_v10_response()
    for cut in range(len(payload)):
        with pytest.raises(DecodeError):
            produce_response_errors(payload[:cut], 10)
    with pytest.raises(DecodeError, match="trailing bytes"):
        produce_response_errors(payload + b"\x00", 10)


V3_BODY = struct.pack(">hhi", 0, 3, 7) + struct.pack(">h", -1)  # Produce v3 request header, client_id null


@pytest.mark.parametrize("body", [
    struct.pack(">hhi", -1, 1, 0) + struct.pack(">i", 0x7FFFFFFF),   # hostile topic count
    struct.pack(">hhi", -1, 1, 0) + struct.pack(">i", 1) + b"\x00\x01t" + struct.pack(">i", 0x10000000),
    struct.pack(">hhi", -1, 1, 0) + struct.pack(">i", 1) + b"\x00\x01t" + struct.pack(">ii", 1, 0)
    + struct.pack(">i", -2),                                         # records length -2
    struct.pack(">hhi", -1, 1, 0) + struct.pack(">i", 1) + b"\x00\x01t" + struct.pack(">ii", 1, 0)
    + struct.pack(">i", 100) + b"\x00" * 10,                         # records longer than the frame
    struct.pack(">hhi", -1, 1, 0) + struct.pack(">i", -2),           # negative topic count
])
def test_produce_request_malformed(body: bytes) -> None:
    payload = V3_BODY + body  # transactional_id = null, acks, timeout_ms, then the bad part
    with pytest.raises(DecodeError):
        produce_request_partitions(payload, read_request_header(payload))


@pytest.mark.parametrize("payload", [
    CORR + b"\x00" + struct.pack(">ihi", 0, 0, 0) + b"\xff\xff\xff\xff\x0f",   # hostile topic count
    CORR + b"\x00" + struct.pack(">ihi", 0, 0, 0) + b"\x80\x80\x80\x80\x80",   # varint too long
    CORR + b"\x00" + struct.pack(">ihi", 0, 0, 0) + b"\x02\x02f\x02" + struct.pack(">ih", 0, 0)
    + b"\x00" * 24 + b"\x00" + struct.pack(">i", -1) + b"\x90\x4e",  # records: 10000 bytes announced
])
def test_fetch_response_malformed(payload: bytes) -> None:
    with pytest.raises(DecodeError):
        fetch_response_partitions(payload, 12)


def test_unsupported_versions_and_wrong_api() -> None:
    for version in (2, 14):
        payload = struct.pack(">hhih", 0, version, 1, -1) + b"\x00" * 8
        with pytest.raises(UnsupportedVersion):
            produce_request_partitions(payload, read_request_header(payload))
    payload = struct.pack(">hhih", 1, 4, 1, -1) + b"\x00" * 8
    with pytest.raises(ValueError, match="not a Produce request"):
        produce_request_partitions(payload, read_request_header(payload))
    for version in (3, 19, -1):
        with pytest.raises(UnsupportedVersion):
            fetch_response_partitions(CORR + b"\x00" * 16, version)
    for version in (0, 14):
        with pytest.raises(UnsupportedVersion):
            produce_response_errors(CORR + b"\x00" * 16, version)
