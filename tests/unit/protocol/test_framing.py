"""FrameSplitter: size-prefixed framing, fed in any chunking."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import DecodeError, FrameSplitter, FrameTooLarge, size_prefix


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def drain(splitter: FrameSplitter) -> list[bytes]:
    frames = []
    while (payload := splitter.next_frame()) is not None:
        frames.append(payload)
    return frames


def test_one_frame_golden() -> None:
    splitter = FrameSplitter()
    splitter.feed(b"".join([
        struct.pack(">i", 10),      # size = 10
        struct.pack(">h", 18),      # api_key = ApiVersions
        struct.pack(">h", 0),       # api_version = 0
        struct.pack(">i", 42),      # correlation_id
        struct.pack(">h", -1),      # client_id = null
    ]))
    assert splitter.next_frame() == bytes.fromhex("0012 0000 0000002a ffff")
    assert splitter.next_frame() is None
    assert splitter.buffered_bytes == 0


def test_byte_at_a_time() -> None:
    payloads = [b"first", b"", b"x" * 300, b"last"]
    stream = b"".join(frame(p) for p in payloads)
    splitter = FrameSplitter()
    out = []
    for i in range(len(stream)):
        splitter.feed(stream[i : i + 1])
        out.extend(drain(splitter))
        assert splitter.buffered_bytes == (i + 1) - sum(4 + len(p) for p in out)
    assert out == payloads


def test_many_frames_in_one_chunk() -> None:
    payloads = [bytes([i]) * i for i in range(200)]
    splitter = FrameSplitter()
    splitter.feed(b"".join(frame(p) for p in payloads) + b"\x00\x00")  # plus half a size prefix
    assert drain(splitter) == payloads
    assert splitter.buffered_bytes == 2


@given(
    payloads=st.lists(st.binary(max_size=70), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=20),
)
def test_any_chunking_gives_the_same_frames(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frame(p) for p in payloads)
    bounds = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
    splitter = FrameSplitter()
    out = []
    for start, end in itertools.pairwise(bounds):
        splitter.feed(memoryview(stream)[start:end])
        out.extend(drain(splitter))
    assert out == payloads
    assert splitter.buffered_bytes == 0


def test_accepts_bytearray_and_memoryview_and_copies_them() -> None:
    chunk = bytearray(frame(b"abc"))
    splitter = FrameSplitter()
    splitter.feed(chunk[:3])
    splitter.feed(memoryview(chunk)[3:])
    chunk[:] = b"\xff" * len(chunk)  # the caller reuses its buffer
    assert splitter.next_frame() == b"abc"


def test_returns_read_only_bytes() -> None:
    splitter = FrameSplitter()
    splitter.feed(frame(b"payload"))
    assert type(splitter.next_frame()) is bytes


def test_large_frame_in_small_chunks() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    stream = frame(payload) + frame(b"next")
    splitter = FrameSplitter()
    for start in range(0, len(stream), 16 * 1024):
        splitter.feed(stream[start : start + 16 * 1024])
    assert drain(splitter) == [payload, b"next"]


def test_frame_at_the_limit_is_accepted() -> None:
    splitter = FrameSplitter(max_frame_bytes=5)
    splitter.feed(frame(b"12345"))
    assert splitter.next_frame() == b"12345"


def test_too_large_is_raised_as_soon_as_the_prefix_arrives() -> None:
    splitter = FrameSplitter(max_frame_bytes=5)
    splitter.feed(struct.pack(">i", 6))  # size = 6 > 5; no body bytes yet
    with pytest.raises(FrameTooLarge) as exc_info:
        splitter.next_frame()
    assert (exc_info.value.size_bytes, exc_info.value.max_frame_bytes) == (6, 5)
    with pytest.raises(FrameTooLarge):  # the stream cannot resynchronise: it keeps failing
        splitter.next_frame()


def test_default_limit_is_100_mib() -> None:
    splitter = FrameSplitter()
    splitter.feed(struct.pack(">i", 100 * 1024 * 1024 + 1))
    with pytest.raises(FrameTooLarge):
        splitter.next_frame()


def test_negative_size_is_a_decode_error() -> None:
    splitter = FrameSplitter()
    splitter.feed(frame(b"ok") + struct.pack(">i", -1))
    assert splitter.next_frame() == b"ok"
    with pytest.raises(DecodeError, match="negative frame size -1"):
        splitter.next_frame()


def test_partial_prefix_needs_more() -> None:
    splitter = FrameSplitter()
    splitter.feed(b"\x00\x00\x00")
    assert splitter.next_frame() is None
    assert splitter.buffered_bytes == 3


def test_invalid_limit() -> None:
    with pytest.raises(ValueError):
        FrameSplitter(max_frame_bytes=-1)


def test_size_prefix() -> None:
    assert size_prefix(0) == b"\x00\x00\x00\x00"
    assert size_prefix(258) == b"\x00\x00\x01\x02"
    assert size_prefix(2**31 - 1) == b"\x7f\xff\xff\xff"
    with pytest.raises(ValueError):
        size_prefix(2**31)
    with pytest.raises(ValueError):
        size_prefix(-1)


# --------------------------------------------------------------------------- cut-through


def test_pending_frame_reports_size_and_head_before_the_frame_is_complete() -> None:
    splitter = FrameSplitter()
    payload = bytes(range(100))
    splitter.feed(struct.pack(">i", 100) + payload[:10])   # size 100, 10 bytes of payload so far
    assert splitter.pending_frame(16) is None               # the 16-byte head is not there yet
    splitter.feed(payload[10:30])
    assert splitter.pending_frame(16) == (100, payload[:16])
    assert splitter.next_frame() is None                    # nothing was consumed
    part, still_to_come = splitter.take_partial()
    assert part == payload[:30] and still_to_come == 70
    assert splitter.buffered_bytes == 0


def test_take_partial_of_a_complete_frame_leaves_the_next_one() -> None:
    splitter = FrameSplitter()
    splitter.feed(struct.pack(">i", 3) + b"abc" + struct.pack(">i", 2) + b"de")
    assert splitter.pending_frame(8) == (3, b"abc")         # a frame shorter than the head
    assert splitter.take_partial() == (b"abc", 0)
    assert splitter.next_frame() == b"de"


def test_pending_frame_checks_the_size_prefix() -> None:
    splitter = FrameSplitter(max_frame_bytes=1024)
    splitter.feed(struct.pack(">i", 4096))
    with pytest.raises(FrameTooLarge):
        splitter.pending_frame(16)
