"""Fetch streaming: a large Fetch response goes to the client while it is still arriving.

Store-and-forward would add the whole receive time to every fetch round trip. The quota decision
needs only the size and the first bytes, so it is taken when the response starts: either the head
is patched (throttle time) and the rest streams through untouched, or the client gets the
broker-style empty response (`ResponseOutcome.replaced`) and the rest of the broker's bytes are
dropped.

**Rewriting the end of a streamed response** (a Fetch v16+ carries leader endpoints in its
top-level tag section, KIP-951): a response stage returns `ResponseOutcome.tail`, a
`proxy.flow.pipeline.StreamTail` that sees every chunk, says how many leading bytes may go out now
and holds the rest; `finish()` gives the held bytes rewritten to the same length, sent last (the
size prefix has already gone out). `FetchStream._send` is the one place chunks pass through.
"""

from __future__ import annotations

from typing import Protocol

from protocol.apis import ApiKey
from protocol.framing import FrameSplitter, size_prefix
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ResponseOutcome, StreamTail

STREAM_MIN_BYTES = 64 * 1024   # smaller responses are simply buffered whole
STREAM_HEAD_BYTES = 32         # header, throttle_time_ms, error_code and session_id of any Fetch
STREAM_READ_BYTES = 256 * 1024  # the most one read of the broker's socket takes of a streaming response


class StreamHost(Protocol):
    """What the stream needs of its client connection."""

    def first_in_flight(self) -> InFlight | None: ...

    def run_response_stages(self, entry: InFlight, head: bytes, size: int) -> ResponseOutcome:
        """The response stages on a response's head (`proxy.pumps.responses.ResponseOrder.run_stages`)."""
        ...

    def write_client(self, data: bytes | bytearray | memoryview) -> None: ...

    def write_client_lines(self, parts: tuple[bytes | memoryview, ...]) -> None: ...

    def response_done(self) -> None:
        """A response is complete: write what is ready, in order."""
        ...


class FetchStream:
    """The response now streaming from the broker to the client on one connection, if any."""

    __slots__ = ("_entry", "_forward", "_host", "_tail", "left")

    def __init__(self, host: StreamHost) -> None:
        self._host = host
        self._entry: InFlight | None = None
        self._forward = True             # False: the client got a replacement; drop the rest
        self._tail: StreamTail | None = None
        self.left = 0                    # bytes of the response still to come from the broker

    def streamable(self, size: int, head: bytes) -> InFlight | None:
        """The in-flight Fetch a response of `size` starting with `head` belongs to, if it streams."""
        if size < STREAM_MIN_BYTES:
            return None
        entry = self._host.first_in_flight()
        if (entry is None or entry.api_key != ApiKey.FETCH or not entry.forwarded
                or entry.response is not None or entry.whole_response or len(head) < 4
                or int.from_bytes(head[:4], "big", signed=True) != entry.correlation_id):
            return None
        return entry

    def start(self, entry: InFlight, size: int, splitter: FrameSplitter) -> None:
        """Take what the splitter holds of the response, send or drop it; `left` is what is to come."""
        part, left = splitter.take_partial()
        head = part[:STREAM_HEAD_BYTES]
        sent_head, replaced, tail = self._decide(entry, size, head)
        self._entry, self._forward, self._tail, self.left = entry, not replaced, tail, left
        if replaced:
            self._host.response_done()
        elif tail is None:
            self._host.write_client_lines((size_prefix(size), sent_head, memoryview(part)[len(head):]))
        else:
            self._host.write_client(size_prefix(size))
            self._send(sent_head)
            self._send(memoryview(part)[len(head):])
        if not left:
            self._end()

    def _decide(self, entry: InFlight, size: int, head: bytes) -> tuple[bytes, bool, StreamTail | None]:
        """Run the response stages on the head: (head to send, replaced, tail rewrite)."""
        outcome = self._host.run_response_stages(entry, head, size)
        if outcome.replaced:
            entry.response = outcome.payload
            entry.response_bytes = len(outcome.payload)
        else:
            entry.response_bytes = size
        return outcome.payload, outcome.replaced, outcome.tail

    def feed(self, data: bytes | bytearray | memoryview) -> bytes | bytearray | memoryview:
        """Bytes straight off the broker's socket while `left`; returns what follows the response."""
        n = min(self.left, len(data))
        if self._forward:
            self._send(data if n == len(data) else memoryview(data)[:n])
        self.left -= n
        if self.left:
            return b""
        self._end()
        return data[n:] if n < len(data) else b""

    def _send(self, chunk: bytes | bytearray | memoryview) -> None:
        tail = self._tail
        if tail is not None:
            ready = tail.feed(chunk)
            chunk = chunk if ready == len(chunk) else chunk[:ready]
        if chunk:
            self._host.write_client(chunk)

    def _end(self) -> None:
        entry, tail, forward = self._entry, self._tail, self._forward
        self._entry, self._tail, self._forward = None, None, True
        if entry is None or not forward:
            return
        if tail is not None:
            self._host.write_client(tail.finish())
        entry.streamed = True
        entry.response = b""
        self._host.response_done()
