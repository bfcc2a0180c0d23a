"""Check every length in a payload before kio's native reader sees it.

kio's Rust reader allocates an array's capacity from the count on the wire before it reads the
items; a count of two billion makes that allocation fail and the Rust runtime *aborts the process*
(no exception to catch). A hostile client could kill Sluice with one DescribeClientQuotas request,
a broken broker with one Metadata response. So before `protocol.encode` hands bytes to kio, this
walks the same schema (kio's dataclasses and their `kafka_type` metadata) and refuses, with a
`DecodeError`, any array whose items cannot fit in what is left of the payload, and any string or
bytes longer than the payload. It allocates nothing and reads each byte at most once.

The walk follows Kafka's encoding: non-tagged fields in order; in flexible versions compact
lengths (uvarint n + 1, 0 = null) and a tag section after every struct, whose known tagged fields
are walked inside their own size. A nullable struct carries an int8 marker (-1 = null).
"""

from __future__ import annotations

import dataclasses
import functools
from types import NoneType, UnionType
from typing import Any, get_args, get_origin

from protocol._wire import read_array_len, read_uvarint, skip, skip_bytes, skip_string
from protocol.errors import DecodeError

_FIXED_BYTES = {
    "bool": 1, "int8": 1, "int16": 2, "uint16": 2, "error_code": 2, "int32": 4, "timedelta_i32": 4,
    "int64": 8, "timedelta_i64": 8, "datetime_i64": 8, "float64": 8, "uuid": 16,
}


@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    name: str
    kafka_type: str | None       # None: a struct (`entity`)
    entity: Any                  # the struct's class, or None
    is_array: bool
    optional: bool
    tag: int | None


def check_entity(cls: Any, payload: bytes, pos: int) -> int:
    """Walk `cls` at `pos`; return where it ends, or raise `DecodeError` on a length that cannot be
    true. The payload is otherwise not validated here: kio does that."""
    return _entity(cls, payload, pos)


def _entity(cls: Any, payload: bytes, pos: int) -> int:
    flexible = bool(getattr(cls, "__flexible__", False))
    fields, tagged = _fields(cls)
    for f in fields:
        pos = _field(f, flexible, payload, pos)
    if flexible:
        pos = _tags(tagged, payload, pos)
    return pos


def _field(f: _Field, flexible: bool, payload: bytes, pos: int) -> int:
    if f.is_array:
        min_item = _FIXED_BYTES.get(f.kafka_type or "", 1)
        count, pos = read_array_len(payload, pos, flexible, f.name, min_item)
        for _ in range(count):
            pos = _one(f, flexible, payload, pos)
        return pos
    return _one(f, flexible, payload, pos)


def _one(f: _Field, flexible: bool, payload: bytes, pos: int) -> int:
    if f.entity is not None:
        if f.optional and not f.is_array:
            after_marker = skip(payload, pos, 1, f.name)
            if payload[pos] == 0xFF:  # int8 -1: null
                return after_marker
            pos = after_marker
        return _entity(f.entity, payload, pos)
    kind = f.kafka_type or ""
    fixed = _FIXED_BYTES.get(kind)
    if fixed is not None:
        return skip(payload, pos, fixed, f.name)
    if kind == "string":
        return skip_string(payload, pos, flexible, f.name)
    if kind in ("bytes", "records"):
        return skip_bytes(payload, pos, flexible, f.name)
    raise DecodeError(f"{f.name}: unknown kafka_type {kind!r}", pos)


def _tags(tagged: dict[int, _Field], payload: bytes, pos: int) -> int:
    count, pos = read_uvarint(payload, pos, "tagged fields count")
    if count > len(payload) - pos:
        raise DecodeError(f"malformed tagged fields: {count} fields cannot fit in {len(payload) - pos} bytes",
                          pos)
    for _ in range(count):
        tag, pos = read_uvarint(payload, pos, "tag")
        size, pos = read_uvarint(payload, pos, "tagged field size")
        field_end = skip(payload, pos, size, "tagged field")
        known = tagged.get(tag)
        if known is not None:  # walked within its own size: the payload cut at its end
            _field(known, True, payload[:field_end], pos)
        pos = field_end
    return pos


@functools.cache
def _fields(cls: Any) -> tuple[tuple[_Field, ...], dict[int, _Field]]:
    plain: list[_Field] = []
    tagged: dict[int, _Field] = {}
    for field in dataclasses.fields(cls):
        f = _classify(field)
        if f.tag is None:
            plain.append(f)
        else:
            tagged[f.tag] = f
    return tuple(plain), tagged


def _classify(field: dataclasses.Field[Any]) -> _Field:
    kafka_type = field.metadata.get("kafka_type")
    tag = field.metadata.get("tag")
    annotation = field.type
    optional = False
    if get_origin(annotation) is UnionType:
        args = [a for a in get_args(annotation) if a is not NoneType]
        optional = len(args) < len(get_args(annotation))
        annotation = args[0]
    is_array = get_origin(annotation) is tuple
    inner = get_args(annotation)[0] if is_array else annotation
    if get_origin(inner) is UnionType:
        inner = next(a for a in get_args(inner) if a is not NoneType)
    entity = inner if dataclasses.is_dataclass(inner) else None
    return _Field(field.name, None if entity is not None else kafka_type, entity, is_array, optional,
                  None if tag is None else int(tag))
