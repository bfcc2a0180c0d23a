"""FrameSplitter.unread: frames handed back come out again first, in order, before what followed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from protocol.framing import FrameSplitter, size_prefix


def frames(*payloads: bytes) -> bytes:
    return b"".join(size_prefix(len(p)) + p for p in payloads)


def drain(splitter: FrameSplitter) -> list[bytes]:
    out = []
    while (frame := splitter.next_frame()) is not None:
        out.append(frame)
    return out


def test_unread_into_the_consumed_part_of_the_buffer() -> None:
    s = FrameSplitter()
    s.feed(frames(b"aaaa", b"bb", b"cc") + b"\x00\x00")   # and 2 bytes of a 4th size prefix
    held = [s.next_frame(), s.next_frame()]
    assert held == [b"aaaa", b"bb"]
    s.unread([b"aaaa", b"bb"])                             # fits where they were read from
    assert drain(s) == [b"aaaa", b"bb", b"cc"]
    s.feed(b"\x00\x01z")
    assert drain(s) == [b"z"]


def test_unread_larger_than_what_was_consumed() -> None:
    s = FrameSplitter()
    s.feed(frames(b"x"))
    s.unread([b"first", b"second"])                        # nothing consumed yet: prepended
    assert drain(s) == [b"first", b"second", b"x"]
    assert s.buffered_bytes == 0


def test_unread_nothing_changes_nothing() -> None:
    s = FrameSplitter()
    s.feed(b"\x00\x00")
    s.unread([])
    assert s.buffered_bytes == 2 and s.next_frame() is None


@given(st.lists(st.binary(max_size=20), max_size=6), st.integers(0, 6), st.lists(st.binary(max_size=20),
                                                                                  max_size=6))
def test_any_held_prefix_round_trips(payloads: list[bytes], take: int, extra: list[bytes]) -> None:
    s = FrameSplitter()
    s.feed(frames(*payloads))
    held = [f for f in (s.next_frame() for _ in range(min(take, len(payloads)))) if f is not None]
    s.unread(held)
    s.feed(frames(*extra))
    assert drain(s) == payloads + extra
