"""Share groups (KIP-932, queues on Kafka): the parts of ShareFetch and ShareAcknowledge Sluice touches.

* **Broker addresses.** Both responses end with `node_endpoints` (a regular array, not a tagged
  field as in Fetch): the current leader of every partition answered NOT_LEADER_OR_FOLLOWER or
  FENCED_LEADER_EPOCH, so that the share consumer goes there without a Metadata round trip. Left
  alone they would send clients straight to the brokers. They are rewritten like every other
  broker entry (`protocol.rewrite`: only the node_id/host/port runs are re-encoded; records,
  acquired-record ranges, racks and tag sections are copied byte for byte).
* **max_bytes** of a ShareFetch request is lowered to what the consumer's fetch quota allows in one
  window, as the broker does for share fetches (`KafkaApis.handleFetchFromShareFetchRequest`:
  min(request max_bytes, fetch.max.bytes, quotas.fetch.maxValueInQuotaWindow)), min_bytes with it.

Response layouts (Kafka 4.3.1's `ShareFetchResponse.json` / `ShareAcknowledgeResponse.json`, always
flexible; v0 was 4.0's early access, removed in 4.1 and laid out as v1 without the lock timeout):

    ShareFetch       throttle_time_ms i32, error_code i16, error_message str?,
                     acquisition_lock_timeout_ms i32 (v1+),
                     responses[topic_id uuid, partitions[partition_index i32, error_code i16,
                       error_message str?, acknowledge_error_code i16, acknowledge_error_message str?,
                       current_leader{leader_id i32, leader_epoch i32, tags}, records bytes?,
                       acquired_records[first_offset i64, last_offset i64, delivery_count i16, tags],
                       tags], tags],
                     node_endpoints[node_id i32, host str, port i32, rack str?, tags], tags
    ShareAcknowledge throttle_time_ms i32, error_code i16, error_message str?,
                     acquisition_lock_timeout_ms i32 (v2+),
                     responses[topic_id uuid, partitions[partition_index i32, error_code i16,
                       error_message str?, current_leader{leader_id i32, leader_epoch i32, tags},
                       tags], tags],
                     node_endpoints[...as above], tags
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from protocol._wire import (
    I32,
    INT32_MAX,
    read_array_len,
    read_i16,
    read_i32,
    skip,
    skip_bytes,
    skip_string,
    skip_tagged_fields,
)
from protocol.apis import ApiKey
from protocol.errors import DecodeError, UnsupportedVersion
from protocol.fetch import FetchRequestTopics, _read_topics, cap_min_max_bytes
from protocol.headers import RequestHeader, response_body_offset
from protocol.records import PartitionTraffic, _read_records, count_records
from protocol.rewrite import (  # the address walker and splicer this package shares
    _NODE_ENDPOINT,
    AddressMapper,
    BrokerAddress,
    _Found,
    _splice,
    _walk_array,
)

SHARE_FETCH_MAX_VERSION: Final = 2       # Kafka 4.3.1 (= kio 0.6.5): ShareFetch v1-2 (v0 removed in 4.1)
SHARE_ACKNOWLEDGE_MAX_VERSION: Final = 2


def _check(api_key: int, api_version: int, highest: int) -> None:
    if not 0 <= api_version <= highest:
        raise UnsupportedVersion(api_key, api_version, "layout not verified")


def _skip_leader(payload: bytes, pos: int, what: str) -> int:
    pos = skip(payload, pos, 8, f"{what} current_leader")  # leader_id, leader_epoch
    return skip_tagged_fields(payload, pos, f"{what} current_leader tags")


def _endpoints_offset(payload: bytes, body: int, api: str, lock_timeout: bool, min_partition_bytes: int,
                      partition: Callable[[bytes, int, str], int]) -> int:
    """Where the node_endpoints of a ShareFetch or ShareAcknowledge response start: past the
    header fields and every topic's partitions (each walked by `partition`, its tags after)."""
    pos = skip(payload, body, 6, f"{api} throttle_time_ms, error_code")
    pos = skip_string(payload, pos, True, f"{api} error_message")
    if lock_timeout:
        pos = skip(payload, pos, 4, f"{api} acquisition_lock_timeout_ms")
    n_topics, pos = read_array_len(payload, pos, True, f"{api} responses", 18)
    for _ in range(n_topics):
        pos = skip(payload, pos, 16, f"{api} topic_id")
        n_partitions, pos = read_array_len(payload, pos, True, f"{api} partitions", min_partition_bytes)
        for _ in range(n_partitions):
            what = f"{api} partition"
            pos = partition(payload, skip(payload, pos, 6, what), what)  # partition_index, error_code
            pos = skip_tagged_fields(payload, pos, f"{what} tags")
        pos = skip_tagged_fields(payload, pos, f"{api} topic tags")
    return pos


def _share_fetch_partition(payload: bytes, pos: int, what: str) -> int:
    pos = skip_string(payload, pos, True, f"{what} error_message")
    pos = skip(payload, pos, 2, f"{what} acknowledge_error_code")
    pos = skip_string(payload, pos, True, f"{what} acknowledge_error_message")
    pos = _skip_leader(payload, pos, what)
    pos = skip_bytes(payload, pos, True, f"{what} records")
    n_acquired, pos = read_array_len(payload, pos, True, f"{what} acquired_records", 19)
    for _ in range(n_acquired):
        pos = skip(payload, pos, 18, f"{what} acquired_records entry")
        pos = skip_tagged_fields(payload, pos, f"{what} acquired_records tags")
    return pos


def _share_acknowledge_partition(payload: bytes, pos: int, what: str) -> int:
    pos = skip_string(payload, pos, True, f"{what} error_message")
    return _skip_leader(payload, pos, what)


def _share_fetch_endpoints_offset(payload: bytes, body: int, api_version: int) -> int:
    return _endpoints_offset(payload, body, "share_fetch", api_version >= 1, 21, _share_fetch_partition)


def _share_acknowledge_endpoints_offset(payload: bytes, body: int, api_version: int) -> int:
    return _endpoints_offset(payload, body, "share_acknowledge", api_version >= 2, 17,
                             _share_acknowledge_partition)


def _rewrite_endpoints(payload: bytes, pos: int, mapper: AddressMapper,
                       what: str) -> tuple[bytes, list[BrokerAddress]]:
    found: list[_Found] = []
    end = _walk_array(payload, pos, _NODE_ENDPOINT, True, found, f"{what} node_endpoints")
    end = skip_tagged_fields(payload, end, f"{what} tags")
    if end != len(payload):
        raise DecodeError(f"{what}: {len(payload) - end} trailing bytes", end)
    if not found:
        return payload, []
    return _splice(payload, found, True, mapper)


def rewrite_share_fetch_response(
    payload: bytes, api_version: int, mapper: AddressMapper
) -> tuple[bytes, list[BrokerAddress]]:
    """Map the leader endpoints of a ShareFetch response (v0-v2).

    Returns (new payload, the original brokers); (payload itself, []) when there are none, the
    usual case. Finding them means walking every partition; records are skipped by length.
    """
    _check(ApiKey.SHARE_FETCH, api_version, SHARE_FETCH_MAX_VERSION)
    body = response_body_offset(payload, 1)
    pos = _share_fetch_endpoints_offset(payload, body, api_version)
    return _rewrite_endpoints(payload, pos, mapper, "share_fetch")


def rewrite_share_acknowledge_response(
    payload: bytes, api_version: int, mapper: AddressMapper
) -> tuple[bytes, list[BrokerAddress]]:
    """Map the leader endpoints of a ShareAcknowledge response (v0-v2)."""
    _check(ApiKey.SHARE_ACKNOWLEDGE, api_version, SHARE_ACKNOWLEDGE_MAX_VERSION)
    body = response_body_offset(payload, 1)
    pos = _share_acknowledge_endpoints_offset(payload, body, api_version)
    return _rewrite_endpoints(payload, pos, mapper, "share_acknowledge")


def cap_share_fetch_max_bytes(payload: bytes, header: RequestHeader, max_bytes: int) -> bytes:
    """The ShareFetch request with max_bytes (and min_bytes) lowered to at most `max_bytes`.

    Request layout (v0-v2, flexible): group_id str?, member_id str?, share_session_epoch i32,
    max_wait_ms i32, min_bytes i32, max_bytes i32, ... Returns `payload` itself when nothing needs
    lowering. A renew-only request (v2 is_renew_ack) has max_bytes and min_bytes 0: it stays so.
    """
    if header.api_key != ApiKey.SHARE_FETCH:
        raise ValueError(f"not a ShareFetch request: api_key={header.api_key}")
    _check(ApiKey.SHARE_FETCH, header.api_version, SHARE_FETCH_MAX_VERSION)
    pos = skip_string(payload, header.body_offset, True, "share_fetch group_id")
    pos = skip_string(payload, pos, True, "share_fetch member_id")
    return cap_min_max_bytes(payload, pos + 8, max_bytes, "share_fetch")  # after epoch, max_wait_ms


def cap_share_fetch_max_records(payload: bytes, header: RequestHeader, max_records: int) -> bytes:
    """The ShareFetch request (v1-v2) with max_records (and batch_size, the broker's preferred
    acquisition size, never above it) lowered to at most `max_records` (at least 1): what a
    records quota allows in one fetch. Layout after member_id: share_session_epoch i32,
    max_wait_ms i32, min_bytes i32, max_bytes i32, max_records i32, batch_size i32. Returns
    `payload` itself when nothing needs lowering (and for v0, which has no max_records)."""
    if header.api_key != ApiKey.SHARE_FETCH:
        raise ValueError(f"not a ShareFetch request: api_key={header.api_key}")
    _check(ApiKey.SHARE_FETCH, header.api_version, SHARE_FETCH_MAX_VERSION)
    if header.api_version < 1:
        return payload
    pos = skip_string(payload, header.body_offset, True, "share_fetch group_id")
    pos = skip_string(payload, pos, True, "share_fetch member_id") + 16  # epoch, wait, min, max
    cap = max(1, min(max_records, INT32_MAX))
    current = read_i32(payload, pos, "share_fetch max_records")
    batch = read_i32(payload, pos + 4, "share_fetch batch_size")
    if current <= cap and batch <= cap:
        return payload
    out = bytearray(payload)
    I32.pack_into(out, pos, min(current, cap))
    I32.pack_into(out, pos + 4, min(batch, cap))
    return bytes(out)


def _skip_acknowledgements(payload: bytes, pos: int) -> int:
    """A ShareFetch request partition's acknowledgement_batches: [first_offset i64, last_offset
    i64, acknowledge_types[i8], tags]."""
    what = "share_fetch acknowledgement_batches"
    n_batches, pos = read_array_len(payload, pos, True, what, 18)
    for _ in range(n_batches):
        pos = skip(payload, pos, 16, what)
        n_types, pos = read_array_len(payload, pos, True, f"{what} acknowledge_types", 1)
        pos = skip_tagged_fields(payload, skip(payload, pos, n_types, what), f"{what} tags")
    return pos


def share_fetch_request_topics(payload: bytes, header: RequestHeader) -> FetchRequestTopics:
    """The topics (by id) and partitions a ShareFetch request (v1-v2) lists and forgets: what a
    topic quota needs to cap its max_bytes. `session_epoch` is the share session's (0 opens one,
    -1 closes it, above 0 an incremental request that lists only what changed).

    Layout: group_id str?, member_id str?, share_session_epoch i32, max_wait_ms i32, min_bytes i32,
    max_bytes i32, max_records i32, batch_size i32, share_acquire_mode i8 (v2), is_renew_ack bool
    (v2), topics[topic_id uuid, partitions[partition_index i32, acknowledgement_batches[...], tags],
    tags], forgotten_topics_data[topic_id uuid, partitions[i32], tags], tags. Raises
    UnsupportedVersion outside v1-v2 (v0 was 4.0's early access), DecodeError if it does not add up.
    """
    if header.api_key != ApiKey.SHARE_FETCH:
        raise ValueError(f"not a ShareFetch request: api_key={header.api_key}")
    if not 1 <= header.api_version <= SHARE_FETCH_MAX_VERSION:
        raise UnsupportedVersion(ApiKey.SHARE_FETCH, header.api_version, "topic layout not verified")
    pos = skip_string(payload, header.body_offset, True, "share_fetch group_id")
    pos = skip_string(payload, pos, True, "share_fetch member_id")
    epoch = read_i32(payload, pos, "share_fetch share_session_epoch")
    pos = skip(payload, pos, 24 + (2 if header.api_version >= 2 else 0), "share_fetch limits")
    topics, pos = _read_topics(payload, pos, True, True, "share_fetch", 0, partition_tags=True,
                               skip_partition_extra=_skip_acknowledgements)
    forgotten, pos = _read_topics(payload, pos, True, True, "share_fetch forgotten", None,
                                  partition_tags=False)
    return FetchRequestTopics(epoch, topics, forgotten)


def share_fetch_response_partitions(payload: bytes, api_version: int) -> list[PartitionTraffic]:
    """Per-partition traffic of a ShareFetch response (v0-v2), in wire order: topic id, partition,
    records (the batches' counts), record-set bytes, error code; what a Fetch response gives
    (`protocol.records.fetch_response_partitions`) for the topic and record quotas.

    Raises UnsupportedVersion outside v0-v2 and DecodeError if the layout does not add up.
    """
    _check(ApiKey.SHARE_FETCH, api_version, SHARE_FETCH_MAX_VERSION)
    api = "share_fetch"
    pos = skip(payload, response_body_offset(payload, 1), 6, f"{api} throttle_time_ms, error_code")
    pos = skip_string(payload, pos, True, f"{api} error_message")
    if api_version >= 1:
        pos = skip(payload, pos, 4, f"{api} acquisition_lock_timeout_ms")
    n_topics, pos = read_array_len(payload, pos, True, f"{api} responses", 18)
    out: list[PartitionTraffic] = []
    for _ in range(n_topics):
        topic_id = payload[pos:pos + 16]
        pos = skip(payload, pos, 16, f"{api} topic_id")
        n_partitions, pos = read_array_len(payload, pos, True, f"{api} partitions", 21)
        for _ in range(n_partitions):
            what = f"{api} partition"
            index = read_i32(payload, pos, what)
            error_code = read_i16(payload, pos + 4, what)
            pos = skip_string(payload, skip(payload, pos, 6, what), True, f"{what} error_message")
            pos = skip(payload, pos, 2, f"{what} acknowledge_error_code")
            pos = skip_string(payload, pos, True, f"{what} acknowledge_error_message")
            pos = _skip_leader(payload, pos, what)
            start, pos = _read_records(payload, pos, True, f"{what} records")
            records = count_records(payload, start, pos) if pos > start else 0
            record_bytes = pos - start
            n_acquired, pos = read_array_len(payload, pos, True, f"{what} acquired_records", 19)
            for _ in range(n_acquired):
                pos = skip(payload, pos, 18, f"{what} acquired_records entry")
                pos = skip_tagged_fields(payload, pos, f"{what} acquired_records tags")
            pos = skip_tagged_fields(payload, pos, f"{what} tags")
            out.append(PartitionTraffic(None, topic_id, index, records, record_bytes, error_code))
        pos = skip_tagged_fields(payload, pos, f"{api} topic tags")
    return out
