"""One client connection: frames in order between the client and its upstream connection.

`ClientConnection` and `UpstreamConnection` (`proxy.pumps.upstream`) are asyncio buffered protocols:
the event loop reads each socket into that side's frame splitter (`protocol.framing`), with no bytes
object made per read (a Protocol-based forwarder moves about twice the bytes of a streams-based one
on this kind of machine). They only move frames: framing is `protocol.fastpath`'s, order is
`InFlightRequests`, the throttle delay is `ThrottleTimer`, large Fetch responses are `FetchStream`,
raw SASL tokens are `SaslMode`, what it writes to the client goes through `ClientOutput`, responses
go back in request order through `ResponseOrder` (`proxy.pumps.responses`), and every decision about
a request or response is the pipeline's. When the client's socket is read and its frames handled is
the `ReadGate`'s (`proxy.pumps.read_gate`): not before the upstream connection is up, not while the
channel is muted for a throttle with something buffered, not under back-pressure or while draining,
not with `max_in_flight_requests_per_connection` requests awaiting responses.

Reading from the broker stops while the client's write buffer is over
`max_buffered_bytes_per_connection` or the total budget pauses this connection
(`proxy.pumps.limits.ClientBuffer`). The handshake deadline and the idle timeout are the
`ConnectionWatchdog`'s; admission (connection counts and rates) happened before this object existed
(`proxy.pumps.limits.AdmissionGate`).

The per-frame byte work (framing, the request header, Produce acks; on the response side the
correlation id and the throttle patch) is `protocol.fastpath`: the compiled twin of the readable
pure-Python functions when it was built, the pure ones under SLUICE_PURE_PYTHON=1. The same holds
for the per-request orchestration: `buffer_updated`, `data_received`, `_read_on` and `_on_request`
below are the readable reference of `proxy.pumps._speedups.RequestReader`, which a connection
installs in their place when it was built; `ResponseOrder` (`proxy.pumps.responses`), `ClientOutput`
and the upstream side (`proxy.pumps.upstream`) have their twins in the same module, chosen with it.

A malformed frame or a broken upstream closes this connection, with the reason logged, and nothing
else. The principal (`ctx.principal`) is set at the start from the TLS certificate or address
(`proxy.pumps.principals.AuthSettings`) and by the SASL exchange (`proxy.pumps.sasl_mode`).
"""

from __future__ import annotations

import asyncio
import fcntl
import itertools
import logging
import sys
import termios
from collections.abc import Callable
from typing import Any, cast

from protocol.apis import ApiKey
from protocol.errors import ProtocolError
from protocol.fastpath import FrameSplitter, read_produce_acks, read_request_header
from protocol.sasl import SASL_API_KEYS
from proxy.flow.connection_stats import ConnectionStats
from proxy.flow.inflight import InFlight, InFlightRequests
from proxy.flow.pipeline import AnswerHere, AnswerLater, Close, ConnectionContext, Forward
from proxy.pumps.client_output import ClientOutput
from proxy.pumps.fetch_stream import FetchStream
from proxy.pumps.limits import ClientBuffer, ConnectionWatchdog, LimitLog
from proxy.pumps.muting import ChannelMuteState
from proxy.pumps.read_gate import ReadGate
from proxy.pumps.responses import COMPILED_REQUESTS, ResponseOrderImpl
from proxy.pumps.sasl_mode import FrameHandler, SaslMode
from proxy.pumps.services import ConnectionServices, Opening, Upstream, UpstreamLink
from proxy.pumps.throttle_timer import ThrottleTimer
from proxy.pumps.upstreams import UpstreamTarget

log = logging.getLogger("sluice.connection")

_ids = itertools.count(1)

__all__ = ["ClientConnection", "ConnectionServices", "connection_factory"]


class ClientConnection(asyncio.BufferedProtocol):
    def __init__(self, services: ConnectionServices, target: UpstreamTarget,
                 real_address: tuple[str, int] | None = None) -> None:
        reader = None if COMPILED_REQUESTS is None else COMPILED_REQUESTS.RequestReader(self)
        if reader is not None:  # the compiled twin of data_received, buffer_updated, _read_on and
            vars(self).update(data_received=reader.data_received, buffer_updated=reader.buffer_updated,
                              _read_on=reader.read_on, read_on=reader.read_on,  # _on_request, first:
                              _on_request=reader.on_request)  # the parts below bind them
        self.services = self._services = services
        self._target = target
        self._clock = services.clock
        self._pipeline = services.pipeline
        self._now_ms = self._clock.now_ms
        self._splitter = FrameSplitter(services.max_frame_bytes)
        if reader is not None:  # the socket is read straight into the splitter's room
            vars(self)["get_buffer"] = self._splitter.get_buffer
        self._inflight = InFlightRequests()
        self.throttle = ThrottleTimer(services.clock, services.call_later, self._read_on)
        self._mute = self.throttle.mute  # read on every frame: one attribute, no property chain
        self.fetch_stream: FetchStream = (FetchStream if COMPILED_REQUESTS is None
                                          else COMPILED_REQUESTS.FetchStream)(self)
        self._transport: asyncio.Transport | None = None
        self._link = UpstreamLink()
        self._upstream_write = self.send_upstream = self._link.write  # the upstream's own, once it is up
        self._processing = self.closed = False
        # the last request forwarded was one the broker takes only on an authenticated connection
        # (not ApiVersions, SaslHandshake or SaslAuthenticate): Sluice may send its own (send_own)
        self._past_auth = False
        self._close_reason: str | None = None
        self.ctx = ConnectionContext(next(_ids), "?", target.describe(), target.node_id,
                                     stats=ConnectionStats(self._clock.now_ms()), send_own=self.send_own)
        self._real_address = real_address           # the client behind a PROXY-protocol hop
        self._client_frame: FrameHandler = self._on_request
        self._limits = limits = services.limits
        self.admitted_ip: str | None = None  # set by the AdmissionGate; released when this closes
        self._watchdog = ConnectionWatchdog(self._clock, services.call_later, limits.settings,
                                            lambda: len(self._inflight),
                                            _limit_closer(limits.log, self.ctx, self.close))
        self._buffer = ClientBuffer(limits, self.ctx.connection_id, self._link.set_paused)
        output = ClientOutput if COMPILED_REQUESTS is None else COMPILED_REQUESTS.ClientOutput
        self._out = output(self._buffer, self._watchdog, self._now_ms)
        self.client_output = self._out  # corked by the upstream side while it reads (proxy.pumps.upstream)
        self.write_client, self.write_client_lines = self._out.write, self._out.writelines
        self.send_client = self._out.frame
        self._gate = ReadGate(self._mute, self._splitter, self._inflight.queue,
                              limits.settings.max_in_flight_requests_per_connection, self.ctx,
                              limits.log, services.call_later, self.close)
        self.responses = ResponseOrderImpl(
            self.ctx, self._pipeline, self._clock, self._inflight, self.throttle, self._gate, self._splitter,
            target.describe(), send=self._out.frame, start_throttle=self.start_throttle,
            read_on=self._read_on, close=self.close, is_closed=lambda: self.closed)
        self._flush = self.response_done = self.responses.flush
        self.run_response_stages = self.responses.run_stages
        # the responses' own handler, kept as one object: a compiled UpstreamReader hands frames
        # straight to a compiled ResponseOrder while this is the handler (no SASL exchange, no stream)
        self._responses_frame: FrameHandler = self.responses.on_broker_frame
        self._broker_frame: FrameHandler = self._responses_frame
        if reader is not None:
            reader.attach()

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    @property
    def mute_state(self) -> ChannelMuteState:
        """Kafka's channel mute state now (`proxy.pumps.muting`): NOT_MUTED unless throttled."""
        return self._mute.state

    # ------------------------------------------------------------------ client side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self._buffer.attach(self._transport)
        self._out.attach(self._transport)
        self._gate.attach(self._transport)
        self._watchdog.start()
        peer = self._real_address or transport.get_extra_info("peername")
        self.ctx.client_address = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._services.connections.add(self)
        if self._services.on_open:
            self._services.on_open(self)
        try:
            self.ctx.principal = self._services.auth.connection_principal(
                transport.get_extra_info("ssl_object"), str(peer[0]) if peer else "?")
        except ProtocolError as exc:
            self.close(f"no principal for the client certificate: {exc}")
            return
        self._gate.update()  # paused until the upstream is connected
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._services.connect_upstream(self, self._target))
        task.add_done_callback(self._upstream_ready)
        if self._services.draining:  # accepted as the drain began: bytes read past a PROXY header
            self._gate.draining = True  # are handed over after this returns, so look after them
            loop.call_soon(self.close_if_drained)

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the event loop reads the client's socket: the splitter's room."""
        return self._splitter.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self._watchdog.last_active_ms = self._now_ms()
        self._splitter.buffer_updated(nbytes)
        self._read_on()

    def data_received(self, data: bytes) -> None:
        """Bytes read before this connection took the socket over (past a PROXY header, or while
        the admission gate held it): copied into the splitter, then handled as a read."""
        self._watchdog.last_active_ms = self._now_ms()
        try:
            self._splitter.feed(data)
        except ProtocolError as exc:
            self.close(f"malformed frame from client: {exc}")
            return
        self._read_on()

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._gate.stop()
        self.throttle.cancel()
        self._watchdog.cancel()
        self._buffer.close()
        if self.admitted_ip is not None:
            self._limits.release(self.admitted_ip)
            self.admitted_ip = None
        _log_closed(self.ctx, self._close_reason, exc, self._inflight.pending_upstream())
        self._link.close()
        for entry in self._inflight.queue:
            if entry.own is not None and not entry.own.done():
                entry.own.set_exception(ConnectionError("the client connection closed"))
        self._services.connections.discard(self)
        if self._services.on_close:
            self._services.on_close(self)

    def pause_writing(self) -> None:  # the client reads slower than the broker answers
        self._buffer.client_full(True)

    def resume_writing(self) -> None:
        self._buffer.client_full(False)

    def close(self, reason: str | None = None) -> None:
        if reason is not None and self._close_reason is None:
            self._close_reason = reason
        if self._transport is not None and not self._transport.is_closing():
            self._out.release()  # what the client was answered first, as a transport sends its buffer
            self._transport.close()
        self._link.close()

    def begin_drain(self) -> None:
        """SIGTERM: answer every request the client has sent, then close between requests.

        Requests keep being read and handled while draining (a request that reached this host
        is never dropped by the drain: one sent just before the signal may still be in the
        socket, or buffered while the upstream connects); the connection closes at its first
        moment with nothing in flight, nothing buffered and nothing unread in the socket, so a
        client sees the close between two requests. The server closes what is left after
        `drain_timeout_ms`."""
        self._gate.draining = True
        self._gate.update()
        self.close_if_drained()

    def close_if_drained(self) -> None:
        """Draining: close if the connection is between requests now."""
        if (self.closed or len(self._inflight) or self._splitter.buffered_bytes
                or unread_bytes(self._transport)):
            return  # a response, a frame or the socket's next bytes will call this again
        self.close()

    def _upstream_ready(self, task: asyncio.Task[Upstream | str]) -> None:
        if task.cancelled():
            return
        result = task.result()
        if isinstance(result, str):
            self.close(result)
        elif self.closed:
            result.close()
        else:
            self._link.connected(result)
            self._upstream_write = result.write  # frames are read only from here on: no hop per request
            self._gate.upstream_up = True
            self._read_on()

    # ------------------------------------------------------------------ requests

    def _read_on(self) -> None:
        """Handle the buffered client frames while the gate allows."""
        if self._processing:  # re-entered from a flush inside a frame handler: the outer loop goes on
            return
        self._processing = True
        gate = self._gate
        splitter = self._splitter
        next_frame = splitter.next_frame
        corked = None  # the upstream, once this read was corked
        try:
            # (nothing buffered: no frame, and the gate is not asked; frames_allowed() runs per frame)
            while splitter.buffered_bytes and gate.frames_allowed():
                try:
                    payload = next_frame()
                except ProtocolError as exc:
                    self.close(f"malformed frame from client: {exc}")
                    return
                if payload is None:
                    break
                if corked is None and splitter.buffered_bytes:  # more follows in this read: what the
                    corked = self._link.upstream  # frames forward, and what is answered here, is
                    assert corked is not None     # written once each way (frames: the upstream is up)
                    corked.cork()
                    self._out.cork()
                self._client_frame(payload)
        finally:
            self._processing = False
            if corked is not None:
                corked.uncork()  # the requests first: the broker starts on them sooner
                self._out.uncork()
        if gate.paused or not gate.frames_allowed():
            gate.update()  # (reading and allowed frames is the state update() keeps as it is)
        if gate.draining:
            self.close_if_drained()

    def _on_request(self, payload: bytes) -> None:
        try:
            header = read_request_header(payload)
        except ProtocolError as exc:
            self.close(f"malformed request header: {exc}")
            return
        now_ms = self._clock.now_ms()
        api_key = header.api_key
        expects_response = True
        if api_key == ApiKey.PRODUCE:  # acks=0: no response will come
            try:
                expects_response = read_produce_acks(payload, header) != 0
            except ProtocolError as exc:
                log.warning("connection %d: cannot read Produce acks (%s); expecting a response",
                            self.ctx.connection_id, exc)
        entry = InFlight(header.correlation_id, api_key, header.api_version, header.client_id,
                         len(payload), now_ms, expects_response=expects_response)
        if not self._watchdog.handshake_done:
            self._watchdog.request(api_key)
        outcome = self._pipeline.on_request(self.ctx, entry, header, payload)
        if type(outcome) is Forward:
            self._upstream_write(payload if outcome.payload is None else outcome.payload)
        elif type(outcome) is AnswerHere:
            entry.answer(outcome.response, now_ms)
        elif type(outcome) is AnswerLater:
            entry.forwarded = False
            self.responses.answer_later(entry, outcome.pending)
        elif type(outcome) is Close:
            self.close(outcome.reason)
            return
        if expects_response:
            self._inflight.add(entry)
        if api_key in SASL_API_KEYS:  # SaslHandshake, SaslAuthenticate
            self._past_auth = False
            sasl = self.responses.sasl  # one SaslMode per connection, kept where responses reach it
            if sasl is None:
                services = self._services
                sasl = self.responses.sasl = SaslMode(self, services.auth, services.max_frame_bytes)
            sasl.on_request(header, payload, entry)
        elif not self._past_auth and type(outcome) is Forward and api_key != ApiKey.API_VERSIONS:
            self._past_auth = True
        if outcome.throttle_time_ms > 0:
            self.start_throttle(now_ms, outcome.throttle_time_ms)
            if expects_response:
                entry.mutes_channel = True
            else:
                self.throttle.response_sent()  # acks=0: no response will come
        if not expects_response:
            self._pipeline.on_complete(self.ctx, entry, now_ms)
        if entry.response is not None:
            self._flush()

    def send_own(self, payload: bytes) -> asyncio.Future[bytes] | None:
        """Send Sluice's own request (`payload`, no size prefix, a correlation id Sluice chose) on
        this connection's upstream, authenticated as the client; the broker's response resolves the
        future (a closed connection fails it) and never reaches the client or the stages. None when
        it cannot be sent now: the upstream is not up or is full, the connection is closing or
        draining, or the last request forwarded was not one the broker takes only once the
        connection is authenticated (ApiVersions and SASL requests: an exchange may be under way,
        and a request inside it would make the broker close the connection). It takes a slot in
        the order it was written, so the client's responses keep their order."""
        gate = self._gate
        if (self.closed or not self._past_auth or not gate.upstream_up or gate.draining
                or gate.backpressure):
            return None
        header = read_request_header(payload)
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        entry = InFlight(header.correlation_id, header.api_key, header.api_version, header.client_id,
                         len(payload), self._clock.now_ms(), own=future)
        self._upstream_write(payload)
        self._inflight.add(entry)
        return future

    def start_throttle(self, now_ms: int, throttle_time_ms: int) -> None:
        self.throttle.start(now_ms, throttle_time_ms)
        self._gate.update()

    # ------------------------------------------------------------------ responses

    def on_upstream_frame(self, payload: bytes) -> None:
        if not self.closed:
            self._broker_frame(payload)

    def on_upstream_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        pending = self._inflight.pending_upstream()
        what = f"upstream {self._target.describe()} closed" + (f": {exc}" if exc else "")
        if pending or exc is not None:
            self.close(f"{what} with {pending} request(s) in flight")
        else:
            self.close()  # an idle upstream went away: the client reconnects
            log.info("connection %d: %s", self.ctx.connection_id, what)

    def on_upstream_backpressure(self, paused: bool) -> None:
        self._gate.backpressure = paused
        if paused:
            self._gate.update()
        else:
            self._read_on()

    # ------------------------------------------------------------------ for FetchStream and SaslMode

    def first_in_flight(self) -> InFlight | None:
        return self._inflight.first()

    def set_frame_handlers(self, client: FrameHandler | None, broker: FrameHandler | None) -> None:
        self._client_frame = self._on_request if client is None else client
        self._broker_frame = self._responses_frame if broker is None else broker

    def unread(self, frames: list[bytes]) -> None:
        self._splitter.unread(frames)

    def sasl_began(self) -> None:
        self._watchdog.sasl_began()

    def sasl_succeeded(self) -> None:
        self._watchdog.sasl_succeeded()

    read_on = _read_on


def unread_bytes(transport: asyncio.BaseTransport | None) -> int:
    """Bytes the kernel holds unread on the connection's socket (FIONREAD; 0 when unknown)."""
    sock = None if transport is None else transport.get_extra_info("socket")
    fileno = getattr(sock, "fileno", None)
    if fileno is None:
        return 0
    try:
        buf = fcntl.ioctl(fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (OSError, ValueError):  # not a socket, or already closed
        return 0
    return int.from_bytes(buf, sys.byteorder, signed=True)


def _log_closed(ctx: ConnectionContext, reason: str | None, exc: Exception | None, pending: int) -> None:
    where = f"connection {ctx.connection_id} from {ctx.client_address} ({ctx.listener})"
    if reason is not None:
        log.warning("%s closed: %s", where, reason)
    elif exc is not None:
        log.warning("%s lost: %s", where, exc)
    elif pending:
        log.info("%s closed by the client with %d request(s) in flight", where, pending)


def _limit_closer(limit_log: LimitLog, ctx: ConnectionContext, close: Callable[[], None]
                  ) -> Callable[[str, str], None]:
    """A watchdog's limit: counted and logged once per cause, so the close itself is quiet."""
    def expire(cause: str, detail: str) -> None:
        limit_log.hit(cause, f"connection from {ctx.client_address}: {detail}")
        log.debug("connection %d from %s closed: %s: %s", ctx.connection_id, ctx.client_address,
                  cause, detail)
        close()

    return expire


def connection_factory(services: ConnectionServices) -> Callable[[UpstreamTarget], Callable[[], Any]]:
    def for_target(target: UpstreamTarget) -> Callable[[], asyncio.Protocol]:
        limits = services.limits

        def make(real: tuple[str, int] | None) -> asyncio.Protocol:
            return limits.gate(real, lambda: ClientConnection(services, target, real))

        first = services.listener.protocol_factory(make)

        def accepted() -> asyncio.Protocol:
            protocol = first()
            services.opening.add(cast(Opening, protocol))  # until it is a ClientConnection
            return protocol

        return accepted

    return for_target
