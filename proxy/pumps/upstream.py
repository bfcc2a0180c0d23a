"""The broker side of one client connection: frames in, and the streaming of large Fetch responses.

Everything it reads goes to its `ClientConnection` (`proxy.pumps.connection`): whole response
frames, or, for a large Fetch response, the stream (`proxy.pumps.fetch_stream.FetchStream`), which
takes the rest straight off the socket without framing or copying.

Requests to the broker are corked as the client's output is (`proxy.pumps.client_output`): while the
client connection handles a read of its client that brought more than one frame, the frames it
forwards are held and written as one `writelines` when it takes the cork out; `close` writes what
is held first. And while this side handles a read of the broker that brought more than one frame,
it corks the client's output, so the responses that read completes reach the client in one write.

It is an `asyncio.BufferedProtocol`: the event loop reads the broker's socket into the frame
splitter's own buffer (`protocol.framing`), except while a large Fetch response streams: then each
read gets a new buffer of at most `STREAM_READ_BYTES`, and never past the response's end, which goes
to the client as it is (its transport may still hold it when the next read comes).

`write`, `cork`, `uncork`, `release`, `get_buffer`, `buffer_updated` and `data_received` below are
the readable reference of `proxy.pumps._speedups.UpstreamReader`, which the connection installs in
their place when it was built (SLUICE_PURE_PYTHON=1, or no build, runs these).
"""

from __future__ import annotations

import asyncio
from typing import Protocol, cast

from protocol.errors import ProtocolError
from protocol.fastpath import FrameSplitter
from protocol.framing import size_prefix
from proxy.pumps.client_output import WriteCork
from proxy.pumps.fetch_stream import STREAM_HEAD_BYTES, STREAM_READ_BYTES, FetchStream
from proxy.pumps.responses import COMPILED_REQUESTS


class Corkable(Protocol):
    """An output that holds what is written between `cork` and `uncork` (`ClientOutput`)."""

    def cork(self) -> None: ...

    def uncork(self) -> None: ...


class UpstreamClient(Protocol):
    """What the broker side drives of its client connection (`proxy.pumps.connection.ClientConnection`)."""

    @property
    def fetch_stream(self) -> FetchStream: ...

    @property
    def client_output(self) -> Corkable: ...

    @property
    def closed(self) -> bool: ...

    def on_upstream_frame(self, payload: bytes) -> None: ...

    def on_upstream_lost(self, exc: Exception | None) -> None: ...

    def on_upstream_backpressure(self, paused: bool) -> None: ...

    def close(self, reason: str | None = None) -> None: ...


class UpstreamConnection(asyncio.BufferedProtocol):
    def __init__(self, client: UpstreamClient, max_frame_bytes: int,
                 max_buffered_bytes: int | None = None) -> None:
        self._client = client
        self._max_buffered_bytes = max_buffered_bytes  # the write buffer's high-water mark
        self._stream = client.fetch_stream
        self._splitter = FrameSplitter(max_frame_bytes)
        self._transport: asyncio.Transport | None = None
        self._cork = WriteCork()  # the requests held while corked: size prefixes and payloads
        self._output_corked = False  # the read being handled corked the client's output
        self._stream_room: bytearray | None = None  # the buffer of a streamed response's next read
        self._reader = None if COMPILED_REQUESTS is None else COMPILED_REQUESTS.UpstreamReader(self, client)
        if self._reader is not None:  # the compiled twin of these methods
            reader = self._reader
            vars(self).update(write=reader.write, data_received=reader.data_received, cork=reader.cork,
                              uncork=reader.uncork, release=reader.release, get_buffer=reader.get_buffer,
                              buffer_updated=reader.buffer_updated)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        if self._reader is not None:
            self._reader.attach(transport)
        if self._max_buffered_bytes is not None:  # requests a slow broker has not read yet
            high = self._max_buffered_bytes
            self._transport.set_write_buffer_limits(high=high, low=high // 4)

    def write(self, payload: bytes) -> None:
        if self._cork.corked:
            self._cork.held += (size_prefix(len(payload)), payload)
            return
        assert self._transport is not None
        self._transport.writelines((size_prefix(len(payload)), payload))

    def cork(self) -> None:
        """Hold the requests written from now until the matching `uncork`."""
        self._cork.cork()

    def uncork(self) -> None:
        """Take out one cork; the last one writes what is held, as one `writelines`."""
        if self._cork.uncork():
            self.release()

    def release(self) -> None:
        """Write what is held now, corked or not."""
        held = self._cork.take()
        if held:
            assert self._transport is not None
            if not self._transport.is_closing():
                self._transport.writelines(held)

    def get_buffer(self, sizehint: int) -> memoryview | bytearray:
        """Where the event loop reads the broker's socket: while a response streams, a new buffer
        for its next bytes, no longer than what is left of it; else the splitter's room."""
        left = self._stream.left
        if left:
            room = self._stream_room = bytearray(min(left, STREAM_READ_BYTES))
            return room
        self._stream_room = None
        return self._splitter.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        room = self._stream_room
        if room is not None:  # the streamed response's next bytes, and nothing after them
            self._stream_room = None
            self._stream.feed(room if nbytes == len(room) else memoryview(room)[:nbytes])
            return
        self._splitter.buffer_updated(nbytes)
        self._read()

    def data_received(self, data: bytes) -> None:
        """Bytes handed over instead of read into this side's buffers (as a loop that does not
        read into a buffered protocol would): the stream takes its part, the splitter a copy of the
        rest."""
        stream = self._stream
        rest = stream.feed(data) if stream.left else data
        if rest:
            self._splitter.feed(rest)
            self._read()

    def _read(self) -> None:
        """Handle what the splitter holds, the client's output corked if it holds several frames."""
        self._output_corked = False
        try:
            self._frames()
        finally:
            if self._output_corked:
                self._client.client_output.uncork()

    def _frames(self) -> None:
        stream = self._stream
        splitter = self._splitter
        client = self._client
        try:
            while True:
                pending = splitter.pending_frame(STREAM_HEAD_BYTES)
                if pending is None:
                    return
                size, head = pending
                entry = stream.streamable(size, head) if not client.closed else None
                if entry is not None:
                    stream.start(entry, size, splitter)
                    if stream.left:
                        return  # the splitter is empty; the rest comes straight off the socket
                    continue
                payload = splitter.next_frame()
                if payload is None:
                    return
                if not self._output_corked and splitter.buffered_bytes:  # more follows in this read:
                    client.client_output.cork()  # the responses it completes go to the client in one write
                    self._output_corked = True
                client.on_upstream_frame(payload)
        except ProtocolError as exc:
            client.close(f"malformed frame from the broker: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self._client.on_upstream_lost(exc)

    def pause_writing(self) -> None:
        self._client.on_upstream_backpressure(True)

    def resume_writing(self) -> None:
        self._client.on_upstream_backpressure(False)

    def pause_reading(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()

    def close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self.release()
            self._transport.close()
