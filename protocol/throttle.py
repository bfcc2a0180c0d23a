"""Finding and patching `throttle_time_ms` in response payloads, without decoding them.

The proxy throttles like a broker: it writes max(broker's value, its own) into the response and
mutes the client. Decoding and re-encoding a Fetch response with kio costs ~200 µs per 640 KB; the
field sits at a computable offset, so it is patched in place instead (~1 µs) and only those 4 bytes
change. Where the field sits (offsets relative to the payload, which starts at correlation_id):

* most APIs: the first body field, i.e. right after the response header (4, or 4 + the header's
  tag section for flexible versions), from the version listed in `_FIRST_FIELD_SINCE`;
* Fetch: first field from v1;
* Produce: after the `responses` array: the last 4 bytes in v1-8; in v9+ a tag section follows
  (NodeEndpoints, v10+), so the array is walked (skipping unknown tags generically);
* ApiVersions: after error_code and api_keys (v1+). A broker answers an ApiVersions version it does
  not support with a *v0-format* UNSUPPORTED_VERSION response, which has no throttle field;
* delegation-token APIs 38-41 and OffsetDelete (47): after a few fixed or walkable fields.

Versions above the highest one Kafka 4.3.1 (and kio 0.6.5) define raise `UnsupportedVersion`: a
later version might move the field, and a wrong guess would corrupt 4 bytes of someone's response.
"""

from __future__ import annotations

import struct
from typing import Final

from protocol._wire import (
    I16,
    I32,
    INT32_MAX,
    read_array_len,
    read_i16,
    read_i32,
    skip,
    skip_bytes,
    skip_string,
    skip_tagged_fields,
    truncated,
)
from protocol.apis import ApiKey, is_flexible, response_header_version
from protocol.errors import DecodeError, UnsupportedVersion
from protocol.headers import response_body_offset

# Highest version per API key that Kafka 4.3.1 defines (= kio 0.6.5's schema snapshot); the layouts
# below are verified up to these. Keys 4-7 (removed in Kafka 4.0) have no throttle field.
MAX_KNOWN_RESPONSE_VERSION: Final[dict[int, int]] = {
    0: 13, 1: 18, 2: 11, 3: 13, 4: 7, 5: 4, 6: 8, 7: 3, 8: 10, 9: 10, 10: 6, 11: 9, 12: 4, 13: 5,
    14: 5, 15: 6, 16: 5, 17: 1, 18: 4, 19: 7, 20: 6, 21: 2, 22: 6, 23: 4, 24: 5, 25: 4, 26: 5,
    27: 2, 28: 5, 29: 3, 30: 3, 31: 3, 32: 4, 33: 2, 34: 2, 35: 5, 36: 2, 37: 3, 38: 3, 39: 2,
    40: 2, 41: 3, 42: 2, 43: 2, 44: 1, 45: 1, 46: 0, 47: 0, 48: 1, 49: 1, 50: 0, 51: 0, 52: 2,
    53: 1, 54: 1, 55: 2, 56: 3, 57: 2, 58: 0, 59: 1, 60: 2, 61: 0, 62: 4, 63: 2, 64: 0, 65: 0,
    66: 2, 67: 0, 68: 1, 69: 1, 70: 0, 71: 0, 72: 0, 73: 0, 74: 1, 75: 0, 76: 1, 77: 1, 78: 2,
    79: 2, 80: 1, 81: 0, 82: 0, 83: 0, 84: 0, 85: 1, 86: 0, 87: 1, 88: 0, 89: 0, 90: 1, 91: 0,
    92: 0,
}  # fmt: skip

# API key -> first version whose response starts with throttle_time_ms (Kafka's message JSON,
# `ThrottleTimeMs` "versions"). Keys absent here and not handled specially have no such field:
# LeaderAndIsr, StopReplica, UpdateMetadata, ControlledShutdown, SaslHandshake, WriteTxnMarkers,
# SaslAuthenticate, Vote, BeginQuorumEpoch, EndQuorumEpoch, DescribeQuorum, Envelope and the
# share-group state RPCs 83-87.
_FIRST_FIELD_SINCE: Final[dict[int, int]] = {
    ApiKey.FETCH: 1, ApiKey.LIST_OFFSETS: 2, ApiKey.METADATA: 3, ApiKey.OFFSET_COMMIT: 3,
    ApiKey.OFFSET_FETCH: 3, ApiKey.FIND_COORDINATOR: 1, ApiKey.JOIN_GROUP: 2, ApiKey.HEARTBEAT: 1,
    ApiKey.LEAVE_GROUP: 1, ApiKey.SYNC_GROUP: 1, ApiKey.DESCRIBE_GROUPS: 1, ApiKey.LIST_GROUPS: 1,
    ApiKey.CREATE_TOPICS: 2, ApiKey.DELETE_TOPICS: 1, ApiKey.DELETE_RECORDS: 0,
    ApiKey.INIT_PRODUCER_ID: 0, ApiKey.OFFSET_FOR_LEADER_EPOCH: 2, ApiKey.ADD_PARTITIONS_TO_TXN: 0,
    ApiKey.ADD_OFFSETS_TO_TXN: 0, ApiKey.END_TXN: 0, ApiKey.TXN_OFFSET_COMMIT: 0,
    ApiKey.DESCRIBE_ACLS: 0, ApiKey.CREATE_ACLS: 0, ApiKey.DELETE_ACLS: 0,
    ApiKey.DESCRIBE_CONFIGS: 0, ApiKey.ALTER_CONFIGS: 0, ApiKey.ALTER_REPLICA_LOG_DIRS: 0,
    ApiKey.DESCRIBE_LOG_DIRS: 0, ApiKey.CREATE_PARTITIONS: 0, ApiKey.DELETE_GROUPS: 0,
    ApiKey.ELECT_LEADERS: 0, ApiKey.INCREMENTAL_ALTER_CONFIGS: 0,
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: 0, ApiKey.LIST_PARTITION_REASSIGNMENTS: 0,
    ApiKey.DESCRIBE_CLIENT_QUOTAS: 0, ApiKey.ALTER_CLIENT_QUOTAS: 0,
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: 0, ApiKey.ALTER_USER_SCRAM_CREDENTIALS: 0,
    ApiKey.ALTER_PARTITION: 0, ApiKey.UPDATE_FEATURES: 0, ApiKey.FETCH_SNAPSHOT: 0,
    ApiKey.DESCRIBE_CLUSTER: 0, ApiKey.DESCRIBE_PRODUCERS: 0, ApiKey.BROKER_REGISTRATION: 0,
    ApiKey.BROKER_HEARTBEAT: 0, ApiKey.UNREGISTER_BROKER: 0, ApiKey.DESCRIBE_TRANSACTIONS: 0,
    ApiKey.LIST_TRANSACTIONS: 0, ApiKey.ALLOCATE_PRODUCER_IDS: 0,
    ApiKey.CONSUMER_GROUP_HEARTBEAT: 0, ApiKey.CONSUMER_GROUP_DESCRIBE: 0,
    ApiKey.CONTROLLER_REGISTRATION: 0, ApiKey.GET_TELEMETRY_SUBSCRIPTIONS: 0,
    ApiKey.PUSH_TELEMETRY: 0, ApiKey.ASSIGN_REPLICAS_TO_DIRS: 0, ApiKey.LIST_CONFIG_RESOURCES: 0,
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: 0, ApiKey.SHARE_GROUP_HEARTBEAT: 0,
    ApiKey.SHARE_GROUP_DESCRIBE: 0, ApiKey.SHARE_FETCH: 0, ApiKey.SHARE_ACKNOWLEDGE: 0,
    ApiKey.ADD_RAFT_VOTER: 0, ApiKey.REMOVE_RAFT_VOTER: 0, ApiKey.UPDATE_RAFT_VOTER: 0,
    ApiKey.STREAMS_GROUP_HEARTBEAT: 0, ApiKey.STREAMS_GROUP_DESCRIBE: 0,
    ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: 0, ApiKey.ALTER_SHARE_GROUP_OFFSETS: 0,
    ApiKey.DELETE_SHARE_GROUP_OFFSETS: 0,
}  # fmt: skip

_UNSUPPORTED_VERSION_ERROR: Final = 35  # Kafka's UNSUPPORTED_VERSION error code


def throttle_time_offset(payload: bytes, api_key: int, api_version: int) -> int | None:
    """Offset of throttle_time_ms in this response payload; None if this version has none.

    Raises UnsupportedVersion for unknown API keys and versions above the verified range, and
    DecodeError if the payload is too short or its structure does not add up.
    """
    if api_key == ApiKey.API_VERSIONS and _is_api_versions_v0_fallback(payload):
        return None  # whatever version was asked for, the answer is in the v0 format
    max_version = MAX_KNOWN_RESPONSE_VERSION.get(api_key)
    if max_version is None or not 0 <= api_version <= max_version:
        raise UnsupportedVersion(api_key, api_version, "throttle_time_ms position not verified")
    body = response_body_offset(payload, response_header_version(api_key, api_version))
    since = _FIRST_FIELD_SINCE.get(api_key)
    if since is not None:
        offset: int | None = body if api_version >= since else None
    elif api_key == ApiKey.PRODUCE:
        offset = _produce_offset(payload, body, api_version)
    elif api_key == ApiKey.API_VERSIONS:
        offset = _api_versions_offset(payload, body, api_version)
    elif api_key in (ApiKey.RENEW_DELEGATION_TOKEN, ApiKey.EXPIRE_DELEGATION_TOKEN):
        offset = body + 10  # error_code int16, expiry_timestamp_ms int64
    elif api_key == ApiKey.OFFSET_DELETE:
        offset = body + 2  # error_code int16
    elif api_key == ApiKey.CREATE_DELEGATION_TOKEN:
        offset = _create_delegation_token_offset(payload, body, api_version)
    elif api_key == ApiKey.DESCRIBE_DELEGATION_TOKEN:
        offset = _describe_delegation_token_offset(payload, body, api_version)
    else:
        offset = None
    if offset is not None and offset + 4 > len(payload):
        raise truncated("throttle_time_ms", offset, 4, len(payload))
    return offset


def read_throttle_time_ms(payload: bytes, api_key: int, api_version: int) -> int | None:
    """The response's throttle_time_ms, or None if this version has no such field."""
    offset = throttle_time_offset(payload, api_key, api_version)
    if offset is None:
        return None
    value: int = I32.unpack_from(payload, offset)[0]
    return value


def plan_throttle_patch(
    payload: bytes, api_key: int, api_version: int, throttle_time_ms: int
) -> tuple[int, bytes] | None:
    """(offset, 4 new bytes) that raise throttle_time_ms to `throttle_time_ms`, or None if no change.

    For zero-copy forwarding: write `view[:offset]`, the 4 bytes, then `view[offset + 4:]`. For
    APIs whose throttle field is the first body field (Fetch included) a prefix of the payload that
    covers the header and those 4 bytes is enough, so a cut-through proxy can patch the first chunk.
    """
    offset = throttle_time_offset(payload, api_key, api_version)
    if offset is None:
        return None
    current: int = I32.unpack_from(payload, offset)[0]
    wanted = min(throttle_time_ms, INT32_MAX)
    if wanted <= current:
        return None
    return offset, I32.pack(wanted)


def patch_throttle_time(
    payload: bytes, api_key: int, api_version: int, throttle_time_ms: int
) -> bytes:
    """Return the payload with throttle_time_ms = max(its value, `throttle_time_ms`).

    Only those 4 bytes can change. The payload is returned as is (same object) if the version has
    no throttle field or the existing value is already at least `throttle_time_ms`. Values above
    2**31-1 are clamped to it.
    """
    patch = plan_throttle_patch(payload, api_key, api_version, throttle_time_ms)
    if patch is None:
        return payload
    offset, new_bytes = patch
    with memoryview(payload) as view:  # slices of a view are not copies: one copy in all
        return b"".join((view[:offset], new_bytes, view[offset + 4 :]))


# --- Produce ------------------------------------------------------------------------------------


def _produce_offset(payload: bytes, body: int, api_version: int) -> int | None:
    if api_version == 0:
        return None
    if api_version <= 8:
        # Non-flexible: throttle_time_ms is the last field of the message.
        offset = len(payload) - 4
        if offset < body + 4:  # at least the responses array length precedes it
            raise truncated("produce response", body, 8, len(payload))
        return offset
    return produce_throttle_offset_walk(payload, body, api_version)


def produce_throttle_offset_walk(
    payload: bytes, body: int, api_version: int, errors: list[int] | None = None
) -> int:
    """Walk a Produce response (v1-v13) to its throttle_time_ms; check that the layout adds up.

    Per partition: index int32, error_code int16, base_offset int64, log_append_time_ms int64 (v2+),
    log_start_offset int64 (v5+), record_errors[] and error_message (v8+), tags (v9+). Unknown
    tagged fields are skipped at every level. The walk must end exactly at the end of the payload.

    If `errors` is given, each distinct non-zero partition error_code is appended to it in order of
    first appearance (`protocol.records.produce_response_errors` is this walk); the throttle path
    passes None and pays one `is None` test per partition for sharing the code.
    """
    if api_version >= 9:
        offset, end = _produce_walk_flexible(payload, body, api_version, errors)
    else:
        offset, end = _produce_walk_legacy(payload, body, api_version, errors)
    if end != len(payload):
        raise DecodeError(
            f"produce v{api_version} response layout mismatch: {len(payload) - end} trailing bytes", end
        )
    return offset


def _note_error(errors: list[int], payload: bytes, pos: int) -> None:
    code: int = I16.unpack_from(payload, pos)[0]
    if code and code not in errors:
        errors.append(code)


def _produce_walk_legacy(
    payload: bytes, body: int, api_version: int, errors: list[int] | None
) -> tuple[int, int]:
    # v1-v8 throttle code takes the last 4 bytes; this walk cross-checks that and collects errors.
    fixed = 14 + (8 if api_version >= 2 else 0) + (8 if api_version >= 5 else 0)
    n_topics, pos = read_array_len(payload, body, False, "produce responses", 2)
    for _ in range(n_topics):
        pos = skip_string(payload, pos, False, "produce topic name")
        n_parts, pos = read_array_len(payload, pos, False, "produce partition_responses", fixed)
        for _ in range(n_parts):
            start, pos = pos, skip(payload, pos, fixed, "produce partition response")
            if errors is not None:
                _note_error(errors, payload, start + 4)
            if api_version >= 8:
                n_errors, pos = read_array_len(payload, pos, False, "produce record_errors", 6)
                for _ in range(n_errors):
                    pos = skip_string(payload, pos + 4, False, "produce batch_index_error_message")
                pos = skip_string(payload, pos, False, "produce error_message")
    return pos, skip(payload, pos, 4, "produce throttle_time_ms")


def _produce_walk_flexible(
    payload: bytes, body: int, api_version: int, errors: list[int] | None
) -> tuple[int, int]:
    # The hot path for v9+ (every response to a modern producer), so the common cases are inlined:
    # one-byte varints (arrays under 127 items, strings under 127 bytes), no record errors, a null
    # error message and empty tag sections. Everything else goes through the bounds-checked
    # helpers. Running off the end raises IndexError (turned into DecodeError) or is caught by the
    # caller's final length check.
    n = len(payload)
    try:
        pos = body
        byte = payload[pos]
        if byte < 0x80:
            n_topics, pos = byte - 1, pos + 1  # 0 = null array: no topics
        else:
            n_topics, pos = read_array_len(payload, pos, True, "produce responses", 2)
        for _ in range(n_topics):
            if api_version >= 13:
                pos += 16  # topic_id (uuid)
            else:
                byte = payload[pos]  # topic name: compact string, length + 1
                pos = pos + max(byte, 1) if byte < 0x80 else skip_string(payload, pos, True, "produce topic")
            byte = payload[pos]
            if byte < 0x80:
                n_partitions, pos = byte - 1, pos + 1
            else:
                n_partitions, pos = read_array_len(payload, pos, True, "produce partition_responses", 30)
            for _ in range(n_partitions):
                if errors is not None and (payload[pos + 4] or payload[pos + 5]):  # error_code != 0
                    _note_error(errors, payload, pos + 4)
                pos += 30  # index, error_code, base_offset, log_append_time_ms, log_start_offset
                if payload[pos] == 1:  # record_errors: empty
                    pos += 1
                else:
                    n_errors, pos = read_array_len(payload, pos, True, "produce record_errors", 6)
                    for _ in range(n_errors):
                        pos = skip_string(payload, pos + 4, True, "produce batch_index_error_message")
                        pos = skip_tagged_fields(payload, pos, "produce record_error tags")
                if payload[pos] == 0:  # error_message: null
                    pos += 1
                else:
                    pos = skip_string(payload, pos, True, "produce error_message")
                if payload[pos] == 0:  # partition tags: none (current_leader comes with errors)
                    pos += 1
                else:
                    pos = skip_tagged_fields(payload, pos, "produce partition tags")
            pos = skip_tagged_fields(payload, pos, "produce topic tags")
    except (IndexError, struct.error) as exc:  # struct.error: an error_code cut after its first byte
        raise DecodeError(f"truncated produce v{api_version} response", n) from exc
    end = skip(payload, pos, 4, "produce throttle_time_ms")
    return pos, skip_tagged_fields(payload, end, "produce response tags")


# --- ApiVersions --------------------------------------------------------------------------------


def _is_api_versions_v0_fallback(payload: bytes) -> bool:
    # A broker that does not support the request's ApiVersions version answers UNSUPPORTED_VERSION
    # in the v0 format, which has no throttle_time_ms (Kafka's ApiVersionsResponse.parse falls back
    # to v0 the same way: it parses the real version first and v0 only if that fails). The header
    # is always v0, so the error code is at offset 4. A response of the requested version may carry
    # the same error (then with its throttle field): it is the v0 fallback only if the v0 layout,
    # error_code and api_keys[] of 6 bytes each, spans exactly the whole payload.
    if read_i16(payload, 4, "api_versions error_code") != _UNSUPPORTED_VERSION_ERROR:
        return False
    if len(payload) < 10:
        return True
    count = read_i32(payload, 6, "api_versions api_keys length")
    return count >= 0 and 10 + 6 * count == len(payload)


def _api_versions_offset(payload: bytes, body: int, api_version: int) -> int | None:
    if api_version == 0:
        return None
    flexible = api_version >= 3
    entry_bytes = 7 if flexible else 6  # api_key, min_version, max_version (+ tags)
    count, pos = read_array_len(payload, body + 2, flexible, "api_versions api_keys", entry_bytes)
    if flexible:
        for _ in range(count):
            pos = skip_tagged_fields(payload, skip(payload, pos, 6, "api_versions entry"))
    else:
        pos = skip(payload, pos, 6 * count, "api_versions api_keys")
    return pos


# --- Delegation tokens --------------------------------------------------------------------------


def _create_delegation_token_offset(payload: bytes, body: int, api_version: int) -> int:
    # error_code, principal_type, principal_name, [v3+ token_requester_principal_type and name],
    # issue/expiry/max timestamps (3 x int64), token_id, hmac, then throttle_time_ms.
    flexible = is_flexible(ApiKey.CREATE_DELEGATION_TOKEN, api_version)
    pos = skip(payload, body, 2, "create_delegation_token error_code")
    for _ in range(4 if api_version >= 3 else 2):
        pos = skip_string(payload, pos, flexible, "create_delegation_token principal")
    pos = skip(payload, pos, 24, "create_delegation_token timestamps")
    pos = skip_string(payload, pos, flexible, "create_delegation_token token_id")
    return skip_bytes(payload, pos, flexible, "create_delegation_token hmac")


def _describe_delegation_token_offset(payload: bytes, body: int, api_version: int) -> int:
    # error_code, tokens[] (as in CreateDelegationToken plus renewers[]), then throttle_time_ms.
    flexible = is_flexible(ApiKey.DESCRIBE_DELEGATION_TOKEN, api_version)
    pos = skip(payload, body, 2, "describe_delegation_token error_code")
    n_tokens, pos = read_array_len(payload, pos, flexible, "describe_delegation_token tokens", 28)
    for _ in range(n_tokens):
        for _ in range(4 if api_version >= 3 else 2):
            pos = skip_string(payload, pos, flexible, "describe_delegation_token principal")
        pos = skip(payload, pos, 24, "describe_delegation_token timestamps")
        pos = skip_string(payload, pos, flexible, "describe_delegation_token token_id")
        pos = skip_bytes(payload, pos, flexible, "describe_delegation_token hmac")
        n_renewers, pos = read_array_len(payload, pos, flexible, "describe_delegation_token renewers", 2)
        for _ in range(n_renewers):
            pos = skip_string(payload, pos, flexible, "describe_delegation_token renewer type")
            pos = skip_string(payload, pos, flexible, "describe_delegation_token renewer name")
            if flexible:
                pos = skip_tagged_fields(payload, pos)
        if flexible:
            pos = skip_tagged_fields(payload, pos)
    return pos

