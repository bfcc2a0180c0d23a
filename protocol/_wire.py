"""Bounds-checked primitives for walking Kafka wire bytes by hand.

Every reader takes `(payload, pos)` and returns the new position (plus a value where there is one),
the convention kio uses. Nothing here trusts a length or a count from the wire: a hostile count is
rejected before any loop runs, and every failure is a `DecodeError` naming the field and offset.
The walkers in `throttle.py` and `rewrite.py` are built from these so they can skip tagged fields
they do not know, which kio's decoder cannot (it raises `KeyError`).
"""

from __future__ import annotations

import struct
from typing import Final

from protocol.errors import DecodeError, EncodeError

I8: Final = struct.Struct(">b")
I16: Final = struct.Struct(">h")
I32: Final = struct.Struct(">i")
I64: Final = struct.Struct(">q")

INT16_MAX: Final = 0x7FFF
INT32_MAX: Final = 0x7FFFFFFF

_MAX_VARINT_BYTES: Final = 5  # Kafka's unsigned varint is 32 bits: at most 5 bytes


def truncated(what: str, pos: int, need: int, payload_len: int) -> DecodeError:
    have = max(payload_len - pos, 0)
    return DecodeError(f"truncated {what}: need {need} bytes, {have} left", pos)


def read_i16(payload: bytes, pos: int, what: str) -> int:
    if pos + 2 > len(payload):
        raise truncated(what, pos, 2, len(payload))
    value: int = I16.unpack_from(payload, pos)[0]
    return value


def read_i32(payload: bytes, pos: int, what: str) -> int:
    if pos + 4 > len(payload):
        raise truncated(what, pos, 4, len(payload))
    value: int = I32.unpack_from(payload, pos)[0]
    return value


def skip(payload: bytes, pos: int, n: int, what: str) -> int:
    end = pos + n
    if end > len(payload):
        raise truncated(what, pos, n, len(payload))
    return end


def read_uvarint(payload: bytes, pos: int, what: str) -> tuple[int, int]:
    """Unsigned varint (protobuf style, at most 5 bytes) -> (value, new_pos)."""
    value = 0
    shift = 0
    n = len(payload)
    for i in range(_MAX_VARINT_BYTES):
        if pos + i >= n:
            raise truncated(what, pos, i + 1, n)
        byte = payload[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos + i + 1
        shift += 7
    raise DecodeError(f"malformed {what}: unsigned varint longer than {_MAX_VARINT_BYTES} bytes", pos)


def skip_tagged_fields(payload: bytes, pos: int, what: str = "tagged fields") -> int:
    """Skip a KIP-482 tag section: count, then (tag, size, data) per field. Unknown tags are fine."""
    n = len(payload)
    if pos < n and payload[pos] == 0:  # the usual case: no tagged fields
        return pos + 1
    count, pos = read_uvarint(payload, pos, f"{what} count")
    if count > n - pos:  # every tagged field takes at least 2 bytes; cheap sanity bound
        raise DecodeError(f"malformed {what}: {count} fields cannot fit in {n - pos} bytes", pos)
    for _ in range(count):
        _tag, pos = read_uvarint(payload, pos, f"{what} tag")
        size, pos = read_uvarint(payload, pos, f"{what} size")
        pos = skip(payload, pos, size, f"{what} data")
    return pos


def skip_string(payload: bytes, pos: int, flexible: bool, what: str) -> int:
    """Skip a (nullable) string: int16 length, or compact uvarint length+1 when flexible."""
    if flexible:
        length_plus_one, pos = read_uvarint(payload, pos, f"{what} length")
        return pos if length_plus_one == 0 else skip(payload, pos, length_plus_one - 1, what)
    length = read_i16(payload, pos, f"{what} length")
    pos += 2
    if length < -1:
        raise DecodeError(f"malformed {what}: negative length {length}", pos - 2)
    return pos if length == -1 else skip(payload, pos, length, what)


def read_string(payload: bytes, pos: int, flexible: bool, what: str) -> tuple[str | None, int]:
    """Read a (nullable) string. Invalid UTF-8 is replaced (U+FFFD), as Java's decoder does."""
    if flexible:
        length_plus_one, pos = read_uvarint(payload, pos, f"{what} length")
        if length_plus_one == 0:
            return None, pos
        length = length_plus_one - 1
    else:
        length = read_i16(payload, pos, f"{what} length")
        pos += 2
        if length == -1:
            return None, pos
        if length < -1:
            raise DecodeError(f"malformed {what}: negative length {length}", pos - 2)
    end = skip(payload, pos, length, what)
    return str(payload[pos:end], "utf-8", "replace"), end


def skip_bytes(payload: bytes, pos: int, flexible: bool, what: str) -> int:
    """Skip a (nullable) bytes field: int32 length, or compact uvarint length+1 when flexible."""
    if flexible:
        length_plus_one, pos = read_uvarint(payload, pos, f"{what} length")
        return pos if length_plus_one == 0 else skip(payload, pos, length_plus_one - 1, what)
    length = read_i32(payload, pos, f"{what} length")
    pos += 4
    if length < -1:
        raise DecodeError(f"malformed {what}: negative length {length}", pos - 4)
    return pos if length == -1 else skip(payload, pos, length, what)


def read_array_len(
    payload: bytes, pos: int, flexible: bool, what: str, min_item_bytes: int = 1
) -> tuple[int, int]:
    """Read an array length -> (count, new_pos); a null array counts as 0 items.

    Rejects counts that could not fit in the rest of the payload at `min_item_bytes` each, so a
    hostile count cannot make a walker loop for billions of iterations.
    """
    if flexible:
        count_plus_one, new_pos = read_uvarint(payload, pos, f"{what} length")
        count = count_plus_one - 1
    else:
        count = read_i32(payload, pos, f"{what} length")
        new_pos = pos + 4
        if count < -1:
            raise DecodeError(f"malformed {what}: negative length {count}", pos)
    if count <= 0:
        return 0, new_pos
    if count * min_item_bytes > len(payload) - new_pos:
        raise DecodeError(
            f"malformed {what}: {count} items cannot fit in {len(payload) - new_pos} bytes", pos
        )
    return count, new_pos


def encode_uvarint(value: int) -> bytes:
    if value < 0:
        raise EncodeError(f"unsigned varint cannot hold {value}")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_string(value: str, flexible: bool, what: str) -> bytes:
    """Encode a non-null string: int16 length, or compact uvarint length+1 when flexible."""
    data = value.encode("utf-8")
    if flexible:
        return encode_uvarint(len(data) + 1) + data
    if len(data) > INT16_MAX:
        raise EncodeError(f"{what} is {len(data)} bytes; a legacy string holds at most {INT16_MAX}")
    return I16.pack(len(data)) + data


def encode_i32(value: int, what: str) -> bytes:
    try:
        return I32.pack(value)
    except struct.error as exc:
        raise EncodeError(f"{what}={value} does not fit in an int32") from exc
