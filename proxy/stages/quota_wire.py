"""The wire edits a quota verdict asks for (`quotas.engine.RequestVerdict`, `ResponseVerdict`): a
Fetch's max_bytes (and a ShareFetch's max_records) capped, a throttled Fetch answered empty, a
response's throttle_time_ms written. Each returns None (or the bytes as they were) when the payload
cannot be edited, and logs why: the request or response then goes through unedited."""

from __future__ import annotations

import logging
import struct

from kio.schema.errors import ErrorCode

from protocol._wire import INT32_MAX
from protocol.apis import ApiKey, api_name, response_header_version
from protocol.errors import ProtocolError
from protocol.fastpath import patch_throttle_time
from protocol.fetch import cap_fetch_max_bytes, empty_fetch_response
from protocol.headers import RequestHeader, response_body_offset
from protocol.share import cap_share_fetch_max_bytes, cap_share_fetch_max_records
from proxy.flow.inflight import InFlight
from quotas.engine import RequestVerdict

log = logging.getLogger("sluice.quotas")


def cap_fetch(header: RequestHeader, payload: bytes, verdict: RequestVerdict) -> bytes | None:
    """KAFKA-9677: the request's max_bytes capped at the verdict's `fetch_cap_bytes` (and a
    ShareFetch's max_records at its `fetch_cap_records`); None if it asks for no more."""
    cap_bytes = verdict.fetch_cap_bytes
    if header.api_key == ApiKey.FETCH and (cap_bytes is None or cap_bytes >= INT32_MAX):
        return None  # min_bytes and max_bytes are int32s: a cap this high lowers neither (read nothing)
    capped = payload
    try:
        if header.api_key == ApiKey.SHARE_FETCH:  # as the broker caps a share fetch
            if verdict.fetch_cap_bytes is not None:
                capped = cap_share_fetch_max_bytes(capped, header, verdict.fetch_cap_bytes)
            if verdict.fetch_cap_records is not None:
                capped = cap_share_fetch_max_records(capped, header, verdict.fetch_cap_records)
        elif verdict.fetch_cap_bytes is not None:
            capped = cap_fetch_max_bytes(payload, header, verdict.fetch_cap_bytes)
    except ProtocolError as exc:
        log.warning("cannot cap %s v%d max_bytes: %s", api_name(header.api_key), header.api_version, exc)
        return None
    return None if capped is payload else capped


def empty_fetch(entry: InFlight, payload: bytes, throttle_ms: int) -> bytes | None:
    """The broker's throttled Fetch response, or None to forward the data after all."""
    try:
        version = entry.api_version
        session_id = 0
        if version >= 7:
            body = response_body_offset(payload, response_header_version(ApiKey.FETCH, version))
            _throttle, error_code, session_id = struct.unpack_from(">ihi", payload, body)
            if error_code != ErrorCode.none:
                return None  # a top-level error (e.g. a session problem) goes through as it is
        return empty_fetch_response(entry.correlation_id, version, throttle_ms, session_id)
    except (ProtocolError, struct.error) as exc:
        log.warning("cannot build a throttled Fetch v%d response, forwarding data: %s",
                    entry.api_version, exc)
        return None


def with_throttle_time(entry: InFlight, payload: bytes, throttle_ms: int) -> bytes:
    """The response with `throttle_ms` in its throttle_time_ms (as it was if that cannot be written)."""
    try:
        return patch_throttle_time(payload, entry.api_key, entry.api_version, throttle_ms)
    except ProtocolError as exc:
        log.warning("cannot write throttle_time_ms into %d v%d response: %s",
                    entry.api_key, entry.api_version, exc)
        return payload
