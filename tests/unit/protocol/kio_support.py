"""Shared helpers for the protocol tests: kio as the oracle that builds and reads frames."""

from __future__ import annotations

import datetime
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from kio.schema.index import api_key_map, schema_name_map
from kio.static.primitive import Records

from protocol.apis import response_header_version
from protocol.encode import encode_response

# kio registers strategies for its primitives but not for opaque record bytes.
st.register_type_strategy(Records, st.binary(max_size=48).map(Records))

KIO_EXAMPLES = settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def kio_versions(api_key: int) -> list[int]:
    """Every version kio 0.6.5 has a schema for."""
    return sorted(schema_name_map[api_key_map[api_key]])


def kio_api_keys() -> list[int]:
    return sorted(api_key_map)


def response_payload(body: Any, correlation_id: int = 0x01020304) -> bytes:
    """A response payload for a kio response entity, with the right header version."""
    header_version = response_header_version(body.__api_key__, body.__version__)
    return encode_response(header_version, correlation_id, body)


def ms(delta: datetime.timedelta) -> int:
    return round(delta.total_seconds() * 1000)


def changed_offsets(before: bytes, after: bytes) -> list[int]:
    assert len(before) == len(after)
    return [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
