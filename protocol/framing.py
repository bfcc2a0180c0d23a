"""Splitting a byte stream into Kafka frames, sans-IO (h11 style: feed bytes, pull frames).

Every Kafka request and response is an int32 size followed by that many bytes of payload. The
proxy's read loop feeds whatever the socket gave it and pulls complete payloads out; tests drive
the same object byte by byte.

Bytes are appended to one `bytearray` and consumed by advancing an offset, so a large frame
arriving in many chunks is copied once on the way in and once on the way out (not re-copied on
every chunk). Consumed bytes are dropped when they make up at least half of the buffer, which keeps
compaction amortised O(1) per byte.
"""

from __future__ import annotations

from typing import Final

from protocol._wire import I32, INT32_MAX
from protocol.errors import DecodeError, FrameTooLarge

DEFAULT_MAX_FRAME_BYTES: Final = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes default


class FrameSplitter:
    """Accumulates bytes and yields complete frame payloads (without the 4-byte size prefix).

    The size prefix is checked as soon as its 4 bytes arrive: `FrameTooLarge` if it exceeds
    `max_frame_bytes`, `DecodeError` if it is negative. The stream cannot be resynchronised after
    either, so the splitter keeps raising the same error; the connection should be closed.
    """

    __slots__ = ("_buf", "_max_frame_bytes", "_pos")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if not 0 <= max_frame_bytes <= INT32_MAX:
            raise ValueError(f"max_frame_bytes must be in [0, {INT32_MAX}], not {max_frame_bytes}")
        self._max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._pos = 0  # start of the unconsumed bytes in _buf

    @property
    def buffered_bytes(self) -> int:
        """Bytes fed but not yet returned as part of a frame (including a partial size prefix)."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes read from the stream. The data is copied; the caller may reuse its buffer."""
        buf = self._buf
        if self._pos and self._pos * 2 >= len(buf):
            del buf[: self._pos]
            self._pos = 0
        buf += data

    def next_frame(self) -> bytes | None:
        """The next complete payload, or None if more bytes are needed."""
        size = self._front_size()
        start = self._pos + 4
        if size is None or len(self._buf) < start + size:
            return None
        return self._consume(start, start + size)

    # -- cut-through: a large frame can leave before its last byte has arrived -------------------

    def pending_frame(self, head_bytes: int) -> tuple[int, bytes] | None:
        """(size, first bytes) of the frame at the front, as soon as its size prefix and
        `min(size, head_bytes)` bytes of payload have arrived, complete or not. Nothing is consumed.

        Raises like `next_frame` on a bad size prefix.
        """
        size = self._front_size()
        start = self._pos + 4
        if size is None or len(self._buf) < start + min(size, head_bytes):
            return None
        return size, bytes(self._buf[start : start + min(size, head_bytes)])

    def take_partial(self) -> tuple[bytes, int]:
        """Consume the front frame's payload bytes buffered so far (its size prefix dropped).

        Returns (those bytes, how many bytes of the frame are still to come). With bytes still to
        come the buffer is then empty, and the caller takes them straight off the stream before
        feeding the splitter again. Call it only after `pending_frame` returned the frame.
        """
        size = self._front_size()
        assert size is not None, "take_partial before the size prefix arrived"
        start = self._pos + 4
        part = self._consume(start, min(start + size, len(self._buf)))
        return part, size - len(part)

    def unread(self, payloads: list[bytes]) -> None:
        """Put whole frames back in front of the buffered bytes: `next_frame` returns them again
        first, in order. (The proxy holds client frames while it waits for a broker's SASL answer.)"""
        head = b"".join(I32.pack(len(p)) + p for p in payloads)
        if not head:
            return
        pos = self._pos
        if pos >= len(head):  # room in the consumed part of the buffer
            self._buf[pos - len(head) : pos] = head
            self._pos = pos - len(head)
        else:
            self._buf = bytearray(head) + self._buf[pos:]
            self._pos = 0

    # -- internals ----------------------------------------------------------------------------------

    def _front_size(self) -> int | None:
        """The front frame's size once its prefix has arrived (checked), else None."""
        pos = self._pos
        if len(self._buf) - pos < 4:
            return None
        size: int = I32.unpack_from(self._buf, pos)[0]
        if size < 0:
            raise DecodeError(f"negative frame size {size}", pos)
        if size > self._max_frame_bytes:
            raise FrameTooLarge(size, self._max_frame_bytes)
        return size

    def _consume(self, start: int, end: int) -> bytes:
        """Copy out buf[start:end] and drop everything before `end`."""
        buf = self._buf
        with memoryview(buf) as view:
            out = bytes(view[start:end])
        if end == len(buf):
            buf.clear()
            self._pos = 0
        else:
            self._pos = end
        return out


def size_prefix(payload_len: int) -> bytes:
    """The 4-byte big-endian size prefix for a payload of `payload_len` bytes."""
    if not 0 <= payload_len <= INT32_MAX:
        raise ValueError(f"payload length must be in [0, {INT32_MAX}], not {payload_len}")
    return I32.pack(payload_len)
