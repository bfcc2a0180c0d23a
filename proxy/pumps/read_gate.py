"""When one client's socket is read, and when the frames it sent are handled.

The connection (`proxy.pumps.connection`) asks `frames_allowed()` before each buffered frame and
calls `update()` after anything that may change the answer; the gate pauses or resumes the
transport. Frames are not handled while:

- the upstream connection is not up yet (`upstream_up`);
- the channel is muted for a throttle (KIP-219), until the throttled response has been written
  and the delay has passed;
- the upstream socket's write buffer is full (`backpressure`), or the connection has closed
  (`closed`);
- `max_in_flight_requests_per_connection` requests await their responses (Kafka itself reads one
  request per connection at a time; Sluice lets clients pipeline up to this many).

The socket is read under the same conditions but one: a muted channel with nothing buffered is
still read, so that a client that goes away while muted (a librdkafka request timeout closes and
reconnects) is noticed at once and its upstream connection and buffers are freed, instead of at
the mute's end; what a client sends while muted waits unprocessed, one read at most, as it would
in the socket. While a muted channel is not read, `PeerWatch` checks the socket's TCP state every
second, so a client that pipelined before it went away (librdkafka) is noticed too.

`draining` (SIGTERM) is not among them: what a client sends while Sluice drains is still read
and answered, and the connection closes between requests (`ClientConnection.begin_drain`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sized

from protocol.framing import FrameSplitter
from proxy.flow.pipeline import ConnectionContext
from proxy.pumps.limits import MAX_IN_FLIGHT, LimitLog
from proxy.pumps.muting import ChannelMute, ChannelMuteState
from proxy.pumps.peer_watch import PeerWatch, peer_has_closed
from proxy.pumps.throttle_timer import CallLater

log = logging.getLogger("sluice.connection")

_NOT_MUTED = ChannelMuteState.NOT_MUTED


class ReadGate:
    """Whether one client's frames are handled and its socket read; pauses and resumes the socket."""

    __slots__ = ("_close", "_ctx", "_in_flight", "_limit_log", "_max_in_flight", "_mute", "_peer_watch",
                 "_splitter", "_transport", "backpressure", "closed", "draining", "paused", "upstream_up")

    def __init__(self, mute: ChannelMute, splitter: FrameSplitter, in_flight: Sized, max_in_flight: int,
                 ctx: ConnectionContext, limit_log: LimitLog, call_later: CallLater,
                 close: Callable[[], None]) -> None:
        self._mute = mute
        self._splitter = splitter
        self._in_flight = in_flight          # the in-flight queue itself: len() without a Python call
        self._max_in_flight = max_in_flight
        self._ctx = ctx
        self._limit_log = limit_log
        self._close = close
        self._peer_watch = PeerWatch(call_later, self._peer_closed, self._peer_gone)
        self._transport: asyncio.Transport | None = None
        self.upstream_up = self.backpressure = self.closed = False
        self.draining = False  # SIGTERM: frames still flow; after each response the connection may close
        self.paused = False                  # the transport's reading is paused

    def attach(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def frames_allowed(self) -> bool:
        """Whether the next buffered frame may be handled (`_open` and not muted, in one call: it
        runs before every frame)."""
        return (self._mute.state is _NOT_MUTED and self.upstream_up
                and len(self._in_flight) < self._max_in_flight and not (self.backpressure or self.closed))

    def _open(self) -> bool:
        """Everything but the mute that lets frames in."""
        return (self.upstream_up and len(self._in_flight) < self._max_in_flight
                and not (self.backpressure or self.closed))

    def _socket_readable(self) -> bool:
        """A mute alone stops the socket only once something the client sent is buffered."""
        return (self._mute.state is _NOT_MUTED or not self._splitter.buffered_bytes) and self._open()

    def update(self) -> None:
        """Pause or resume the socket to match the conditions now."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        readable = self._socket_readable()
        if readable and self.paused:
            transport.resume_reading()
            self.paused = False
            self._peer_watch.stop()
        elif not readable and not self.paused:
            transport.pause_reading()
            self.paused = True
            if len(self._in_flight) >= self._max_in_flight:
                self._limit_log.hit(MAX_IN_FLIGHT, f"connection from {self._ctx.client_address}: "
                                    f"{self._max_in_flight} requests await responses; reading paused")
        if self.paused and self._mute.state is not _NOT_MUTED:
            self._peer_watch.start()  # not read while muted: ask the kernel whether the client left

    def stop(self) -> None:
        self.closed = True
        self._peer_watch.stop()

    def _peer_closed(self) -> bool:
        transport = self._transport
        return transport is not None and peer_has_closed(transport.get_extra_info("socket"))

    def _peer_gone(self) -> None:
        """The client closed while its muted channel was not being read."""
        log.debug("connection %d from %s: the client closed while muted", self._ctx.connection_id,
                  self._ctx.client_address)
        self._close()


__all__ = ["ReadGate"]
