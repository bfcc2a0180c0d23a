"""Shared helpers for the protocol tests: kio as the oracle that builds and reads frames."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import types
import typing
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


# How many items a generated array holds at most. st.from_type draws arrays of unbounded length at
# every level of a schema, so a Fetch response (topics > partitions > aborted transactions) came out
# with hundreds of nested entities and one example cost over a second of CPU, nearly all of it in
# generation. The code under test walks an array with the same step for its first item as for its
# hundredth: 0, 1 and several items (per level, so up to 27 partitions' worth in a Fetch) reach every
# branch an array can take (empty, one, the step from one item to the next).
KIO_MAX_ITEMS = 3


@functools.cache
def kio_entities(cls: type[Any], max_items: int = KIO_MAX_ITEMS) -> st.SearchStrategy[Any]:
    """Any instance of a kio schema class, like st.from_type(cls), with arrays of at most max_items.

    Every field is drawn as st.from_type draws it (a field with a default is that default or any
    value), except that nested entities are built by this function and arrays are bounded."""
    hints = typing.get_type_hints(cls)
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        strategy = _kio_field(hints[field.name], max_items)
        if field.default is not dataclasses.MISSING:
            strategy = st.just(field.default) | strategy
        fields[field.name] = strategy
    return st.builds(cls, **fields)


def _kio_field(hint: Any, max_items: int) -> st.SearchStrategy[Any]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return st.lists(_kio_field(args[0], max_items), max_size=max_items).map(tuple)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(_kio_field(arg, max_items) for arg in args))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return kio_entities(hint, max_items)
    return st.from_type(hint)


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
