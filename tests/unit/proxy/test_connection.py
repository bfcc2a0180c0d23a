"""`ClientConnection` over a fake transport, a fake upstream and a fake clock: requests in order,
mute and unmute, Fetch streaming, the raw-SASL mode and drain, with no socket and no real time."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as HandshakeV0
from kio.schema.sasl_handshake.v0.response import SaslHandshakeResponse as HandshakeResponseV0

from protocol.apis import ApiKey
from protocol.encode import encode_request, encode_response
from protocol.headers import RequestHeader
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import (
    AnswerLater,
    ConnectionContext,
    Forward,
    Pipeline,
    RequestOutcome,
    ResponseOutcome,
    StageBase,
)
from proxy.pumps.connection import ClientConnection, ConnectionServices, unread_bytes
from proxy.pumps.fetch_stream import STREAM_MIN_BYTES
from proxy.pumps.peer_watch import PeerWatch
from proxy.pumps.services import Upstream
from proxy.pumps.upstream import UpstreamConnection
from proxy.pumps.upstreams import BrokerRegistry, UpstreamTarget
from quotas.clock import FakeClock
from tests.harness.wait import eventually, poll_async


class FakeTransport:
    def __init__(self) -> None:
        self.data = bytearray()
        self.paused = False
        self.closed = False
        self.buffered = 0  # what get_write_buffer_size says: bytes the client has not read yet
        self.tcp_state = 1  # the socket's tcpi_state: 1 ESTABLISHED, 8 CLOSE_WAIT (the client closed)
        self.write_limits: tuple[int | None, int | None] = (None, None)
        self.writes = 0  # write and writelines calls: each a send on a real socket
        self.parts: list[bytes | bytearray | memoryview] = []  # what was written, as a transport holds it

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.write_limits = (high, low)

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def write(self, data: bytes | memoryview) -> None:
        self.data += data
        self.parts.append(data)
        self.writes += 1

    def writelines(self, parts: tuple[bytes | memoryview, ...]) -> None:
        for part in parts:
            self.data += part
            self.parts.append(part)
        self.writes += 1

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> object:
        if name == "socket":
            return self
        return ("127.0.0.1", 5000) if name == "peername" else None

    def getsockopt(self, level: int, option: int, size: int) -> bytes:
        assert (level, option, size) == (socket.IPPROTO_TCP, socket.TCP_INFO, 1)
        return bytes([self.tcp_state])

    def frames(self) -> list[bytes]:
        """The size-prefixed frames written so far (raises if one is incomplete)."""
        out, pos = [], 0
        while pos < len(self.data):
            (size,) = struct.unpack_from(">i", self.data, pos)
            assert pos + 4 + size <= len(self.data), "incomplete frame"
            out.append(bytes(self.data[pos + 4:pos + 4 + size]))
            pos += 4 + size
        return out


class FakeUpstream:
    """The broker side: records what the client connection forwards (held while corked, as
    `UpstreamConnection` holds it) and each batch it would write."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.batches: list[list[bytes]] = []  # one per transport write: the payloads in it
        self.closed = False
        self._corked = 0
        self._held: list[bytes] = []

    def write(self, payload: bytes) -> None:
        if self._corked:
            self._held.append(payload)
        else:
            self.written.append(payload)
            self.batches.append([payload])

    def cork(self) -> None:
        self._corked += 1

    def uncork(self) -> None:
        self._corked -= 1
        if not self._corked and self._held:
            self.written += self._held
            self.batches.append(self._held)
            self._held = []

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeTimers:
    clock: FakeClock
    pending: list[tuple[int, Callable[[], None]]] = field(default_factory=list)

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> FakeTimers.Handle:
        item = (self.clock.now_ms() + round(delay_s * 1000), callback)
        self.pending.append(item)
        return FakeTimers.Handle(self, item)

    def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        due = [t for t in self.pending if t[0] <= self.clock.now_ms()]
        self.pending = [t for t in self.pending if t[0] > self.clock.now_ms()]
        for _, callback in due:
            callback()

    @dataclass
    class Handle:
        timers: FakeTimers
        item: tuple[int, Callable[[], None]]

        def cancel(self) -> None:
            if self.item in self.timers.pending:
                self.timers.pending.remove(self.item)


class Scripted(StageBase):
    """Throttles requests whose client id says so, answers others itself later, counts completions."""

    def __init__(self) -> None:
        self.completed: list[int] = []
        self.later: dict[int, asyncio.Future[bytes]] = {}
        self.response_throttle_ms = 0

    def on_request(self, ctx: ConnectionContext, entry: InFlight, header: RequestHeader,
                   payload: bytes) -> RequestOutcome | None:
        if header.client_id and header.client_id.startswith("throttle-"):
            return Forward(None, int(header.client_id.split("-")[1]))
        if header.client_id and header.client_id.startswith("from-response-"):  # as QuotaStage for Produce
            entry.delay_from_response_ms = int(header.client_id.split("-")[2])
            return Forward(None, entry.delay_from_response_ms)
        if header.client_id == "later":
            future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
            self.later[header.correlation_id] = future
            return AnswerLater(future)
        return None

    def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome | None:
        if self.response_throttle_ms:
            return ResponseOutcome(payload, self.response_throttle_ms)
        return None

    def on_complete(self, ctx: ConnectionContext, entry: InFlight, sent_ms: int) -> None:
        self.completed.append(entry.correlation_id)


@dataclass
class Rig:
    conn: ClientConnection
    transport: FakeTransport
    upstream: FakeUpstream
    timers: FakeTimers
    stage: Scripted

    def send(self, *frames: bytes) -> None:
        """The client's frames in one read, as the event loop reads a socket."""
        read_into(self.conn, b"".join(struct.pack(">i", len(f)) + f for f in frames))


    def broker(self, *payloads: bytes) -> None:
        for payload in payloads:
            self.conn.on_upstream_frame(payload)


def read_into(conn: Any, data: bytes) -> None:
    """What the event loop does with a read of `data` (uvloop's order): the connection's room, the
    bytes written into it, `buffer_updated` while the room is still held, then the room released.
    Data longer than the room takes as many reads as it needs."""
    view = memoryview(data)
    while view:
        room = memoryview(conn.get_buffer(65536))
        assert room.nbytes > 0 and not room.readonly
        n = min(room.nbytes, len(view))
        room[:n] = view[:n]
        conn.buffer_updated(n)
        room.release()
        view = view[n:]


async def rig() -> Rig:
    clock = FakeClock(1_000)
    timers = FakeTimers(clock)
    stage = Scripted()
    upstream = FakeUpstream()

    async def connect(client: ClientConnection, target: UpstreamTarget) -> Upstream | str:
        return upstream

    registry = BrokerRegistry("127.0.0.1", "127.0.0.1", lambda n: 0, lambda s, t: None)
    services = ConnectionServices(pipeline=Pipeline([stage]), registry=registry,
                                  clock=clock, bootstrap=[], connect_upstream=connect,
                                  call_later=timers.call_later)
    conn = ClientConnection(services, UpstreamTarget(1))
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    assert transport.paused  # until the upstream is connected
    await run_ready_callbacks()           # the fake upstream connects at once, on the loop
    assert not transport.paused
    return Rig(conn, transport, upstream, timers, stage)


def metadata_request(correlation_id: int, client_id: str = "app") -> bytes:
    cid = client_id.encode()
    return struct.pack(">hhih", ApiKey.METADATA, 1, correlation_id, len(cid)) + cid + struct.pack(">i", -1)


def response(correlation_id: int, body: bytes = b"\x00\x00") -> bytes:
    return struct.pack(">i", correlation_id) + body


async def run_ready_callbacks() -> None:
    """Let the event loop run what is already scheduled (no time passes: a fake clock drives time)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.call_soon(done.set_result, None)   # queued after every callback scheduled so far
    await done


async def test_requests_are_forwarded_and_answered_in_order() -> None:
    r = await rig()
    r.send(metadata_request(1), metadata_request(2), metadata_request(3, "later"), metadata_request(4))
    assert r.upstream.written == [metadata_request(1), metadata_request(2), metadata_request(4)]
    r.broker(response(1), response(2), response(4))
    assert [f[:4] for f in r.transport.frames()] == [response(1)[:4], response(2)[:4]]  # 4 waits for 3
    r.stage.later[3].set_result(response(3, b"local"))
    await run_ready_callbacks()  # the future's done-callbacks run on the loop
    assert r.transport.frames() == [response(1), response(2), response(3, b"local"), response(4)]
    assert r.stage.completed == [1, 2, 3, 4]


async def test_a_response_out_of_order_closes_the_connection() -> None:
    r = await rig()
    r.send(metadata_request(1), metadata_request(2))
    r.broker(response(2))
    assert r.transport.closed and r.upstream.closed


async def test_throttle_mutes_until_the_response_is_sent_and_the_delay_has_passed() -> None:
    r = await rig()
    r.send(metadata_request(1, "throttle-100"), metadata_request(2))
    assert r.upstream.written == [metadata_request(1, "throttle-100")]  # muted at once: 2 waits
    assert r.transport.paused
    r.timers.advance(100)  # the delay is over, but the throttled response has not been sent
    assert r.transport.paused and len(r.upstream.written) == 1
    r.broker(response(1))
    assert not r.transport.paused
    assert r.upstream.written[-1] == metadata_request(2)  # the buffered request went on


async def test_a_delay_from_the_response_mutes_at_once_and_ends_that_long_after_the_response() -> None:
    """KIP-219 for Produce: a slow response (latency 300 ms) and a 100 ms delay keep the channel
    muted 300 + 100 ms, not max(300, 100) as a delay counted from the request would."""
    r = await rig()
    r.send(metadata_request(1, "from-response-100"), metadata_request(2))
    assert r.transport.paused and len(r.upstream.written) == 1  # muted at once: 2 waits
    r.timers.advance(300)  # the broker is slow: the delay has not started yet
    r.broker(response(1))
    assert r.transport.paused and len(r.upstream.written) == 1
    r.timers.advance(99)
    assert r.transport.paused
    r.timers.advance(1)  # 100 ms after the response went out
    assert not r.transport.paused and r.upstream.written[-1] == metadata_request(2)


async def test_a_muted_channel_reads_until_the_client_sends_so_a_close_is_noticed_at_once() -> None:
    r = await rig()
    r.send(metadata_request(1, "throttle-30000"))
    r.broker(response(1))  # the throttled response went out; the 30 s delay goes on
    assert r.conn.mute_state.name != "NOT_MUTED"
    # nothing buffered: the socket stays readable, so the client's FIN is seen now, not in 30 s
    assert not r.transport.paused
    assert r.conn.eof_received() is False  # asyncio then closes the transport: connection_lost
    r.conn.connection_lost(None)
    assert r.upstream.closed and r.timers.pending == []  # upstream freed, the mute timer cancelled


async def test_what_a_muted_client_sends_waits_and_stops_reading() -> None:
    r = await rig()
    r.send(metadata_request(1, "throttle-100"))
    r.broker(response(1))
    assert not r.transport.paused
    r.send(metadata_request(2))  # a client that does not wait out throttle_time_ms
    assert r.transport.paused and r.upstream.written == [metadata_request(1, "throttle-100")]
    r.timers.advance(100)
    assert not r.transport.paused and r.upstream.written[-1] == metadata_request(2)


async def test_a_client_that_pipelined_and_closed_while_muted_is_noticed_by_its_tcp_state() -> None:
    r = await rig()
    r.send(metadata_request(1, "throttle-30000"))
    r.broker(response(1))
    r.send(metadata_request(2))  # librdkafka pipelines while muted: buffered, reading stops
    assert r.transport.paused and not r.transport.closed
    r.timers.advance(1000)  # the watch looks once a second: still ESTABLISHED
    assert not r.transport.closed
    r.transport.tcp_state = 8  # the client's FIN arrived behind the unread request (CLOSE_WAIT)
    r.timers.advance(1000)
    assert r.transport.closed and r.upstream.written == [metadata_request(1, "throttle-30000")]


async def test_the_peer_watch_stops_when_the_mute_ends() -> None:
    r = await rig()
    r.send(metadata_request(1, "throttle-100"))
    r.broker(response(1))
    r.send(metadata_request(2))
    r.timers.advance(100)  # the mute ends: reading resumes, the buffered request goes on
    assert not r.transport.paused and r.upstream.written[-1] == metadata_request(2)
    r.transport.tcp_state = 8  # a half-close now is for the connection's normal path, not the watch
    r.timers.advance(5000)
    assert not r.transport.closed
    assert not any(isinstance(getattr(cb, "__self__", None), PeerWatch) for _, cb in r.timers.pending)


async def test_response_sent_before_the_delay_keeps_the_channel_muted_until_it_ends() -> None:
    r = await rig()
    r.stage.response_throttle_ms = 250
    r.send(metadata_request(1))
    r.broker(response(1))
    r.stage.response_throttle_ms = 0
    r.send(metadata_request(2))
    assert r.transport.paused and r.upstream.written == [metadata_request(1)]
    r.timers.advance(249)
    assert r.transport.paused
    r.timers.advance(1)
    assert not r.transport.paused and r.upstream.written[-1] == metadata_request(2)


def fetch_request(correlation_id: int) -> bytes:
    return struct.pack(">hhih", ApiKey.FETCH, 12, correlation_id, 3) + b"app" + b"\x00" * 20


async def test_a_large_fetch_response_streams_before_it_has_all_arrived() -> None:
    r = await rig()
    upstream = UpstreamConnection(r.conn, 100 * 1024 * 1024)
    r.send(fetch_request(5), metadata_request(6))
    body = bytes(range(256)) * ((STREAM_MIN_BYTES * 2) // 256)
    payload = response(5, body)
    wire = struct.pack(">i", len(payload)) + payload
    upstream.data_received(wire[:1000])
    assert r.transport.data == wire[:1000]  # went to the client at once, not buffered
    upstream.data_received(wire[1000:-10])
    assert r.stage.completed == []
    # the response ends and the next one follows in the same segment
    upstream.data_received(wire[-10:] + struct.pack(">i", 6) + response(6))
    assert r.transport.frames() == [payload, response(6)]
    assert r.stage.completed == [5, 6]


async def test_a_streamed_response_is_read_into_a_new_buffer_each_time_and_never_past_its_end() -> None:
    """The broker's socket read as the event loop reads it: into the splitter's room until a large
    Fetch response starts streaming, then each read into a buffer of its own, no longer than what
    is left of the response, which goes to the client as it is; the next response is read into the
    splitter again."""
    r = await rig()
    upstream = UpstreamConnection(r.conn, 100 * 1024 * 1024)
    upstream.connection_made(FakeTransport())  # type: ignore[arg-type]
    r.send(fetch_request(5), metadata_request(6))
    payload = response(5, bytes(range(256)) * ((STREAM_MIN_BYTES * 2) // 256))
    wire = struct.pack(">i", len(payload)) + payload + struct.pack(">i", len(response(6))) + response(6)
    rooms: list[int] = []
    at = 0
    for want in (16_384, 10_000, None, None):  # how much each read brings (None: all the room takes)
        room = memoryview(upstream.get_buffer(65536))
        rooms.append(room.nbytes)
        n = min(room.nbytes, len(wire) - at) if want is None else want
        room[:n] = wire[at : at + n]
        upstream.buffer_updated(n)
        room.release()
        at += n
    left = 4 + len(payload) - 16_384  # the response's bytes after the first read
    assert rooms == [16_384, left, left - 10_000, 16_384]
    assert at == len(wire)
    assert r.transport.frames() == [payload, response(6)]
    assert r.stage.completed == [5, 6]
    # every chunk the client's transport was given still holds what it held when it was written
    assert b"".join(bytes(part) for part in r.transport.parts) == r.transport.data


async def test_sasl_v0_handshake_switches_to_raw_tokens_and_back() -> None:
    r = await rig()
    header = RequestHeader(ApiKey.SASL_HANDSHAKE, 0, 1, "app", 1, 0)
    handshake = encode_request(header, HandshakeV0(mechanism="PLAIN"))
    token = b"\x00alice\x00pw"
    r.send(handshake, token)  # the token must wait: it may be raw or a Kafka request
    assert r.upstream.written == [handshake]
    r.broker(encode_response(0, 1, HandshakeResponseV0(error_code=ErrorCode.none, mechanisms=("PLAIN",))))
    assert r.upstream.written == [handshake, token]  # forwarded raw, after the answer
    r.broker(b"")  # the broker's raw answer: an empty token, PLAIN succeeded
    assert r.transport.frames()[-1] == b""
    assert r.conn.ctx.principal == "alice"
    r.send(metadata_request(2))  # Kafka requests again
    assert r.upstream.written[-1] == metadata_request(2)


def api_versions_request(correlation_id: int) -> bytes:
    return struct.pack(">hhih", ApiKey.API_VERSIONS, 0, correlation_id, 3) + b"app"


def own_metadata_request(correlation_id: int) -> bytes:
    return struct.pack(">hhih", ApiKey.METADATA, 12, correlation_id, 6) + b"sluice" + b"\x00"


async def test_sluices_own_request_takes_its_turn_and_its_answer_never_reaches_the_client() -> None:
    """`send_own` (topic ids named on the client's own authenticated connection): Sluice's request
    goes upstream between the client's, the broker's answers are matched in order, Sluice's goes to
    its future and the client gets exactly its own responses, in order, each completed once."""
    r = await rig()
    r.send(metadata_request(1))
    own = r.conn.send_own(own_metadata_request(-7))
    assert own is not None
    r.send(metadata_request(2))
    assert r.upstream.written == [metadata_request(1), own_metadata_request(-7), metadata_request(2)]
    r.broker(response(1))
    assert r.transport.frames() == [response(1)] and not own.done()
    r.broker(response(-7, b"names"), response(2))
    assert own.result() == response(-7, b"names")
    assert r.transport.frames() == [response(1), response(2)]   # nothing of Sluice's
    assert r.stage.completed == [1, 2]                            # no stage saw Sluice's request
    assert r.conn.in_flight == 0


async def test_sluices_own_request_waits_for_an_authenticated_connection() -> None:
    """Nothing is sent before the client's first request past authentication, nor after a SASL
    request until the next such request: a Metadata inside a SASL exchange (or before it, on a SASL
    listener) would make the broker close the client's connection."""
    r = await rig()
    assert r.conn.send_own(own_metadata_request(-1)) is None        # nothing forwarded yet
    r.send(api_versions_request(1))
    assert r.conn.send_own(own_metadata_request(-1)) is None        # ApiVersions precedes SASL
    handshake = encode_request(RequestHeader(ApiKey.SASL_HANDSHAKE, 0, 2, "app", 1, 0),
                               HandshakeV0(mechanism="PLAIN"))
    r.send(handshake)
    assert r.conn.send_own(own_metadata_request(-1)) is None        # an exchange under way
    r.broker(response(1))
    r.broker(encode_response(0, 2, HandshakeResponseV0(error_code=ErrorCode.none, mechanisms=("PLAIN",))))
    r.send(b"\x00alice\x00pw")
    r.broker(b"")                                                   # PLAIN succeeded
    assert r.conn.send_own(own_metadata_request(-1)) is None        # the client has not gone on yet
    r.send(metadata_request(3))
    assert r.conn.send_own(own_metadata_request(-1)) is not None
    assert r.upstream.written[-2:] == [metadata_request(3), own_metadata_request(-1)]


async def test_sluices_own_request_fails_when_the_connection_closes() -> None:
    r = await rig()
    r.send(metadata_request(1))
    own = r.conn.send_own(own_metadata_request(-1))
    assert own is not None
    r.conn.close("test")
    r.conn.connection_lost(None)
    assert isinstance(own.exception(), ConnectionError)
    assert r.conn.send_own(own_metadata_request(-2)) is None


async def test_a_drain_waits_for_sluices_own_request_then_closes() -> None:
    r = await rig()
    r.send(metadata_request(1))
    r.broker(response(1))
    own = r.conn.send_own(own_metadata_request(-1))
    assert own is not None
    r.conn.begin_drain()
    assert not r.transport.closed
    assert r.conn.send_own(own_metadata_request(-2)) is None        # none started while draining
    r.broker(response(-1))
    assert own.done() and r.transport.closed
    assert r.transport.frames() == [response(1)]


async def test_drain_closes_once_the_last_response_has_gone() -> None:
    r = await rig()
    r.send(metadata_request(1))
    r.conn.begin_drain()
    assert not r.transport.closed
    r.broker(response(1))
    assert r.transport.frames() == [response(1)] and r.transport.closed


async def test_an_idle_connection_closes_at_once_when_the_drain_begins() -> None:
    r = await rig()
    r.send(metadata_request(1))
    r.broker(response(1))
    r.conn.begin_drain()
    assert r.transport.closed


async def test_a_request_that_arrives_while_draining_is_answered_then_the_connection_closes() -> None:
    r = await rig()
    r.send(metadata_request(1))
    r.conn.begin_drain()
    r.send(metadata_request(2))                # sent before the client learnt of the drain
    assert r.upstream.written == [metadata_request(1), metadata_request(2)]
    r.broker(response(1))
    assert not r.transport.closed              # request 2 is still in flight: not between requests
    r.broker(response(2))
    assert r.transport.frames() == [response(1), response(2)] and r.transport.closed


async def test_a_request_read_before_the_upstream_is_up_is_answered_when_the_drain_begins() -> None:
    """The cause of the load-balanced drain's lost long poll: SIGTERM came after the client's Fetch
    had been read but before the connection's upstream was up, so nothing was in flight yet and the
    drain closed the connection with the Fetch unanswered."""
    clock = FakeClock(1_000)
    timers = FakeTimers(clock)
    upstream = FakeUpstream()
    connected: asyncio.Future[Upstream | str] = asyncio.get_running_loop().create_future()

    async def connect(client: ClientConnection, target: UpstreamTarget) -> Upstream | str:
        return await connected

    registry = BrokerRegistry("127.0.0.1", "127.0.0.1", lambda n: 0, lambda s, t: None)
    services = ConnectionServices(pipeline=Pipeline([Scripted()]), registry=registry, clock=clock,
                                  bootstrap=[], connect_upstream=connect, call_later=timers.call_later)
    conn = ClientConnection(services, UpstreamTarget(1))
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.data_received(struct.pack(">i", len(metadata_request(1))) + metadata_request(1))
    conn.begin_drain()                         # SIGTERM: the upstream is still connecting
    assert not transport.closed
    connected.set_result(upstream)
    await run_ready_callbacks()
    await run_ready_callbacks()
    assert upstream.written == [metadata_request(1)]
    conn.on_upstream_frame(response(1))
    assert transport.frames() == [response(1)] and transport.closed


async def test_a_connection_made_while_draining_answers_what_came_with_it() -> None:
    """A connection accepted as the drain began (from the accept queue, or its PROXY header read
    late): the bytes that came with it are handed over after connection_made, and answered."""
    r = await rig()
    services = r.conn.services
    services.draining = True
    conn = ClientConnection(services, UpstreamTarget(1))
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.data_received(struct.pack(">i", len(metadata_request(7))) + metadata_request(7))
    await run_ready_callbacks()
    await run_ready_callbacks()
    assert not transport.closed and r.upstream.written[-1] == metadata_request(7)
    conn.on_upstream_frame(response(7))
    assert transport.frames() == [response(7)] and transport.closed


async def test_a_connection_made_while_draining_with_nothing_sent_closes() -> None:
    r = await rig()
    services = r.conn.services
    services.draining = True
    conn = ClientConnection(services, UpstreamTarget(1))
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    await run_ready_callbacks()
    assert transport.closed


def test_unread_bytes_are_what_the_kernel_holds_for_the_socket() -> None:
    a, b = socket.socketpair()
    with a, b:
        class Transport:
            def get_extra_info(self, name: str) -> object:
                return a if name == "socket" else None

        assert unread_bytes(Transport()) == 0  # type: ignore[arg-type]
        b.sendall(b"12345")
        assert eventually(lambda: unread_bytes(Transport()), lambda n: n == 5) == 5  # type: ignore[arg-type]
        assert unread_bytes(None) == 0 and unread_bytes(FakeTransport()) == 0  # type: ignore[arg-type]


async def test_bytes_handed_over_with_the_socket_are_handled_before_what_is_read() -> None:
    r = await rig()
    stream = b"".join(struct.pack(">i", len(f)) + f for f in (metadata_request(1), metadata_request(2),
                                                               metadata_request(3)))
    cut = 4 + len(metadata_request(1)) + 7  # the second request's prefix and first 3 bytes
    r.conn.data_received(stream[:cut])
    assert r.upstream.written == [metadata_request(1)]
    read_into(r.conn, stream[cut:])
    assert r.upstream.written == [metadata_request(1), metadata_request(2), metadata_request(3)]


async def test_a_large_request_is_read_into_one_kept_buffer() -> None:
    """A 200 KB request: its first read shows the size, the next one takes all the rest (the room
    grew to the frame); the next request of that size is read into the same buffer, in one read."""
    r = await rig()
    big = metadata_request(1) + bytes(200_000)
    frame = struct.pack(">i", len(big)) + big
    reads = []
    for _ in range(2):
        view = memoryview(frame)
        while view:
            room = memoryview(r.conn.get_buffer(65536))
            n = min(room.nbytes, len(view))
            room[:n] = view[:n]
            r.conn.buffer_updated(n)
            room.release()
            view = view[n:]
            reads.append(n)
    assert r.upstream.written == [big, big]
    assert reads == [16 * 1024, len(frame) - 16 * 1024, len(frame)]


def test_the_event_loops_read_the_socket_into_the_connections_room() -> None:
    """Over a real socket, on asyncio's loop and on uvloop: the loop reads into the connection's
    room (`data_received`, the copying path, is never called)."""
    import uvloop

    async def scenario() -> None:
        r = await rig()
        conn = r.conn
        vars(conn)["data_received"] = _never  # the loop must not take the copying path
        a, b = socket.socketpair()
        loop = asyncio.get_running_loop()
        with a, b:
            transport, _ = await loop.connect_accepted_socket(lambda: conn, a)
            big = metadata_request(2) + bytes(100_000)
            b.sendall(b"".join(struct.pack(">i", len(f)) + f for f in (metadata_request(1), big)))
            await poll_async(lambda: len(r.upstream.written) >= 2, timeout_s=15)
            transport.close()
            await run_ready_callbacks()  # the transport's close of its socket runs on the loop
        assert r.upstream.written == [metadata_request(1), big]

    for new_loop in (asyncio.new_event_loop, uvloop.new_event_loop):
        loop = new_loop()
        try:
            loop.run_until_complete(scenario())
        finally:
            loop.close()


def _never(data: bytes) -> None:
    raise AssertionError("data_received was called: the socket was not read into the connection's room")
