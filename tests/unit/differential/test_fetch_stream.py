"""A streamed Fetch response: the compiled `FetchStream` (`proxy.pumps._speedups`) against the readable
`proxy.pumps.fetch_stream.FetchStream`.

Hypothesis builds one large response (its correlation id first), the part of it the splitter holds
when the stream starts, and the rest cut into random chunks straight off the socket, the last one
perhaps carrying the start of the next frame. The response stages say one of: send it as it is,
patch its head in place, replace it (the rest is dropped), or rewrite its end (a tail that holds
back its last bytes and gives them back changed). Before that, whether the response streams at
all: the first in-flight request may be another API, answered already, read whole, another
correlation id, or the response too small. Both twins must call the host the same way (each
write's bytes, each frame of lines, the stages' arguments, each `response_done`), return the same
values, leave the same `left` after every step and the same in-flight entry.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.apis import ApiKey
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ResponseOutcome
from proxy.pumps import responses
from proxy.pumps.fetch_stream import STREAM_HEAD_BYTES, STREAM_MIN_BYTES
from proxy.pumps.fetch_stream import FetchStream as ReadableStream
from tests.unit.differential.impls import built

CORRELATION_ID = 41


def compiled_stream() -> Any:
    return built(responses.COMPILED_MODULE, "proxy.pumps._speedups").FetchStream


class HoldTail:
    """Holds back the last `hold` bytes of a response of `total` bytes; gives them back reversed."""

    def __init__(self, log: list[Any], total: int, hold: int) -> None:
        self.log, self.total, self.hold = log, total, hold
        self.seen = 0
        self.held = bytearray()

    def feed(self, chunk: bytes | memoryview) -> int:
        self.log.append(("tail feed", bytes(chunk)))
        free = max(0, min(len(chunk), self.total - self.hold - self.seen))
        self.held += chunk[free:]
        self.seen += len(chunk)
        return free

    def finish(self) -> bytes:
        self.log.append(("tail finish",))
        return bytes(reversed(self.held))


class Host:
    """The client connection as the stream sees it, every call written down."""

    def __init__(self, entry: InFlight | None, decide: str, total: int, hold: int) -> None:
        self.log: list[Any] = []
        self.entry, self.decide, self.total, self.hold = entry, decide, total, hold

    def first_in_flight(self) -> InFlight | None:
        self.log.append(("first",))
        return self.entry

    def run_response_stages(self, entry: InFlight, head: bytes, size: int) -> ResponseOutcome:
        self.log.append(("stages", entry.correlation_id, bytes(head), size))
        if self.decide == "replace":
            return ResponseOutcome(b"empty fetch", 100, replaced=True)
        if self.decide == "patch":
            return ResponseOutcome(head[:4] + b"\xff\xff\xff\xff" + head[8:], 100)
        if self.decide == "tail":
            return ResponseOutcome(head, tail=HoldTail(self.log, self.total, self.hold))
        return ResponseOutcome(head)

    def write_client(self, data: bytes | memoryview) -> None:
        self.log.append(("write", bytes(data)))

    def write_client_lines(self, parts: tuple[bytes | memoryview, ...]) -> None:
        self.log.append(("lines", tuple(bytes(p) for p in parts)))

    def response_done(self) -> None:
        self.log.append(("done",))


class Splitter:
    def __init__(self, part: bytes, left: int) -> None:
        self.part, self.left = part, left

    def take_partial(self) -> tuple[bytes, int]:
        return self.part, self.left


def entry_for(kind: str) -> InFlight | None:
    if kind == "none":
        return None
    api_key = ApiKey.PRODUCE if kind == "produce" else ApiKey.FETCH
    entry = InFlight(CORRELATION_ID + (kind == "other id"), api_key, 16, "c", 100, 0)
    entry.forwarded = kind != "answered here"
    entry.whole_response = kind == "read whole"
    if kind == "answered":
        entry.response = b"already"
    return entry


def seen_entry(entry: InFlight | None) -> Any:
    return None if entry is None else (entry.response, entry.response_bytes, entry.streamed)


def run(stream_class: Any, kind: str, decide: str, size: int, hold: int, held: int, cuts: list[int],
        after: bytes, chunk_type: type) -> Any:
    response = CORRELATION_ID.to_bytes(4, "big") + bytes(i % 251 for i in range(size - 4))
    entry = entry_for(kind)
    host = Host(entry, decide, size, hold)
    stream = stream_class(host)
    steps: list[Any] = [stream.left]
    head = response[:STREAM_HEAD_BYTES]
    found = stream.streamable(size, head[:held] if held < 4 else head)
    steps.append(found is entry and found is not None)
    if found is None:
        return steps, host.log, seen_entry(entry)
    part = response[:held]
    stream.start(found, size, Splitter(part, size - len(part)))
    steps.append(stream.left)
    rest = response[len(part):] + after
    pos = 0
    for cut in [*cuts, len(rest)]:
        if not stream.left or pos >= len(rest):
            break
        end = min(len(rest), max(pos + 1, cut))
        out = stream.feed(chunk_type(rest[pos:end]))
        steps.append((bytes(out), stream.left))
        pos = end
    return steps, host.log, seen_entry(entry)


@pytest.mark.both_twins
@settings(max_examples=150, deadline=None)
@given(kind=st.sampled_from(["fetch", "fetch", "fetch", "none", "produce", "answered", "answered here",
                             "read whole", "other id"]),
       decide=st.sampled_from(["as is", "patch", "replace", "tail"]),
       size=st.one_of(st.integers(STREAM_MIN_BYTES - 2, STREAM_MIN_BYTES + 2),
                      st.integers(STREAM_MIN_BYTES, 3 * STREAM_MIN_BYTES)),
       hold=st.integers(0, 300), held=st.one_of(st.integers(0, 40), st.integers(0, 3 * STREAM_MIN_BYTES)),
       cuts=st.lists(st.integers(0, 3 * STREAM_MIN_BYTES), max_size=12).map(sorted),
       after=st.sampled_from([b"", b"", b"\x00\x00\x00\x10next"]),
       chunk_type=st.sampled_from([bytes, bytearray]))
def test_the_compiled_stream_does_what_the_readable_one_does(
        kind: str, decide: str, size: int, hold: int, held: int, cuts: list[int], after: bytes,
        chunk_type: type) -> None:
    held = min(held, size)
    args = (kind, decide, size, hold, held, cuts, after, chunk_type)
    assert run(compiled_stream(), *args) == run(ReadableStream, *args)

