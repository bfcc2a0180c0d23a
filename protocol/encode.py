"""The kio seam: full decodes and encodes for the control plane, with kio's errors translated.

kio 0.6.5 is a fast native decoder and a slow pure-Python encoder, so it is used only where Sluice
needs a whole message (SASL, client-quota admin APIs, synthesised responses), never for the
Produce/Fetch hot path. Its failure modes are folded into this package's error family:

* `UnknownAPIKey` / `UnknownEntity` (a key or version kio does not know) -> `UnsupportedVersion`;
* `KeyError` (an unknown tagged field: kio does not skip them, contrary to KIP-482), `ValueError`
  (e.g. an error code newer than kio's enum, a negative length), `BufferUnderflow` and the other
  `kio.serial.errors` -> `DecodeError`;
* encoder failures (`struct.error`, `OutOfBoundValue`, ...) -> `EncodeError`.

kio readers need a read-only buffer: pass `bytes` (a `bytearray` is converted to a read-only view).
"""

from __future__ import annotations

import io
import struct
from typing import Any

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError

from protocol._wire import encode_i32
from protocol.apis import api_name, response_header_version
from protocol.errors import DecodeError, EncodeError, UnsupportedVersion
from protocol.headers import RequestHeader, response_body_offset
from protocol.kio_guard import check_entity

_DECODE_FAILURES = (KeyError, ValueError, IndexError, OverflowError, SerialError)
_ENCODE_FAILURES = (struct.error, ValueError, TypeError, OverflowError, AttributeError, SerialError)


def request_schema(api_key: int, api_version: int) -> Any:
    """kio's request class for (api_key, api_version); UnsupportedVersion if kio lacks it."""
    try:
        return load_request_schema(api_key, api_version)
    except (UnknownAPIKey, UnknownEntity) as exc:
        raise UnsupportedVersion(api_key, api_version, f"kio has no {api_name(api_key)} request") from exc


def response_schema(api_key: int, api_version: int) -> Any:
    """kio's response class for (api_key, api_version); UnsupportedVersion if kio lacks it."""
    try:
        return load_response_schema(api_key, api_version)
    except (UnknownAPIKey, UnknownEntity) as exc:
        raise UnsupportedVersion(api_key, api_version, f"kio has no {api_name(api_key)} response") from exc


def _read_entity(entity_cls: Any, payload: bytes, offset: int, what: str) -> Any:
    buffer: bytes | memoryview = payload if isinstance(payload, bytes) else memoryview(payload).toreadonly()
    # kio's native reader aborts the process on an array count it cannot allocate: check first
    try:
        check_entity(entity_cls, bytes(payload), offset)
    except DecodeError as exc:
        raise DecodeError(f"could not decode {what}: {exc}") from exc
    try:
        value, size = entity_reader(entity_cls)(buffer, offset)
    except _DECODE_FAILURES as exc:
        raise DecodeError(f"kio could not decode {what}: {type(exc).__name__}: {exc}", offset) from exc
    end = offset + size
    if end != len(payload):
        raise DecodeError(f"{what}: {len(payload) - end} trailing bytes after the body", end)
    return value


def decode_request_body(payload: bytes, header: RequestHeader) -> Any:
    """Decode the request body with kio (the frame must end where the body ends)."""
    cls = request_schema(header.api_key, header.api_version)
    what = f"{api_name(header.api_key)} v{header.api_version} request"
    return _read_entity(cls, payload, header.body_offset, what)


def decode_response_body(payload: bytes, api_key: int, api_version: int) -> Any:
    """Decode a response body with kio; the response header is skipped by hand (unknown tags ok)."""
    cls = response_schema(api_key, api_version)
    body = response_body_offset(payload, response_header_version(api_key, api_version))
    return _read_entity(cls, payload, body, f"{api_name(api_key)} v{api_version} response")


def encode_response(header_version: int, correlation_id: int, body: Any) -> bytes:
    """A response payload (no size prefix): header v0 or v1 (empty tag section), then kio's body."""
    if header_version not in (0, 1):
        raise ValueError(f"response header version must be 0 or 1, not {header_version}")
    buf = io.BytesIO()
    buf.write(encode_i32(correlation_id, "correlation_id"))
    if header_version == 1:
        buf.write(b"\x00")
    return _write_entity(buf, body)


def encode_request(header: RequestHeader, body: Any) -> bytes:
    """A request payload (no size prefix) for `header`'s api/version/correlation/client id.

    Mostly for tests and synthesised requests; header.body_offset is ignored.
    """
    if header.header_version not in (1, 2):
        raise ValueError(f"request header version must be 1 or 2, not {header.header_version}")
    buf = io.BytesIO()
    try:
        buf.write(struct.pack(">hhi", header.api_key, header.api_version, header.correlation_id))
    except struct.error as exc:
        raise EncodeError(f"request header out of range: {header}") from exc
    if header.client_id is None:
        buf.write(b"\xff\xff")
    else:
        client_id = header.client_id.encode("utf-8")
        if len(client_id) > 0x7FFF:
            raise EncodeError(f"client_id is {len(client_id)} bytes; at most 32767 fit")
        buf.write(struct.pack(">h", len(client_id)) + client_id)
    if header.header_version == 2:
        buf.write(b"\x00")
    return _write_entity(buf, body)


def _write_entity(buf: io.BytesIO, body: Any) -> bytes:
    try:
        entity_writer(type(body))(buf, body)
    except _ENCODE_FAILURES as exc:
        raise EncodeError(f"kio could not encode {type(body).__name__}: {type(exc).__name__}: {exc}") from exc
    return buf.getvalue()
