"""Errors raised by the protocol package.

Everything the package raises on bad or unexpected input is a `ProtocolError`, so the proxy can
catch one family and fall back to forwarding the frame unchanged. Failures inside kio (its
`KeyError` for unknown tagged fields, `UnknownAPIKey`/`UnknownEntity`, `BufferUnderflow` and the
other `kio.serial.errors`) are translated at the kio seam and never escape as they are.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base class of every error raised by `protocol`."""


class DecodeError(ProtocolError):
    """The bytes are truncated or malformed.

    `offset` is the position in the payload where the problem was found, when known.
    """

    def __init__(self, message: str, offset: int | None = None) -> None:
        self.offset = offset
        super().__init__(message if offset is None else f"{message} (at payload offset {offset})")


class EncodeError(ProtocolError):
    """A value cannot be written in the wire format (for example an out-of-range integer)."""


class FrameTooLarge(ProtocolError):
    """A size prefix announces a frame larger than the configured maximum."""

    def __init__(self, size_bytes: int, max_frame_bytes: int) -> None:
        self.size_bytes = size_bytes
        self.max_frame_bytes = max_frame_bytes
        super().__init__(f"frame of {size_bytes} bytes exceeds the maximum of {max_frame_bytes} bytes")


class UnsupportedVersion(ProtocolError):
    """The API key or version is one this code (or kio) does not know how to handle."""

    def __init__(self, api_key: int, api_version: int, reason: str = "") -> None:
        self.api_key = api_key
        self.api_version = api_version
        detail = f": {reason}" if reason else ""
        super().__init__(f"unsupported api_key={api_key} api_version={api_version}{detail}")
