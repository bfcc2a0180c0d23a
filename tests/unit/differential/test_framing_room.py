"""The splitter's own buffer, on both twins: the room it offers the event loop to read into, the
buffer it keeps between frames, and the buffer it never resizes while a read still holds it."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from protocol.errors import DecodeError, FrameTooLarge
from protocol.framing import KEPT_BYTES, MAX_ROOM_BYTES, READ_BYTES
from tests.unit.differential.impls import PURE, compiled

pytestmark = pytest.mark.both_twins


@pytest.fixture(params=["pure", "compiled"])
def splitter_class(request: pytest.FixtureRequest) -> Any:
    return PURE.FrameSplitter if request.param == "pure" else compiled().FrameSplitter


def read(splitter: Any, data: bytes) -> int:
    """One read as uvloop makes it: the room, the bytes into it, `buffer_updated` while the room is
    held, then the room released. Returns how many bytes the room took."""
    room = memoryview(splitter.get_buffer(65536))
    assert len(splitter.get_buffer(65536)) == room.nbytes  # what asyncio's loop checks first
    n = min(room.nbytes, len(data))
    room[:n] = data[:n]
    splitter.buffer_updated(n)
    room.release()
    return n


def frame(size: int) -> bytes:
    return struct.pack(">i", size) + bytes(range(256)) * (size // 256) + bytes(size % 256)


def test_the_room_is_read_bytes_then_the_rest_of_the_frame(splitter_class: Any) -> None:
    splitter = splitter_class()
    assert READ_BYTES == 16 * 1024 and MAX_ROOM_BYTES == KEPT_BYTES == 1024 * 1024
    assert memoryview(splitter.get_buffer(-1)).nbytes == 16_384  # nothing buffered: READ_BYTES
    data = frame(50_000)
    assert read(splitter, data[:1_004]) == 1_004  # the size prefix and 1,000 bytes of payload
    # the rest of the frame is 4 + 50,000 - 1,004 = 49,000 bytes: more than the 15,380 left, so a new
    # buffer of max(1,004 + 49,000, 2 x 16,384) = 50,004 bytes, in whole pages: 13 x 4,096 = 53,248
    assert memoryview(splitter.get_buffer(-1)).nbytes == 53_248 - 1_004
    assert splitter.capacity_bytes == 53_248
    assert read(splitter, data[1_004:]) == 49_000  # the whole rest in one read
    assert splitter.next_frame() == data[4:]


def test_the_buffer_is_kept_between_frames(splitter_class: Any) -> None:
    splitter = splitter_class()
    data = frame(50_000)
    for _ in range(3):  # after the first, each frame is read whole into the same 53,248 bytes
        got = 0
        reads = 0
        while got < len(data):
            got += read(splitter, data[got:])
            reads += 1
        assert splitter.next_frame() == data[4:]
        assert splitter.capacity_bytes == 53_248 and splitter.buffered_bytes == 0
    assert reads == 1


def test_a_buffer_over_kept_bytes_is_dropped_once_empty(splitter_class: Any) -> None:
    splitter = splitter_class()
    data = frame(3 * 1024 * 1024)
    got = 0
    while got < len(data):
        got += read(splitter, data[got:])
    assert splitter.capacity_bytes > KEPT_BYTES
    assert splitter.next_frame() == data[4:]
    assert splitter.capacity_bytes == 0  # dropped: the next read starts a small buffer again
    assert memoryview(splitter.get_buffer(-1)).nbytes == READ_BYTES


def test_a_buffer_up_to_kept_bytes_is_kept(splitter_class: Any) -> None:
    splitter = splitter_class()
    data = frame(KEPT_BYTES - 4)  # a buffer of exactly KEPT_BYTES
    splitter.feed(data)
    assert splitter.capacity_bytes == KEPT_BYTES
    assert splitter.next_frame() == data[4:]
    assert splitter.capacity_bytes == KEPT_BYTES


def test_a_large_frame_grows_the_room_a_megabyte_at_a_time_at_most(splitter_class: Any) -> None:
    splitter = splitter_class()
    splitter.feed(struct.pack(">i", 50 * 1024 * 1024))  # 50 MiB announced, nothing of it sent yet
    # the room is the rest of the frame up to 1 MiB: 1 MiB + 4 bytes of buffer in whole pages
    assert memoryview(splitter.get_buffer(-1)).nbytes == 1_052_672 - 4
    assert splitter.capacity_bytes == 1_052_672


@pytest.mark.parametrize("prefix, error", [(b"\xff\xff\xff\xfe", DecodeError),  # negative
                                           (b"\x00\x00\x01\x00", FrameTooLarge)])  # over 16 bytes
def test_a_bad_size_prefix_is_raised_by_next_frame_not_by_get_buffer(splitter_class: Any, prefix: bytes,
                                                                       error: type[Exception]) -> None:
    splitter = splitter_class(16)
    read(splitter, prefix)
    assert memoryview(splitter.get_buffer(-1)).nbytes == READ_BYTES - 4
    with pytest.raises(error):
        splitter.next_frame()


def test_buffer_updated_past_the_room_is_refused(splitter_class: Any) -> None:
    splitter = splitter_class()
    room = memoryview(splitter.get_buffer(-1)).nbytes
    with pytest.raises(ValueError, match=f"{room + 1} bytes read into a room of {room}"):
        splitter.buffer_updated(room + 1)
    with pytest.raises(ValueError):
        splitter.buffer_updated(-1)
    assert splitter.buffered_bytes == 0


def test_the_buffer_is_replaced_not_resized_while_a_read_holds_its_room(splitter_class: Any) -> None:
    """uvloop calls `buffer_updated` before it releases the room: what the read's frames cause then
    (a SASL `unread`, bytes fed) must not resize the buffer under it (a bytearray refuses to)."""
    splitter = splitter_class()
    first = frame(100)
    room = memoryview(splitter.get_buffer(65536))
    room[: len(first) + 2] = first + b"\x00\x00"  # a frame and half of the next one's size prefix
    splitter.buffer_updated(len(first) + 2)
    assert splitter.next_frame() == first[4:]
    splitter.feed(b"\x00\x50" + bytes(80_000))  # the rest: more than the room held
    splitter.unread([b"again"])
    room.release()
    assert splitter.next_frame() == b"again"
    assert splitter.next_frame() == bytes(80)
    assert splitter.buffered_bytes == 80_000 - 80


def test_the_room_is_sliced_and_written_like_a_memoryview(splitter_class: Any) -> None:
    """asyncio hands a buffered protocol its bytes so (`_feed_data_to_buffered_proto`, and its TLS
    transport reads into `buf[offset:]`)."""
    splitter = splitter_class()
    data = frame(10)
    buf = splitter.get_buffer(len(data))
    buf[: len(data)] = data
    tail = buf[len(data) :]
    tail[:2] = b"\x00\x00"  # the first half of the next size prefix, through a slice
    del tail
    splitter.buffer_updated(len(data) + 2)
    del buf
    assert splitter.next_frame() == data[4:]
    assert splitter.buffered_bytes == 2
