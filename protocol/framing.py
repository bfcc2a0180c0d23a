"""Splitting a byte stream into Kafka frames, sans-IO (h11 style: feed bytes, pull frames).

Every Kafka request and response is an int32 size followed by that many bytes of payload. The
proxy's read loop gives the splitter whatever the socket gave it and pulls complete payloads out;
tests drive the same object byte by byte.

The splitter owns one buffer, which it keeps between frames. Bytes come in two ways:

* `feed(data)` copies a chunk in;
* `get_buffer(sizehint)` and `buffer_updated(nbytes)` are `asyncio.BufferedProtocol`'s pair: the
  event loop reads the socket straight into the room after the buffered bytes, so a read is copied
  nowhere before its frame leaves as one `bytes`.

The room offered makes the buffer hold at least `READ_BYTES`, and takes the rest of the front frame
when its size is known (up to `MAX_ROOM_BYTES` at once): a large frame is read in few system calls
and lands where it is taken from. The buffer grows by doubling, moves its unread bytes to its front
only when that makes the room, and is kept between frames up to `KEPT_BYTES`: a connection that
sends 64 KiB requests reads every one into the same memory (a buffer allocated afresh per frame
costs the kernel a page fault per 4 KiB). A buffer above `KEPT_BYTES` is dropped once it is empty.

The storage is never resized in place, only replaced: the event loop may still hold the room it
was given while the read it brought is handled.
"""

from __future__ import annotations

from typing import Final

from protocol._wire import I32, INT32_MAX
from protocol.errors import DecodeError, FrameTooLarge

DEFAULT_MAX_FRAME_BYTES: Final = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes default
READ_BYTES: Final = 16 * 1024  # the least room `get_buffer` offers
MAX_ROOM_BYTES: Final = 1024 * 1024  # the most room it makes at once for the rest of a large frame
KEPT_BYTES: Final = 1024 * 1024  # a buffer up to this size is kept when it empties
_PAGE: Final = 4096  # capacities are whole pages


class FrameSplitter:
    """Accumulates bytes and yields complete frame payloads (without the 4-byte size prefix).

    The size prefix is checked as soon as its 4 bytes arrive: `FrameTooLarge` if it exceeds
    `max_frame_bytes`, `DecodeError` if it is negative. The stream cannot be resynchronised after
    either, so the splitter keeps raising the same error; the connection should be closed.
    """

    __slots__ = ("_buf", "_end", "_max_frame_bytes", "_pos")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if not 0 <= max_frame_bytes <= INT32_MAX:
            raise ValueError(f"max_frame_bytes must be in [0, {INT32_MAX}], not {max_frame_bytes}")
        self._max_frame_bytes = max_frame_bytes
        self._buf = bytearray()  # its length is the capacity: bytes past _end are room
        self._pos = 0  # start of the unconsumed bytes in _buf
        self._end = 0  # end of the bytes read

    @property
    def buffered_bytes(self) -> int:
        """Bytes fed but not yet returned as part of a frame (including a partial size prefix)."""
        return self._end - self._pos

    @property
    def capacity_bytes(self) -> int:
        """The buffer's size: what is buffered and the room after it."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes read from the stream. The data is copied; the caller may reuse its buffer."""
        n = len(data) if not isinstance(data, memoryview) else data.nbytes
        self._make_room(n)
        self._buf[self._end : self._end + n] = data
        self._end += n

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """The room after the buffered bytes, to read the stream into (`asyncio.BufferedProtocol`):
        enough for `READ_BYTES` buffered in all, and the rest of the front frame (up to
        `MAX_ROOM_BYTES`) when its size is known. The hint is not used. Never empty; a bad size
        prefix is not raised here (`next_frame` raises it)."""
        unread = self._end - self._pos
        want = max(READ_BYTES - unread, 1)
        size = self._peek_size()
        if size >= 0:
            want = max(want, min(4 + size - unread, MAX_ROOM_BYTES))
        self._make_room(want)
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        """`nbytes` bytes were read into the room `get_buffer` gave."""
        if not 0 <= nbytes <= len(self._buf) - self._end:
            raise ValueError(f"{nbytes} bytes read into a room of {len(self._buf) - self._end}")
        self._end += nbytes

    def next_frame(self) -> bytes | None:
        """The next complete payload, or None if more bytes are needed."""
        size = self._front_size()
        start = self._pos + 4
        if size is None or self._end < start + size:
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
        if size is None or self._end < start + min(size, head_bytes):
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
        part = self._consume(start, min(start + size, self._end))
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
            self._end += len(head) - pos
            self._pos = 0

    # -- internals ----------------------------------------------------------------------------------

    def _front_size(self) -> int | None:
        """The front frame's size once its prefix has arrived (checked), else None."""
        pos = self._pos
        if self._end - pos < 4:
            return None
        size: int = I32.unpack_from(self._buf, pos)[0]
        if size < 0:
            raise DecodeError(f"negative frame size {size}", pos)
        if size > self._max_frame_bytes:
            raise FrameTooLarge(size, self._max_frame_bytes)
        return size

    def _peek_size(self) -> int:
        """The front frame's size if its prefix has arrived and is valid, else -1 (nothing raised)."""
        if self._end - self._pos < 4:
            return -1
        size: int = I32.unpack_from(self._buf, self._pos)[0]
        return size if 0 <= size <= self._max_frame_bytes else -1

    def _make_room(self, room: int) -> None:
        """At least `room` bytes after the buffered ones: the unread bytes moved to the front if
        that makes it, else a new buffer of twice the size or more (whole pages)."""
        buf = self._buf
        if len(buf) - self._end >= room:
            return
        unread = self._end - self._pos
        if unread + room <= len(buf):
            buf[:unread] = buf[self._pos : self._end]  # same length: no resize
        else:
            size = max(unread + room, 2 * len(buf))
            grown = bytearray(-(-size // _PAGE) * _PAGE)
            grown[:unread] = buf[self._pos : self._end]
            self._buf = grown
        self._pos, self._end = 0, unread

    def _consume(self, start: int, end: int) -> bytes:
        """Copy out buf[start:end] and drop everything before `end`."""
        buf = self._buf
        with memoryview(buf) as view:
            out = bytes(view[start:end])
        if end == self._end:  # empty: the buffer is kept for the next frames, unless it is large
            self._pos = self._end = 0
            if len(buf) > KEPT_BYTES:
                self._buf = bytearray()
        else:
            self._pos = end
        return out


def size_prefix(payload_len: int) -> bytes:
    """The 4-byte big-endian size prefix for a payload of `payload_len` bytes."""
    if not 0 <= payload_len <= INT32_MAX:
        raise ValueError(f"payload length must be in [0, {INT32_MAX}], not {payload_len}")
    return I32.pack(payload_len)
