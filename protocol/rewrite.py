"""Control-plane rewrites: broker addresses in Metadata/FindCoordinator/DescribeCluster responses
(and in the KIP-951 leader endpoints of Produce v10+/Fetch v16+), and version caps in ApiVersions.

Clients learn where brokers are from these responses, so the proxy must replace each broker's host
and port with its own listener for that broker, or clients would connect around it. And it must cap
the versions it advertises to the ones its header-only code understands.

How: by splicing, not by decoding and re-encoding the whole message. Each broker entry is walked
with bounds-checked readers; only the (node_id, host, port) run of each entry is re-encoded, and
every other byte (the topics and partitions of a Metadata response, racks, tag sections) is copied
as is. That has three effects:

* speed: a Metadata response with 10,000 partitions is rewritten in microseconds, against ~100 ms
  for a kio decode/replace/encode, whose pure-Python encoder would block the event loop;
* tagged fields this code does not know are preserved byte for byte (KIP-482), where kio would
  raise KeyError on reading them and drop them on re-encoding;
* for kio-encodable inputs the result equals kio's full rewrite (the tests check this at every
  version kio has).

ApiVersions caps are applied in place: entries are fixed-size, so lowering a max_version is a
2-byte patch. An API whose min_version is above the cap is dropped from the list, as Kafka itself
does when it intersects its versions with the controller's (`intersectForwardableApis`):
the client then reports that the broker does not support that API, rather than using a version
the proxy cannot read.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from protocol._wire import (
    I16,
    I32,
    encode_i32,
    encode_string,
    encode_uvarint,
    read_array_len,
    read_i16,
    read_i32,
    read_string,
    read_uvarint,
    skip,
    skip_bytes,
    skip_string,
    skip_tagged_fields,
)
from protocol.apis import ApiKey, is_flexible
from protocol.errors import DecodeError, EncodeError, ProtocolError, UnsupportedVersion
from protocol.headers import RequestHeader, response_body_offset
from protocol.throttle import produce_throttle_offset_walk

# For the APIs Sluice decodes (header-only or with kio), the highest version its code handles: the
# maximum kio 0.6.5 knows, which is also Kafka 4.3.1's maximum. Advertise no more than this.
PARSEABLE_MAX_VERSIONS: Final[dict[int, int]] = {
    ApiKey.PRODUCE: 13,
    ApiKey.FETCH: 18,
    ApiKey.METADATA: 13,
    ApiKey.FIND_COORDINATOR: 6,
    ApiKey.SASL_HANDSHAKE: 1,
    ApiKey.API_VERSIONS: 4,
    ApiKey.DESCRIBE_LOG_DIRS: 5,
    ApiKey.SASL_AUTHENTICATE: 2,
    ApiKey.DESCRIBE_CLIENT_QUOTAS: 1,
    ApiKey.ALTER_CLIENT_QUOTAS: 1,
    ApiKey.DESCRIBE_CLUSTER: 2,
}


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    node_id: int
    host: str
    port: int


AddressMapper = Callable[[BrokerAddress], BrokerAddress]

# Field kinds of the tiny walker below. _NODE is the (node_id int32, host string, port int32) run
# that every broker entry of these three APIs contains.
_NODE: Final = "node"
_STR: Final = "string"
_TAGS: Final = "tags"
_I8: Final = 1
_I16: Final = 2
_I32: Final = 4
_FieldKind = str | int
_Spec = tuple[_FieldKind, ...]

_Found = tuple[int, int, BrokerAddress]  # (start, end, address) of a _NODE run


def _walk(payload: bytes, pos: int, spec: _Spec, flexible: bool, found: list[_Found], what: str) -> int:
    for kind in spec:
        if kind == _NODE:
            start = pos
            node_id = read_i32(payload, pos, f"{what} node_id")
            host, pos = read_string(payload, pos + 4, flexible, f"{what} host")
            if host is None:
                raise DecodeError(f"malformed {what}: null host", start + 4)
            port = read_i32(payload, pos, f"{what} port")
            pos += 4
            if node_id >= 0:  # -1/""/-1 marks "no coordinator" in FindCoordinator: not a broker
                found.append((start, pos, BrokerAddress(node_id, host, port)))
        elif kind == _STR:
            pos = skip_string(payload, pos, flexible, f"{what} string field")
        elif kind == _TAGS:
            pos = skip_tagged_fields(payload, pos, f"{what} tagged fields")
        else:
            assert isinstance(kind, int)
            pos = skip(payload, pos, kind, f"{what} field")
    return pos


def _walk_array(
    payload: bytes, pos: int, entry: _Spec, flexible: bool, found: list[_Found], what: str
) -> int:
    count, pos = read_array_len(payload, pos, flexible, what, 9)  # an entry has >= 9 bytes
    for _ in range(count):
        pos = _walk(payload, pos, entry, flexible, found, what)
    return pos


def _splice(
    payload: bytes, found: list[_Found], flexible: bool, mapper: AddressMapper
) -> tuple[bytes, list[BrokerAddress]]:
    pieces: list[bytes | memoryview] = []
    view = memoryview(payload)
    last = 0
    for start, end, original in found:
        mapped = mapper(original)
        pieces.append(view[last:start])
        try:
            pieces.append(encode_i32(mapped.node_id, "node_id"))
            pieces.append(encode_string(mapped.host, flexible, "host"))
            pieces.append(encode_i32(mapped.port, "port"))
        except UnicodeEncodeError as exc:
            raise EncodeError(f"cannot encode mapped host {mapped.host!r}: {exc}") from exc
        last = end
    pieces.append(view[last:])
    return b"".join(pieces), [original for _, _, original in found]


def _check_version(api_key: int, api_version: int) -> None:
    if not 0 <= api_version <= PARSEABLE_MAX_VERSIONS[api_key]:
        raise UnsupportedVersion(api_key, api_version, "layout not verified")


def rewrite_metadata_response(
    payload: bytes, api_version: int, mapper: AddressMapper
) -> tuple[bytes, list[BrokerAddress]]:
    """Map every broker address of a Metadata response (v0-v13).

    Returns (new payload, the original brokers). Only the `brokers` array (right after the header
    and, from v3, throttle_time_ms) is re-encoded; topics and partitions are copied unchanged.
    """
    _check_version(ApiKey.METADATA, api_version)
    flexible = is_flexible(ApiKey.METADATA, api_version)
    pos = response_body_offset(payload, 1 if flexible else 0)
    if api_version >= 3:
        pos = skip(payload, pos, 4, "metadata throttle_time_ms")
    entry: _Spec = (_NODE,)
    if api_version >= 1:
        entry += (_STR,)  # rack
    if flexible:
        entry += (_TAGS,)
    found: list[_Found] = []
    _walk_array(payload, pos, entry, flexible, found, "metadata brokers")
    return _splice(payload, found, flexible, mapper)


def rewrite_find_coordinator_response(
    payload: bytes, api_version: int, mapper: AddressMapper
) -> tuple[bytes, list[BrokerAddress]]:
    """Map the coordinator address(es) of a FindCoordinator response (v0-v6).

    v0-3 carry one coordinator at the top level; v4+ a `coordinators` array (KIP-699 batching).
    An entry for a key whose lookup failed has node_id -1, host "" and port -1: such entries are not
    brokers, so they are neither passed to the mapper nor returned, and their bytes stay unchanged
    (the same holds for any negative node_id in the other two APIs).
    """
    _check_version(ApiKey.FIND_COORDINATOR, api_version)
    flexible = is_flexible(ApiKey.FIND_COORDINATOR, api_version)
    pos = response_body_offset(payload, 1 if flexible else 0)
    found: list[_Found] = []
    if api_version <= 3:
        # [throttle_time_ms v1+], error_code, [error_message v1+], node_id, host, port
        spec: _Spec = (_I32, _I16, _STR, _NODE) if api_version >= 1 else (_I16, _NODE)
        _walk(payload, pos, spec, flexible, found, "find_coordinator")
    else:
        pos = skip(payload, pos, 4, "find_coordinator throttle_time_ms")
        # key, node_id, host, port, error_code, error_message, tags
        entry: _Spec = (_STR, _NODE, _I16, _STR, _TAGS)
        _walk_array(payload, pos, entry, flexible, found, "find_coordinator coordinators")
    return _splice(payload, found, flexible, mapper)


def rewrite_describe_cluster_response(
    payload: bytes, api_version: int, mapper: AddressMapper
) -> tuple[bytes, list[BrokerAddress]]:
    """Map every broker address of a DescribeCluster response (v0-v2, always flexible)."""
    _check_version(ApiKey.DESCRIBE_CLUSTER, api_version)
    pos = response_body_offset(payload, 1)
    # throttle_time_ms, error_code, error_message, [endpoint_type int8 v1+], cluster_id, controller_id
    prefix: _Spec = (_I32, _I16, _STR) + ((_I8,) if api_version >= 1 else ()) + (_STR, _I32)
    found: list[_Found] = []
    pos = _walk(payload, pos, prefix, True, found, "describe_cluster")
    # broker_id, host, port, rack, [is_fenced bool v2+], tags
    entry: _Spec = (_NODE, _STR) + ((_I8,) if api_version >= 2 else ()) + (_TAGS,)
    _walk_array(payload, pos, entry, True, found, "describe_cluster brokers")
    return _splice(payload, found, True, mapper)


# --- ApiVersions --------------------------------------------------------------------------------

_API_VERSIONS_MAX: Final = 4
_API_ENTRY: Final = struct.Struct(">hhh")  # api_key, min_version, max_version


def cap_api_versions_response(payload: bytes, api_version: int, caps: Mapping[int, int]) -> bytes:
    """Lower each listed API's max_version to its cap in an ApiVersions response (v0-v4).

    * A max_version already at or below the cap is left alone (a cap never raises a version).
    * If the cap is below the API's min_version, the entry is removed (no usable version is left).
    * A response with a non-zero error_code is returned unchanged. This covers the v0-format
      UNSUPPORTED_VERSION answer a broker sends to an ApiVersions version it does not know.

    The response header is always v0 for ApiVersions. Returns `payload` itself if nothing changes;
    otherwise only the patched max_version bytes (and, for removals, the array length and the
    removed entries) differ.
    """
    if read_i16(payload, 4, "api_versions error_code") != 0:  # the header is always v0
        return payload  # includes the v0-format answer to a version the broker does not know
    if not 0 <= api_version <= _API_VERSIONS_MAX:
        raise UnsupportedVersion(ApiKey.API_VERSIONS, api_version, "layout not verified")
    flexible = api_version >= 3
    count_pos = 6
    count, pos = read_array_len(payload, count_pos, flexible, "api_versions api_keys", 7 if flexible else 6)
    array_start = pos
    patches: list[tuple[int, int]] = []
    drops: list[tuple[int, int]] = []
    for _ in range(count):
        start = pos
        pos = skip(payload, pos, 6, "api_versions entry")
        api_key, min_version, max_version = _API_ENTRY.unpack_from(payload, start)
        if flexible:
            pos = skip_tagged_fields(payload, pos, "api_versions entry tags")
        cap = caps.get(api_key)
        if cap is None or max_version <= cap:
            continue
        if cap >= min_version:
            patches.append((start + 4, cap))
        else:
            drops.append((start, pos))
    if not patches and not drops:
        return payload
    patched = bytearray(payload)
    for offset, value in patches:
        I16.pack_into(patched, offset, value)
    if not drops:
        return bytes(patched)
    remaining = count - len(drops)
    new_count = encode_uvarint(remaining + 1) if flexible else I32.pack(remaining)
    view = memoryview(patched)
    pieces: list[bytes | memoryview] = [view[:count_pos], new_count]
    last = array_start
    for start, end in drops:
        pieces.append(view[last:start])
        last = end
    pieces.append(view[last:])
    result = b"".join(pieces)
    view.release()
    return result


def read_api_versions_entries(payload: bytes, api_version: int) -> list[tuple[int, int, int]]:
    """(api_key, min_version, max_version) of each entry of an ApiVersions response (v0-v4);
    [] for a response with a non-zero error_code."""
    if read_i16(payload, 4, "api_versions error_code") != 0:
        return []
    if not 0 <= api_version <= _API_VERSIONS_MAX:
        raise UnsupportedVersion(ApiKey.API_VERSIONS, api_version, "layout not verified")
    flexible = api_version >= 3
    count, pos = read_array_len(payload, 6, flexible, "api_versions api_keys", 7 if flexible else 6)
    entries = []
    for _ in range(count):
        start = pos
        pos = skip(payload, pos, 6, "api_versions entry")
        entries.append(_API_ENTRY.unpack_from(payload, start))
        if flexible:
            pos = skip_tagged_fields(payload, pos, "api_versions entry tags")
    return entries


def read_api_versions_request_client_software(
    payload: bytes, header: RequestHeader
) -> tuple[str | None, str | None]:
    """(client_software_name, client_software_version) of an ApiVersions request (KIP-511, v3+).

    (None, None) before v3. Raises UnsupportedVersion above v4, DecodeError on truncation.
    """
    if header.api_key != ApiKey.API_VERSIONS:
        raise ValueError(f"not an ApiVersions request: api_key={header.api_key}")
    if header.api_version > _API_VERSIONS_MAX:
        raise UnsupportedVersion(ApiKey.API_VERSIONS, header.api_version, "layout not verified")
    if header.api_version < 3:
        return None, None
    name, pos = read_string(payload, header.body_offset, True, "client_software_name")
    version, _ = read_string(payload, pos, True, "client_software_version")
    return name, version



# --- KIP-951 leader endpoints in Produce (v10+) and Fetch (v16+) responses -----------------------

_PRODUCE_NODE_ENDPOINTS_SINCE: Final = 10
_FETCH_NODE_ENDPOINTS_SINCE: Final = 16
_NODE_ENDPOINTS_TAG: Final = 0
_NODE_ENDPOINT: Final[_Spec] = (_NODE, _STR, _TAGS)  # node_id, host, port, rack, tags


def node_endpoints_absent(payload: bytes, api_key: int, api_version: int) -> bool:
    """True when a whole Produce v10+ or Fetch v16+ response is well formed and its top-level tag
    section, where KIP-951 puts the leader endpoints, is empty: the rewrites below would return it
    as it is. False for anything else (endpoints or other tags there, a version or layout the walk
    refuses, another API), which the rewrite then reads, and reports if it must.

    The check every such response meets on its way to the client (a modern client's every Produce
    and Fetch), so it has a compiled twin (`protocol.fastpath.node_endpoints_absent`)."""
    walk = _TAGS_OFFSET.get(api_key)
    if walk is None or api_version < walk[0]:
        return False
    try:
        _check_version(api_key, api_version)
        tags = walk[1](payload, api_version)
    except ProtocolError:
        return False
    return tags + 1 == len(payload) and payload[tags] == 0


def rewrite_produce_response_node_endpoints(
    payload: bytes, api_version: int, mapper: AddressMapper
) -> tuple[bytes, list[BrokerAddress]]:
    """Map the leader endpoints (KIP-951) a Produce response v10+ may carry in its tag 0.

    A broker adds them when a partition is NOT_LEADER_OR_FOLLOWER, so that the client can go to
    the new leader without a Metadata round trip: left alone, they would send clients straight to
    the broker. Returns (payload itself, []) when there are none, which is the usual case.
    """
    _check_version(ApiKey.PRODUCE, api_version)
    if api_version < _PRODUCE_NODE_ENDPOINTS_SINCE:
        return payload, []
    return _rewrite_node_endpoints_tag(payload, _produce_tags_offset(payload, api_version), mapper,
                                       "produce node_endpoints")


def rewrite_fetch_response_node_endpoints(
    payload: bytes, api_version: int, mapper: AddressMapper
) -> tuple[bytes, list[BrokerAddress]]:
    """Map the leader endpoints (KIP-951) a Fetch response v16+ may carry in its tag 0.

    Finding the tag section means walking every partition (records are skipped by length, so the
    cost grows with the number of partitions, not bytes). Returns (payload itself, []) when the
    response has no endpoints, which is the usual case.
    """
    _check_version(ApiKey.FETCH, api_version)
    if api_version < _FETCH_NODE_ENDPOINTS_SINCE:
        return payload, []
    return _rewrite_node_endpoints_tag(payload, _fetch_tags_offset(payload, api_version), mapper,
                                       "fetch node_endpoints")


def _fetch_top_level_tags_offset(payload: bytes, body: int, api_version: int) -> int:
    # throttle_time_ms, error_code, session_id, then responses[]: topic name (v12) or topic_id
    # (v13+), partitions[]: partition_index, error_code, high_watermark, last_stable_offset,
    # log_start_offset (30 bytes), aborted_transactions[] (nullable; 16 bytes + tags each),
    # preferred_read_replica int32, records (nullable bytes), tags; topic tags.
    pos = skip(payload, body, 10, "fetch throttle_time_ms, error_code, session_id")
    n_topics, pos = read_array_len(payload, pos, True, "fetch responses", 2)
    for _ in range(n_topics):
        if api_version >= 13:
            pos = skip(payload, pos, 16, "fetch topic_id")
        else:
            pos = skip_string(payload, pos, True, "fetch topic")
        # the smallest partition: 30 + aborted_transactions (1, null or empty) + 4 + records (1, null or
        # empty) + tags (1) = 37 bytes (an idle partition of a full fetch is exactly that)
        n_partitions, pos = read_array_len(payload, pos, True, "fetch partitions", 37)
        for _ in range(n_partitions):
            pos = skip(payload, pos, 30, "fetch partition")
            n_aborted, pos = read_array_len(payload, pos, True, "fetch aborted_transactions", 17)
            for _ in range(n_aborted):
                pos = skip_tagged_fields(payload, skip(payload, pos, 16, "fetch aborted_transaction"))
            pos = skip(payload, pos, 4, "fetch preferred_read_replica")
            pos = skip_bytes(payload, pos, True, "fetch records")
            pos = skip_tagged_fields(payload, pos, "fetch partition tags")
        pos = skip_tagged_fields(payload, pos, "fetch topic tags")
    return pos


def _produce_tags_offset(payload: bytes, api_version: int) -> int:
    """Where a Produce response's top-level tag section starts (after throttle_time_ms)."""
    return produce_throttle_offset_walk(payload, response_body_offset(payload, 1), api_version) + 4


def _fetch_tags_offset(payload: bytes, api_version: int) -> int:
    """Where a Fetch response's top-level tag section starts (after its last partition)."""
    return _fetch_top_level_tags_offset(payload, response_body_offset(payload, 1), api_version)


#: Per API whose responses may carry leader endpoints: the first version that may, and the walk to
#: the tag section that holds them.
_TAGS_OFFSET: Final[dict[int, tuple[int, Callable[[bytes, int], int]]]] = {
    ApiKey.PRODUCE: (_PRODUCE_NODE_ENDPOINTS_SINCE, _produce_tags_offset),
    ApiKey.FETCH: (_FETCH_NODE_ENDPOINTS_SINCE, _fetch_tags_offset),
}


def _rewrite_node_endpoints_tag(
    payload: bytes, tags: int, mapper: AddressMapper, what: str
) -> tuple[bytes, list[BrokerAddress]]:
    """Rewrite tag 0 (node_endpoints) of the top-level tag section starting at `tags`."""
    if tags < len(payload) and payload[tags] == 0:  # no tagged fields: the usual case
        if tags + 1 != len(payload):
            raise DecodeError(f"{what}: {len(payload) - tags - 1} trailing bytes", tags + 1)
        return payload, []
    count, pos = read_uvarint(payload, tags, f"{what} tag count")
    for index in range(count):
        tag, pos = read_uvarint(payload, pos, f"{what} tag")
        size_pos = pos
        size, data_start = read_uvarint(payload, pos, f"{what} tag size")
        data_end = skip(payload, data_start, size, f"{what} tag data")
        if tag == _NODE_ENDPOINTS_TAG:
            data = payload[data_start:data_end]
            found: list[_Found] = []
            walked = _walk_array(data, 0, _NODE_ENDPOINT, True, found, what)
            if walked != len(data):
                raise DecodeError(f"{what}: {len(data) - walked} stray bytes in the tag", data_start + walked)
            new_data, original = _splice(data, found, True, mapper)
            rest_end = _skip_remaining_tags(payload, data_end, count - 1 - index, what)
            new_payload = b"".join(
                (payload[:size_pos], encode_uvarint(len(new_data)), new_data, payload[data_end:rest_end])
            )
            return new_payload, original
        pos = data_end
    if pos != len(payload):
        raise DecodeError(f"{what}: {len(payload) - pos} trailing bytes", pos)
    return payload, []


def _skip_remaining_tags(payload: bytes, pos: int, remaining: int, what: str) -> int:
    for _ in range(remaining):
        _tag, pos = read_uvarint(payload, pos, f"{what} tag")
        size, pos = read_uvarint(payload, pos, f"{what} tag size")
        pos = skip(payload, pos, size, f"{what} tag data")
    if pos != len(payload):
        raise DecodeError(f"{what}: {len(payload) - pos} trailing bytes", pos)
    return pos
