"""One client connection and its upstream connection: the two byte pumps.

`ClientConnection` and `UpstreamConnection` are asyncio Protocols (a Protocol-based forwarder moves
about twice the bytes of a streams-based one on this kind of machine). They only move frames:
framing is `protocol.FrameSplitter`, order is `InFlightRequests`, muting is `ChannelMute`, and every
decision about a request or response is the pipeline's. Reading from the client stops while:

- the upstream connection is not up yet;
- the channel is muted for a throttle (KIP-219), until the throttled response has been written
  and the delay has passed; frames already buffered wait too;
- the upstream socket's write buffer is full (back-pressure), or the proxy is draining.

A malformed frame or a broken upstream closes this connection, with the reason logged, and
nothing else.

The connection's principal (`ctx.principal`) is set at the start from its TLS certificate or
address (`proxy.pumps.principals.AuthSettings`) and by `proxy.pumps.principals.SaslInspector`,
which is called for SaslHandshake/SaslAuthenticate only. After a SaslHandshake v0, frames in both
directions are raw SASL tokens until the exchange ends: see "SASL" below.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from protocol.apis import ApiKey, api_name
from protocol.errors import ProtocolError
from protocol.framing import FrameSplitter, size_prefix
from protocol.headers import RequestHeader, read_request_header, read_response_correlation_id
from protocol.produce import read_produce_acks
from protocol.sasl import SASL_API_KEYS
from proxy.flow.inflight import CorrelationMismatch, InFlight, InFlightRequests
from proxy.flow.pipeline import (
    AnswerHere,
    AnswerLater,
    Close,
    ConnectionContext,
    Forward,
    Pipeline,
    StreamTail,
)
from proxy.pumps.listeners import ListenerSettings
from proxy.pumps.muting import ChannelMute
from proxy.pumps.principals import RAW_TOKENS, AuthSettings, SaslInspector
from proxy.pumps.upstreams import BrokerRegistry, UpstreamTarget
from quotas.clock import Clock

log = logging.getLogger("sluice.connection")

_ids = itertools.count(1)

STREAM_MIN_BYTES = 64 * 1024   # smaller responses are simply buffered whole
STREAM_HEAD_BYTES = 32         # header, throttle_time_ms, error_code and session_id of any Fetch


@dataclass
class ConnectionServices:
    """What every connection shares: configuration-derived settings and the shared objects."""

    pipeline: Pipeline
    registry: BrokerRegistry
    clock: Clock
    bootstrap: list[tuple[str, int]]
    upstream_ssl: ssl.SSLContext | None = None
    connect_timeout_s: float = 10.0
    max_frame_bytes: int = 100 * 1024 * 1024
    connections: set[ClientConnection] = field(default_factory=set)
    on_open: Callable[[ClientConnection], None] | None = None
    on_close: Callable[[ClientConnection], None] | None = None
    auth: AuthSettings = field(default_factory=AuthSettings)            # principals (proxy.pumps.principals)
    listener: ListenerSettings = field(default_factory=ListenerSettings)  # TLS, PROXY protocol

    def upstream_addresses(self, target: UpstreamTarget) -> list[tuple[str, int]]:
        if target.node_id is None:
            return list(self.bootstrap)
        address = self.registry.upstream_address(target.node_id)
        return [address] if address is not None else []


class ClientConnection(asyncio.Protocol):
    def __init__(self, services: ConnectionServices, target: UpstreamTarget,
                 real_address: tuple[str, int] | None = None) -> None:
        self._services = services
        self._target = target
        self._clock = services.clock
        self._pipeline = services.pipeline
        self._splitter = FrameSplitter(services.max_frame_bytes)
        self._inflight = InFlightRequests()
        self.mute = ChannelMute()
        self._transport: asyncio.Transport | None = None
        self._upstream: UpstreamConnection | None = None
        self._reading_paused = False
        self._upstream_backpressure = False
        self._throttle_timer: asyncio.TimerHandle | None = None
        self._timer_deadline_ms = 0
        self._draining = False
        self._processing = False
        self._closed = False
        self._close_reason: str | None = None
        self.ctx = ConnectionContext(next(_ids), "?", target.describe(), target.node_id)
        self._real_address = real_address           # the client behind a PROXY-protocol hop
        self._sasl: SaslInspector | None = None
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._stream_tail: StreamTail | None = None  # the end of the response streaming now

    # ------------------------------------------------------------------ client side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
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
        self._update_reading()  # paused until the upstream is connected
        task = asyncio.get_running_loop().create_task(self._connect_upstream())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    def data_received(self, data: bytes) -> None:
        try:
            self._splitter.feed(data)
        except ProtocolError as exc:
            self.close(f"malformed frame from client: {exc}")
            return
        self._process_requests()

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._cancel_timer()
        pending = self._inflight.pending_upstream()
        if self._close_reason is not None:
            log.warning("connection %d from %s (%s) closed: %s", self.ctx.connection_id,
                        self.ctx.client_address, self.ctx.listener, self._close_reason)
        elif exc is not None:
            log.warning("connection %d from %s (%s) lost: %s", self.ctx.connection_id,
                        self.ctx.client_address, self.ctx.listener, exc)
        elif pending:
            log.info("connection %d from %s closed by the client with %d request(s) in flight",
                     self.ctx.connection_id, self.ctx.client_address, pending)
        if self._upstream is not None:
            self._upstream.close()
        self._services.connections.discard(self)
        if self._services.on_close:
            self._services.on_close(self)

    def pause_writing(self) -> None:  # the client reads slower than the broker answers
        if self._upstream is not None:
            self._upstream.pause_reading()

    def resume_writing(self) -> None:
        if self._upstream is not None:
            self._upstream.resume_reading()

    # ------------------------------------------------------------------ lifecycle

    def close(self, reason: str | None = None) -> None:
        if reason is not None and self._close_reason is None:
            self._close_reason = reason
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
        if self._upstream is not None:
            self._upstream.close()

    def begin_drain(self) -> None:
        """Stop reading requests; close once every forwarded request has been answered."""
        self._draining = True
        self._update_reading()
        if len(self._inflight) == 0:
            self.close()

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    async def _connect_upstream(self) -> None:
        loop = asyncio.get_running_loop()
        services = self._services
        addresses = services.upstream_addresses(self._target)
        if not addresses:
            self.close(f"no known address for {self._target.describe()}")
            return
        errors = []
        for host, port in addresses:
            try:
                _, upstream = await asyncio.wait_for(
                    loop.create_connection(lambda: UpstreamConnection(self), host, port,
                                           ssl=services.upstream_ssl,
                                           server_hostname=host if services.upstream_ssl else None),
                    services.connect_timeout_s)
            except (OSError, TimeoutError, ssl.SSLError) as exc:
                errors.append(f"{host}:{port}: {exc or type(exc).__name__}")
                continue
            if self._closed:
                upstream.close()
                return
            self._upstream = upstream
            self._update_reading()
            self._process_requests()
            return
        self.close(f"cannot connect upstream ({self._target.describe()}): {'; '.join(errors)}")

    # ------------------------------------------------------------------ requests

    def _reading_allowed(self) -> bool:
        return (self._upstream is not None and self.mute.reading_allowed and not self._draining
                and not self._upstream_backpressure and not self._closed)

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        allowed = self._reading_allowed()
        if allowed and self._reading_paused:
            transport.resume_reading()
            self._reading_paused = False
        elif not allowed and not self._reading_paused:
            transport.pause_reading()
            self._reading_paused = True

    def _process_requests(self) -> None:
        if self._processing:  # re-entered from a flush inside _on_request: the outer loop goes on
            return
        self._processing = True
        try:
            while self._reading_allowed():
                try:
                    payload = self._splitter.next_frame()
                except ProtocolError as exc:
                    self.close(f"malformed frame from client: {exc}")
                    return
                if payload is None:
                    break
                self._on_request(payload)
        finally:
            self._processing = False
        self._update_reading()

    def _on_request(self, payload: bytes) -> None:
        try:
            header = read_request_header(payload)
        except ProtocolError as exc:
            self.close(f"malformed request header: {exc}")
            return
        now_ms = self._clock.now_ms()
        expects_response = True
        if header.api_key == ApiKey.PRODUCE:
            try:
                expects_response = read_produce_acks(payload, header) != 0
            except ProtocolError as exc:
                log.warning("connection %d: cannot read Produce acks (%s); expecting a response",
                            self.ctx.connection_id, exc)
        entry = InFlight(header.correlation_id, header.api_key, header.api_version, header.client_id,
                         len(payload), now_ms, expects_response=expects_response)
        outcome = self._pipeline.on_request(self.ctx, entry, header, payload)
        if type(outcome) is Forward:
            upstream = self._upstream
            assert upstream is not None
            upstream.write(payload if outcome.payload is None else outcome.payload)
        elif isinstance(outcome, AnswerHere):
            entry.forwarded = False
            entry.response = outcome.response
            entry.response_bytes = len(outcome.response)
            entry.response_received_ms = now_ms
        elif isinstance(outcome, AnswerLater):
            entry.forwarded = False
            self._answer_later(entry, outcome.pending)
        elif isinstance(outcome, Close):
            self.close(outcome.reason)
            return
        if expects_response:
            self._inflight.add(entry)
        if header.api_key in SASL_API_KEYS:  # SaslHandshake, SaslAuthenticate: see "SASL" below
            self._sasl_request(header, payload, entry)
        if outcome.throttle_time_ms > 0:
            self._start_throttle(now_ms, outcome.throttle_time_ms)
            if expects_response:
                entry.mutes_channel = True
            else:
                self.mute.response_sent()  # acks=0: no response will come
        if not expects_response:
            self._pipeline.on_complete(self.ctx, entry, now_ms)
        if entry.response is not None:
            self._flush()

    def _answer_later(self, entry: InFlight, pending: asyncio.Future[bytes]) -> None:
        """A stage answers this request itself once `pending` is done; later requests wait their turn."""
        def done(future: asyncio.Future[bytes]) -> None:
            if self._closed:
                return
            if future.cancelled() or future.exception() is not None:
                self.close(f"Sluice could not answer {api_name(entry.api_key)}: "
                           f"{'cancelled' if future.cancelled() else future.exception()!r}")
                return
            payload = future.result()
            entry.response = payload
            entry.response_bytes = len(payload)
            entry.response_received_ms = self._clock.now_ms()
            self._flush()

        pending.add_done_callback(done)

    # ------------------------------------------------------------------ responses

    def on_upstream_frame(self, payload: bytes) -> None:
        if self._closed:
            return
        try:
            correlation_id = read_response_correlation_id(payload)
            entry = self._inflight.match_upstream(correlation_id)
        except (ProtocolError, CorrelationMismatch) as exc:
            self.close(f"bad response from {self._target.describe()}: {exc}")
            return
        if entry.api_key in SASL_API_KEYS:
            self._sasl_response(entry, payload)
        now_ms = self._clock.now_ms()
        entry.response_received_ms = now_ms
        entry.upstream_response_bytes = len(payload)
        outcome = self._pipeline.on_response(self.ctx, entry, payload)
        entry.response = outcome.payload
        entry.response_bytes = len(outcome.payload)
        if outcome.throttle_time_ms > 0:
            self._start_throttle(now_ms, outcome.throttle_time_ms)
            entry.mutes_channel = True
        self._flush()

    # ------------------------------------------------------------------ streamed responses
    #
    # A large Fetch response goes to the client while it is still arriving (store-and-forward
    # would add the whole receive time to every fetch round trip). The quota decision needs only
    # the size and the first bytes, so it is taken at the start: either the head is patched with
    # the throttle time and the rest streams through, or the client gets the broker-style empty
    # response and the rest of the broker's bytes are dropped. A Fetch v16+ may end with leader
    # endpoints (KIP-951): the outcome's `tail` then holds back only that tag section and sends it
    # rewritten to the same length at the end (`proxy.stages.addresses.StreamedFetchTail`).

    def streamable(self, head: bytes) -> InFlight | None:
        """The in-flight Fetch this response head belongs to, if it can be streamed now."""
        entry = self._inflight.first()
        if (entry is None or self._closed or entry.api_key != ApiKey.FETCH or not entry.forwarded
                or entry.response is not None or entry.whole_response or len(head) < 4
                or int.from_bytes(head[:4], "big", signed=True) != entry.correlation_id):
            return None
        return entry

    def stream_start(self, entry: InFlight, size: int, part: bytes) -> bool:
        """The broker's response starts; returns False if the rest is to be discarded."""
        now_ms = self._clock.now_ms()
        entry.response_received_ms = now_ms
        entry.upstream_response_bytes = size
        head = part[:STREAM_HEAD_BYTES]
        outcome = self._pipeline.on_response(self.ctx, entry, head)
        if outcome.throttle_time_ms > 0:
            self._start_throttle(now_ms, outcome.throttle_time_ms)
            entry.mutes_channel = True
        if outcome.replaced:
            entry.response = outcome.payload
            entry.response_bytes = len(outcome.payload)
            self._flush()
            return False
        entry.response_bytes = size
        transport = self._transport
        self._stream_tail = outcome.tail  # e.g. Fetch v16+: its tag section is held and rewritten
        if self._stream_tail is not None:
            if transport is not None and not transport.is_closing():
                transport.write(size_prefix(size))
            self.stream_chunk(outcome.payload)
            self.stream_chunk(part[len(head):])
        elif transport is not None and not transport.is_closing():
            transport.writelines((size_prefix(size), outcome.payload, part[len(head):]))
        return True

    def stream_chunk(self, chunk: bytes | memoryview) -> None:
        transport = self._transport
        if self._stream_tail is not None:
            ready = self._stream_tail.feed(chunk)
            chunk = chunk if ready == len(chunk) else chunk[:ready]
        if chunk and transport is not None and not transport.is_closing():
            transport.write(chunk)

    def stream_end(self, entry: InFlight) -> None:
        tail, self._stream_tail = self._stream_tail, None
        transport = self._transport
        if tail is not None and transport is not None and not transport.is_closing():
            transport.write(tail.finish())
        entry.streamed = True
        entry.response = b""
        self._flush()

    def _flush(self) -> None:
        transport = self._transport
        if transport is None:
            return
        sent_any = False
        for entry in self._inflight.ready():
            response = entry.response
            assert response is not None
            if not entry.streamed and not transport.is_closing():
                transport.writelines((size_prefix(len(response)), response))
            entry.response = None
            if entry.mutes_channel:
                self.mute.response_sent()
            self._pipeline.on_complete(self.ctx, entry, self._clock.now_ms())
            sent_any = True
        if self._draining and len(self._inflight) == 0:
            self.close()
        elif sent_any:
            self._process_requests()

    def on_upstream_lost(self, exc: Exception | None) -> None:
        if self._closed:
            return
        pending = self._inflight.pending_upstream()
        what = f"upstream {self._target.describe()} closed" + (f": {exc}" if exc else "")
        if pending or exc is not None:
            self.close(f"{what} with {pending} request(s) in flight")
        else:
            self.close()  # an idle upstream went away: the client reconnects
            log.info("connection %d: %s", self.ctx.connection_id, what)

    def on_upstream_backpressure(self, paused: bool) -> None:
        self._upstream_backpressure = paused
        if paused:
            self._update_reading()
        else:
            self._process_requests()

    # ------------------------------------------------------------------ throttling

    def _start_throttle(self, now_ms: int, throttle_time_ms: int) -> None:
        deadline_ms = now_ms + throttle_time_ms
        self.mute.throttle_started(deadline_ms)
        self._update_reading()
        if deadline_ms > self._timer_deadline_ms:
            self._cancel_timer()
            self._schedule_timer(now_ms)

    def _schedule_timer(self, now_ms: int) -> None:
        self._timer_deadline_ms = self.mute.deadline_ms
        delay_s = max(0, self.mute.deadline_ms - now_ms) / 1000.0
        self._throttle_timer = asyncio.get_running_loop().call_later(delay_s, self._on_throttle_timer)

    def _cancel_timer(self) -> None:
        if self._throttle_timer is not None:
            self._throttle_timer.cancel()
            self._throttle_timer = None

    def _on_throttle_timer(self) -> None:
        self._throttle_timer = None
        now_ms = self._clock.now_ms()
        if self.mute.throttle_ended(now_ms):
            self._timer_deadline_ms = 0
            self._process_requests()
        else:  # woke a little early, or the deadline moved
            self._schedule_timer(now_ms)


    # ------------------------------------------------------------------ SASL
    #
    # `proxy.pumps.principals.SaslInspector` follows SaslHandshake/SaslAuthenticate and sets the principal
    # once the broker accepts. After a SaslHandshake v0 the SASL tokens travel raw (a size prefix and the
    # token, no Kafka header) in both directions until the exchange ends. Each client frame must be read the
    # way the broker reads it, so after the v0 handshake and after each raw client token the next client
    # frames are held until the broker has answered, then handed back to the splitter. The frame handlers are
    # swapped by shadowing `_on_request` and `on_upstream_frame` with instance attributes, so that connections
    # that never see raw tokens pay nothing for them.

    def _read_frames_with(self, client: Callable[[bytes], None] | None,
                          upstream: Callable[[bytes], None] | None = None) -> None:
        """Handlers for the next client and broker frames; None: Kafka requests and responses."""
        for name, handler in (("_on_request", client), ("on_upstream_frame", upstream)):
            if handler is None:
                self.__dict__.pop(name, None)
            else:
                self.__dict__[name] = handler

    def _sasl_request(self, header: RequestHeader, payload: bytes, entry: InFlight) -> None:
        if self._sasl is None:
            self._sasl = SaslInspector(self.ctx, self._services.auth)
        self._sasl.on_request(header, payload, entry)
        if header.api_key == ApiKey.SASL_HANDSHAKE and header.api_version == 0:
            self._read_frames_with(self._hold)  # raw tokens may follow: wait for the broker's answer

    def _sasl_response(self, entry: InFlight, payload: bytes) -> None:
        if self._sasl is None:
            return
        said = self._sasl.on_response(entry, payload)
        if entry.api_key != ApiKey.SASL_HANDSHAKE or entry.api_version != 0:
            return
        if said == RAW_TOKENS:
            self._read_frames_with(self._raw_client_token, self._raw_server_token)
        elif said is not None:
            self.close(said)
            return
        else:
            self._read_frames_with(None)
        self._release_held()  # read on after this response has been flushed

    def _hold(self, payload: bytes) -> None:
        self._held.append(payload)
        self._held_bytes += len(payload)
        if self._held_bytes > self._services.max_frame_bytes:
            self.close("client sent more than max_frame_bytes while a SASL answer was awaited")

    def _release_held(self) -> None:
        if self._held:
            self._splitter.unread(self._held)
            self._held = []
            self._held_bytes = 0

    def _raw_client_token(self, payload: bytes) -> None:
        assert self._sasl is not None and self._upstream is not None
        self._sasl.raw_client_token(payload)
        self._upstream.write(payload)
        self._read_frames_with(self._hold, self._raw_server_token)

    def _raw_server_token(self, payload: bytes) -> None:
        assert self._sasl is not None
        if self._closed:
            return
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.writelines((size_prefix(len(payload)), payload))
        if self._sasl.raw_server_token(payload):  # authenticated: Kafka requests from now on
            self._read_frames_with(None, None)
        else:
            self._read_frames_with(self._raw_client_token, self._raw_server_token)
        self._release_held()
        self._process_requests()


class UpstreamConnection(asyncio.Protocol):
    def __init__(self, client: ClientConnection) -> None:
        self._client = client
        self._splitter = FrameSplitter(client._services.max_frame_bytes)
        self._transport: asyncio.Transport | None = None
        self._stream_entry: InFlight | None = None  # the response now being streamed through
        self._stream_left = 0                       # its bytes still to come
        self._stream_forward = True                 # False: the client got a replacement

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def write(self, payload: bytes) -> None:
        assert self._transport is not None
        self._transport.writelines((size_prefix(len(payload)), payload))

    def data_received(self, data: bytes) -> None:
        if self._stream_left:
            n = min(self._stream_left, len(data))
            if self._stream_forward:
                self._client.stream_chunk(data if n == len(data) else memoryview(data)[:n])
            self._stream_left -= n
            if self._stream_left:
                return
            self._end_stream()
            if n == len(data):
                return
            data = data[n:]
        splitter = self._splitter
        client = self._client
        try:
            splitter.feed(data)
            while True:
                pending = splitter.pending_frame(STREAM_HEAD_BYTES)
                if pending is None:
                    return
                size, head = pending
                if size >= STREAM_MIN_BYTES and (entry := client.streamable(head)) is not None:
                    part, left = splitter.take_partial()
                    self._stream_entry = entry
                    self._stream_forward = client.stream_start(entry, size, part)
                    self._stream_left = left
                    if left:
                        return  # the splitter is empty; the rest comes straight off the socket
                    self._end_stream()
                    continue
                payload = splitter.next_frame()
                if payload is None:
                    return
                client.on_upstream_frame(payload)
        except ProtocolError as exc:
            client.close(f"malformed frame from the broker: {exc}")

    def _end_stream(self) -> None:
        entry = self._stream_entry
        self._stream_entry = None
        if entry is not None and self._stream_forward:
            self._client.stream_end(entry)

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
            self._transport.close()


def describe_api(api_key: int, api_version: int) -> str:
    return f"{api_name(api_key)} v{api_version}"


def connection_factory(services: ConnectionServices) -> Callable[[UpstreamTarget], Callable[[], Any]]:
    def for_target(target: UpstreamTarget) -> Callable[[], asyncio.Protocol]:
        return services.listener.protocol_factory(lambda real: ClientConnection(services, target, real))

    return for_target
