"""Who produced and fetched what: per-partition traffic of Produce and Fetch, without decoding records.

The access log wants, per request, the topics and partitions touched, how many records and bytes
went each way, and the errors the broker answered with. Records are never decoded (nor copied): a
record set is a sequence of batches, and the count sits in each magic-v2 batch header, so the walk
costs O(partitions + batches) whatever the size of the frame (a kio decode copies every record
set, ~29 µs per MiB).

Record batch header (magic 2, KIP-98; offsets from the start of the batch, 61 bytes in all):
baseOffset int64 (0), batchLength int32 (8; the batch is 12 + batchLength bytes), partitionLeaderEpoch
int32 (12), magic int8 (16), crc uint32 (17), attributes int16 (21), lastOffsetDelta int32 (23),
baseTimestamp int64 (27), maxTimestamp int64 (35), producerId int64 (43), producerEpoch int16 (51),
baseSequence int32 (53), records count int32 (57). The count is written in the clear even when the
records are compressed. Legacy message sets (magic 0/1) also carry their magic at offset 16 but no
count; a record set holding one, or ending in a partial batch (a broker cuts a Fetch response at
max_bytes mid-batch), reports `records=None` while its `bytes` is still exact.

Layouts walked here (Kafka's ProduceRequest.json / FetchResponse.json; "flexible" = compact arrays,
strings and bytes with a length + 1 varint, and a tag section closing every struct):

* Produce request v3-v13 (flexible from v9): transactional_id, acks int16, timeout_ms int32,
  topic_data[] {name (v3-12) | topic_id uuid (v13), partition_data[] {index int32, records}};
* Produce response v1-v13: see `protocol.throttle.produce_throttle_offset_walk`, which serves both
  the throttle patch and the error list here;
* Fetch response v4-v18 (flexible and response header v1 from v12): throttle_time_ms int32,
  error_code int16 and session_id int32 (v7+), responses[] {topic (v4-12) | topic_id (v13+),
  partitions[] {partition_index int32, error_code int16, high_watermark int64, last_stable_offset
  int64, log_start_offset int64 (v5+), aborted_transactions[] (nullable) {producer_id int64,
  first_offset int64}, preferred_read_replica int32 (v11+), records (nullable), tags (v12+:
  diverging_epoch, current_leader, snapshot_id)}}, tags (v16+: node_endpoints).

Every walk must end exactly at the end of the payload (else DecodeError), so a version mix-up or a
stray byte is reported rather than turned into wrong numbers. Metadata topic ids and the generic
error-code scan are off the hot path and use kio (see `protocol.encode`).
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from protocol._wire import (
    I32,
    read_array_len,
    read_i16,
    read_i32,
    read_string,
    read_uvarint,
    skip,
    skip_string,
    skip_tagged_fields,
    truncated,
)
from protocol.apis import ApiKey, response_header_version
from protocol.encode import decode_response_body
from protocol.errors import DecodeError, UnsupportedVersion
from protocol.headers import RequestHeader, response_body_offset
from protocol.throttle import produce_throttle_offset_walk

PRODUCE_REQUEST_VERSIONS: Final = range(3, 14)
PRODUCE_RESPONSE_VERSIONS: Final = range(1, 14)
FETCH_RESPONSE_VERSIONS: Final = range(4, 19)
METADATA_TOPIC_IDS_SINCE: Final = 10

BATCH_HEADER_BYTES: Final = 61
_LOG_OVERHEAD: Final = 12  # baseOffset + batchLength: what batchLength does not count
_MIN_BATCH_LENGTH: Final = BATCH_HEADER_BYTES - _LOG_OVERHEAD
# batchLength at 8, magic at 16, records count at 57 (baseOffset, epoch, crc ... skipped)
_BATCH_HEADER: Final = struct.Struct(">8xi4xb40xi")
_MAGIC_V2: Final = 2
_UUID_BYTES: Final = 16
_PARTITION_HEAD: Final = struct.Struct(">ih")  # partition_index, error_code


@dataclass(frozen=True, slots=True)
class PartitionTraffic:
    """One partition of a Produce request or a Fetch response, as the access log records it.

    `topic` is set for versions that name topics (Produce v3-12, Fetch v4-12) and `topic_id`
    (16 bytes, as on the wire) for those that carry a uuid instead (Produce v13, Fetch v13+); map
    ids to names with `topic_ids_from_metadata_response`. `records` is the sum of the magic-v2
    batch headers' counts, None if the record set holds a legacy message or a partial batch;
    `bytes` is the size of the record set (0 when null or empty). `error_code` is 0 in requests.
    """

    topic: str | None
    topic_id: bytes | None
    partition: int
    records: int | None
    bytes: int
    error_code: int


_TrafficFactory = Callable[[str | None, bytes | None, int, int | None, int, int], PartitionTraffic]


def _fast_constructor() -> _TrafficFactory:
    """PartitionTraffic(...) at half the cost (~0.3 µs less per partition).

    A frozen dataclass's __init__ goes through object.__setattr__ for each field; the walkers build
    one instance per partition, so they set the slots directly instead. The result is the same
    (equality, hashing, immutability); the field check below keeps the two in step.
    """
    names = tuple(f.name for f in dataclasses.fields(PartitionTraffic))
    if names != ("topic", "topic_id", "partition", "records", "bytes", "error_code"):
        raise AssertionError(f"update _fast_constructor for PartitionTraffic fields {names}")
    new = object.__new__
    cls = PartitionTraffic
    set_topic, set_topic_id, set_partition, set_records, set_bytes, set_error_code = (
        getattr(cls, name).__set__ for name in names  # the slots' member descriptors
    )

    def build(
        topic: str | None, topic_id: bytes | None, partition: int, records: int | None, size: int, error: int
    ) -> PartitionTraffic:
        traffic: PartitionTraffic = new(cls)
        set_topic(traffic, topic)
        set_topic_id(traffic, topic_id)
        set_partition(traffic, partition)
        set_records(traffic, records)
        set_bytes(traffic, size)
        set_error_code(traffic, error)
        return traffic

    return build


_traffic: Final = _fast_constructor()


_MAGIC_OFFSET = 16  # baseOffset int64, batchLength int32, partitionLeaderEpoch int32, then magic


def count_records(buf: bytes, start: int, end: int) -> int | None:
    """Sum of the record counts of the complete magic-v2 batches in buf[start:end], reading
    headers only.

    0 for an empty record set. A partial last batch (a broker cuts a Fetch response at max_bytes
    mid-batch; clients drop the partial batch) is not counted. None if a batch is not magic 2, its
    length is impossible, or its count is negative. O(batches); nothing is copied.
    """
    total = 0
    pos = start
    unpack_header = _BATCH_HEADER.unpack_from
    while pos < end:
        if end - pos < BATCH_HEADER_BYTES:
            if end - pos > _MAGIC_OFFSET and buf[pos + _MAGIC_OFFSET] != _MAGIC_V2:
                return None  # a short legacy (magic 0/1) message, not a cut v2 batch
            return total  # a partial header: not a batch the client gets
        batch_length, magic, count = unpack_header(buf, pos)
        pos += _LOG_OVERHEAD + batch_length
        if magic != _MAGIC_V2 or batch_length < _MIN_BATCH_LENGTH or count < 0:
            return None
        if pos > end:
            return total  # a partial batch
        total += count
    return total


def _read_records(payload: bytes, pos: int, flexible: bool, what: str) -> tuple[int, int]:
    """A (nullable) records field -> (start, end) of its bytes, empty when null. No copy.

    Compact lengths of up to 3 bytes (record sets under 2 MiB) are decoded inline.
    """
    n = len(payload)
    if flexible:
        if pos + 3 <= n and payload[pos] < 0x80:
            length_plus_one = payload[pos]
            pos += 1
        elif pos + 3 <= n and payload[pos + 1] < 0x80:
            length_plus_one = (payload[pos] & 0x7F) | payload[pos + 1] << 7
            pos += 2
        elif pos + 3 <= n and payload[pos + 2] < 0x80:
            length_plus_one = (payload[pos] & 0x7F) | (payload[pos + 1] & 0x7F) << 7 | payload[pos + 2] << 14
            pos += 3
        else:
            length_plus_one, pos = read_uvarint(payload, pos, what)
        length = length_plus_one - 1 if length_plus_one else 0
    else:
        if pos + 4 > n:
            raise truncated(what, pos, 4, n)
        length = I32.unpack_from(payload, pos)[0]
        pos += 4
        if length < 0:
            if length != -1:
                raise DecodeError(f"malformed {what}: negative length {length}", pos - 4)
            length = 0
    end = pos + length
    if end > n:
        raise truncated(what, pos, length, n)
    return pos, end


def _read_topic(
    payload: bytes, pos: int, by_id: bool, flexible: bool, what: str
) -> tuple[str | None, bytes | None, int]:
    if by_id:
        end = skip(payload, pos, _UUID_BYTES, f"{what} topic_id")
        return None, payload[pos:end], end
    name, pos = read_string(payload, pos, flexible, f"{what} topic name")
    return name, None, pos


def _check_end(payload: bytes, pos: int, what: str) -> None:
    if pos != len(payload):
        raise DecodeError(f"{what} layout mismatch: {len(payload) - pos} trailing bytes", pos)


# --- Produce ------------------------------------------------------------------------------------


def produce_request_partitions(payload: bytes, header: RequestHeader) -> list[PartitionTraffic]:
    """Per-partition traffic of a Produce request v3-v13, in wire order (error_code always 0).

    Raises UnsupportedVersion outside v3-v13, DecodeError if the layout does not add up (including
    trailing bytes), ValueError if `header` is not a Produce request header.
    """
    if header.api_key != ApiKey.PRODUCE:
        raise ValueError(f"not a Produce request: api_key={header.api_key}")
    version = header.api_version
    if version not in PRODUCE_REQUEST_VERSIONS:
        raise UnsupportedVersion(ApiKey.PRODUCE, version, "produce request layout not verified")
    flexible = version >= 9
    by_id = version >= 13
    pos = skip_string(payload, header.body_offset, flexible, "produce transactional_id")
    pos = skip(payload, pos, 6, "produce acks, timeout_ms")
    min_topic = ((_UUID_BYTES if by_id else 1) + 2) if flexible else 6  # name or id, array, tags
    n_topics, pos = read_array_len(payload, pos, flexible, "produce topic_data", min_topic)
    out: list[PartitionTraffic] = []
    for _ in range(n_topics):
        topic, topic_id, pos = _read_topic(payload, pos, by_id, flexible, "produce")
        n_parts, pos = read_array_len(payload, pos, flexible, "produce partition_data", 6 if flexible else 8)
        for _ in range(n_parts):
            index = read_i32(payload, pos, "produce partition index")
            start, pos = _read_records(payload, pos + 4, flexible, "produce records")
            out.append(_traffic(topic, topic_id, index, count_records(payload, start, pos), pos - start, 0))
            if flexible:
                pos = skip_tagged_fields(payload, pos, "produce partition tags")
        if flexible:
            pos = skip_tagged_fields(payload, pos, "produce topic tags")
    if flexible:
        pos = skip_tagged_fields(payload, pos, "produce request tags")
    _check_end(payload, pos, f"produce v{version} request")
    return out


def produce_response_errors(payload: bytes, api_version: int) -> list[int]:
    """Distinct non-zero partition error codes of a Produce response v1-v13, in order of appearance.

    The same walk as the v9+ throttle patch (`produce_throttle_offset_walk`). Raises
    UnsupportedVersion outside v1-v13 and DecodeError if the layout does not add up.
    """
    return produce_response_summary(payload, api_version)[0]


def produce_response_summary(payload: bytes, api_version: int) -> tuple[list[int], int]:
    """(`produce_response_errors`, throttle_time_ms) of a Produce response v1-v13, from one walk
    (reading the throttle time apart walks a v9+ response a second time). Raises as
    `produce_response_errors` does."""
    if api_version not in PRODUCE_RESPONSE_VERSIONS:
        raise UnsupportedVersion(ApiKey.PRODUCE, api_version, "produce response layout not verified")
    body = response_body_offset(payload, response_header_version(ApiKey.PRODUCE, api_version))
    errors: list[int] = []
    offset = produce_throttle_offset_walk(payload, body, api_version, errors)
    throttle_time_ms: int = I32.unpack_from(payload, offset)[0]
    return errors, throttle_time_ms


# --- Fetch --------------------------------------------------------------------------------------


def fetch_response_partitions(payload: bytes, api_version: int) -> tuple[int, list[PartitionTraffic]]:
    """(top-level error_code, per-partition traffic) of a Fetch response v4-v18, in wire order.

    The top-level error_code exists from v7 (0 before). Partition tagged fields (diverging_epoch,
    current_leader, snapshot_id, and any unknown tag) are skipped; so is the top-level tag section.
    Raises UnsupportedVersion outside v4-v18 and DecodeError if the layout does not add up.
    """
    if api_version not in FETCH_RESPONSE_VERSIONS:
        raise UnsupportedVersion(ApiKey.FETCH, api_version, "fetch response layout not verified")
    flexible = api_version >= 12
    by_id = api_version >= 13
    pos = response_body_offset(payload, response_header_version(ApiKey.FETCH, api_version))
    pos = skip(payload, pos, 4, "fetch throttle_time_ms")
    top_error = 0
    if api_version >= 7:
        top_error = read_i16(payload, pos, "fetch error_code")
        pos = skip(payload, pos, 6, "fetch error_code, session_id")
    # partition_index, error_code, high_watermark, last_stable_offset, log_start_offset (v5+)
    fixed = 30 if api_version >= 5 else 22
    after_aborted = 4 if api_version >= 11 else 0  # preferred_read_replica
    # the fixed part plus the shortest aborted_transactions, records and tag section
    min_partition = fixed + after_aborted + (3 if flexible else 8)
    min_topic = ((_UUID_BYTES if by_id else 1) + 2) if flexible else 6  # name or id, array, tags
    n_topics, pos = read_array_len(payload, pos, flexible, "fetch responses", min_topic)
    n = len(payload)
    unpack_head = _PARTITION_HEAD.unpack_from
    out: list[PartitionTraffic] = []
    for _ in range(n_topics):
        topic, topic_id, pos = _read_topic(payload, pos, by_id, flexible, "fetch")
        n_parts, pos = read_array_len(payload, pos, flexible, "fetch partitions", min_partition)
        for _ in range(n_parts):
            # The hot loop: the usual cases (null or empty aborted_transactions, record set lengths
            # under 2 MiB, empty tag sections) are read inline; the rest goes through the helpers.
            if pos + fixed + 1 > n:
                raise truncated("fetch partition", pos, fixed + 1, n)
            index, error_code = unpack_head(payload, pos)
            pos += fixed
            if flexible and payload[pos] <= 1:  # aborted_transactions: null or empty
                pos += 1
            else:
                n_aborted, pos = read_array_len(payload, pos, flexible, "fetch aborted_transactions", 16)
                if flexible:
                    for _ in range(n_aborted):
                        pos = skip(payload, pos, 16, "fetch aborted_transaction")
                        pos = skip_tagged_fields(payload, pos, "fetch aborted_transaction tags")
                else:
                    pos = skip(payload, pos, 16 * n_aborted, "fetch aborted_transactions")
            start, pos = _read_records(payload, pos + after_aborted, flexible, "fetch records")
            records = count_records(payload, start, pos) if pos > start else 0
            out.append(_traffic(topic, topic_id, index, records, pos - start, error_code))
            if flexible:
                if pos < n and payload[pos] == 0:  # partition tags: none
                    pos += 1
                else:
                    pos = skip_tagged_fields(payload, pos, "fetch partition tags")
        if flexible:
            pos = skip_tagged_fields(payload, pos, "fetch topic tags")
    if flexible:
        pos = skip_tagged_fields(payload, pos, "fetch response tags")
    _check_end(payload, pos, f"fetch v{api_version} response")
    return top_error, out


# --- Off the hot path: kio decodes --------------------------------------------------------------


def topic_ids_from_metadata_response(payload: bytes, api_version: int) -> dict[bytes, str]:
    """Map topic_id (16 bytes) -> name from a Metadata response v10+, for Produce v13 / Fetch v13+.

    Topics without an id (all-zero uuid) or without a name are left out. Versions 0-9 carry no ids:
    the map is empty (the payload is not read). A full kio decode: raises UnsupportedVersion for
    versions kio lacks and DecodeError for bad input (including tagged fields kio does not know).
    """
    if 0 <= api_version < METADATA_TOPIC_IDS_SINCE:
        return {}
    body = decode_response_body(payload, ApiKey.METADATA, api_version)
    return {
        topic.topic_id.bytes: topic.name
        for topic in body.topics or ()  # kio reads a null array (-1 length) as None
        if topic.topic_id is not None and topic.topic_id.int != 0 and topic.name is not None
    }


def response_error_codes(payload: bytes, api_key: int, api_version: int) -> list[int]:
    """Distinct non-zero error codes anywhere in a response, in order of appearance (kio decode).

    Every field named `error_code`, or ending in `_error_code` (AddPartitionsToTxn's
    partition_error_code, ShareFetch's acknowledge_error_code, CreateTopics' topic_config_error_code),
    at any depth. ApiVersions has one error code, the first field after its header (always
    header v0), so it is read there without a decode: a decode of its ~100 API entries cost the
    access-log writer most of 370 µs a record, and an UNSUPPORTED_VERSION answer may be in the v0
    format whatever version was asked for anyway. Raises UnsupportedVersion for APIs and versions
    kio lacks and DecodeError for bad input (kio also refuses unknown tagged fields and error codes
    newer than its enum).
    """
    if api_key == ApiKey.API_VERSIONS:
        code = read_i16(payload, 4, "api_versions error_code")
        return [code] if code else []
    body = decode_response_body(payload, api_key, api_version)
    found: list[int] = []
    _collect_error_codes(body, found)
    return found


@functools.cache
def _entity_fields(cls: type) -> tuple[tuple[str, bool], ...]:
    """(field name, is an error code) for each field of a kio entity class."""
    return tuple(
        (f.name, f.name == "error_code" or f.name.endswith("_error_code")) for f in dataclasses.fields(cls)
    )


def _collect_error_codes(value: Any, found: list[int]) -> None:
    if isinstance(value, tuple):
        for item in value:
            _collect_error_codes(item, found)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for name, is_error in _entity_fields(type(value)):
            field_value = getattr(value, name)
            if is_error:
                code = int(field_value)
                if code and code not in found:
                    found.append(code)
            elif isinstance(field_value, tuple) or dataclasses.is_dataclass(field_value):
                _collect_error_codes(field_value, found)
