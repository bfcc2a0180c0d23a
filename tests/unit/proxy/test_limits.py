"""`proxy.pumps.limits` over fake transports, a fake upstream and fake timers: admission (counts and
KIP-612's creation rate), the handshake deadline, the idle timeout, in-flight requests and buffered
bytes per connection and in total. No socket and no real time."""

from __future__ import annotations

import asyncio
import logging
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.schema.sasl_handshake.v1.response import SaslHandshakeResponse

from protocol.apis import ApiKey
from protocol.encode import encode_response
from proxy.flow.pipeline import Pipeline
from proxy.pumps.connection import ClientConnection, ConnectionServices, connection_factory
from proxy.pumps.limits import (
    HANDSHAKE_TIMEOUT,
    IDLE_TIMEOUT,
    MAX_BUFFERED_PER_CONNECTION,
    MAX_BUFFERED_TOTAL,
    MAX_IN_FLIGHT,
    REFRESH_INTERVAL_S,
    ConnectionLimits,
    LimitSettings,
)
from proxy.pumps.listeners import ListenerSettings
from proxy.pumps.services import Upstream
from proxy.pumps.upstreams import BrokerRegistry, UpstreamTarget
from quotas.clock import FakeClock
from quotas.config import QuotaConfig
from quotas.connection_limits import (
    CONNECTION_CREATION_RATE,
    MAX_CONNECTIONS_PER_IP,
    BufferBudget,
    ConnectionLimiter,
)
from quotas.engine import QuotaEngine
from tests.harness.tls import TestCA
from tests.unit.proxy.test_connection import (
    FakeTimers,
    FakeTransport,
    Scripted,
    metadata_request,
    response,
    run_ready_callbacks,
)
from tests.unit.proxy.test_principals import authenticate as sasl_authenticate
from tests.unit.proxy.test_principals import authenticate_response as sasl_authenticate_response
from tests.unit.proxy.test_principals import request as sasl_request
from tests.unit.proxy.test_principals import server_tls


class PeerTransport(FakeTransport):
    def __init__(self, ip: str = "127.0.0.1") -> None:
        super().__init__()
        self.ip = ip
        self.protocol: object = None

    def get_extra_info(self, name: str) -> object:
        return (self.ip, 5000) if name == "peername" else None

    def set_protocol(self, protocol: object) -> None:
        self.protocol = protocol


class PausableUpstream:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.reading = True
        self.closed = False

    def write(self, payload: bytes) -> None:
        self.written.append(payload)

    def cork(self) -> None: ...

    def uncork(self) -> None: ...

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        self.closed = True


@dataclass
class World:
    clock: FakeClock
    timers: FakeTimers
    limits: ConnectionLimits
    services: ConnectionServices
    upstreams: list[PausableUpstream]

    async def connect(self, ip: str = "127.0.0.1") -> tuple[ClientConnection | None, PeerTransport]:
        """A client connection through the admission gate, as a listener makes it."""
        transport = PeerTransport(ip)
        gate = self.limits.gate(None, lambda: ClientConnection(self.services, UpstreamTarget(1)))
        gate.connection_made(transport)  # type: ignore[arg-type]
        await run_ready_callbacks()  # the fake upstream connects at once, on the loop
        conn = transport.protocol
        return (conn if isinstance(conn, ClientConnection) else None), transport


DEFAULTS = LimitSettings()


def world(settings: LimitSettings = DEFAULTS, *, max_connections: int = 100, per_ip: int = 100,
          rates: dict[str, float] | None = None, total_bytes: int = 1 << 30) -> World:
    clock = FakeClock(1_000)
    timers = FakeTimers(clock)
    engine = QuotaEngine(QuotaConfig(), clock, ip_connection_rates=rates or {})
    limiter = ConnectionLimiter(max_connections, per_ip, engine.new_connection)
    limits = ConnectionLimits(settings, limiter, BufferBudget(total_bytes), clock, timers.call_later)
    upstreams: list[PausableUpstream] = []

    async def connect(client: ClientConnection, target: UpstreamTarget) -> Upstream | str:
        upstreams.append(PausableUpstream())
        return upstreams[-1]

    registry = BrokerRegistry("127.0.0.1", "127.0.0.1", lambda n: 0, lambda s, t: None)
    services = ConnectionServices(pipeline=Pipeline([Scripted()]), registry=registry, clock=clock,
                                  bootstrap=[], connect_upstream=connect, call_later=timers.call_later,
                                  limits=limits)
    return World(clock, timers, limits, services, upstreams)


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def api_versions(correlation_id: int) -> bytes:
    return struct.pack(">hhih", ApiKey.API_VERSIONS, 0, correlation_id, 3) + b"app"


# ---------------------------------------------------------------- admission


async def test_per_ip_count_closes_only_the_offenders_connection(caplog: pytest.LogCaptureFixture) -> None:
    w = world(per_ip=2)
    first, _ = await w.connect("127.0.0.2")
    second, _ = await w.connect("127.0.0.2")
    refused, t3 = await w.connect("127.0.0.2")
    again, t4 = await w.connect("127.0.0.2")
    other, t5 = await w.connect("::ffff:127.0.0.1")  # 127.0.0.1 as a dual-stack socket sees it
    assert first is not None and second is not None and other is not None
    assert refused is None and t3.closed and again is None and t4.closed and not t5.closed
    assert w.limits.log.hits == {MAX_CONNECTIONS_PER_IP: 2}
    assert caplog.text.count("limit max_connections_per_ip hit") == 1  # logged once per cause
    assert w.limits.limiter.count("127.0.0.1") == 1  # counted under its IPv4 spelling
    first.connection_lost(None)  # a slot is free again
    replaced, t6 = await w.connect("127.0.0.2")
    assert replaced is not None and not t6.closed


async def test_creation_rate_holds_the_socket_unread_for_the_throttle_then_closes() -> None:
    # <default> 10/s: 100 connections at once are 10.0/s over the padded 10 s window; the 101st is
    # 10.1/s: throttle (10.1 - 10) / 10 x 10000 ms = 100 ms.
    w = world(max_connections=1000, per_ip=1000, rates={"<default>": 10})
    for _ in range(100):
        conn, _ = await w.connect("127.0.0.2")
        assert conn is not None
    held, transport = await w.connect("127.0.0.2")
    assert held is None and transport.paused and not transport.closed  # held, not read
    w.timers.advance(99)
    assert not transport.closed
    w.timers.advance(1)
    assert transport.closed
    assert w.limits.log.hits == {CONNECTION_CREATION_RATE: 1}
    other, t2 = await w.connect("127.0.0.3")  # another address is not throttled
    assert other is not None and not t2.closed


# ---------------------------------------------------------------- handshake and idle


def closes_after(w: World, transport: PeerTransport, ms: int, cause: str) -> None:
    """The connection is open `ms` - 1 ms from now and closed for `cause` (its first hit) at `ms`."""
    w.timers.advance(ms - 1)
    assert not transport.closed
    w.timers.advance(1)
    assert transport.closed and w.limits.log.hits == {cause: 1}


async def test_no_request_within_the_handshake_deadline_closes() -> None:
    w = world(LimitSettings(handshake_timeout_ms=10_000))
    conn, transport = await w.connect()
    assert conn is not None
    conn.data_received(b"\x00\x00")  # half a size prefix: a slowloris
    closes_after(w, transport, 10_000, HANDSHAKE_TIMEOUT)


async def test_api_versions_ends_the_first_handshake_and_the_idle_timeout_takes_over() -> None:
    # Kafka keeps a connection that has sent ApiVersions and nothing since (librdkafka's
    # coordinator connection of a consumer that assigns its partitions): so does Sluice
    w = world(LimitSettings(handshake_timeout_ms=10_000, idle_timeout_ms=60_000))
    probe, transport = await w.connect()
    assert probe is not None
    probe.data_received(frame(api_versions(1)))
    probe.on_upstream_frame(response(1))         # answered at t=1000: idle from then on
    closes_after(w, transport, 60_000, IDLE_TIMEOUT)  # far past the handshake deadline (t=11 000)


def sasl_handshake(correlation_id: int) -> bytes:
    return sasl_request(SaslHandshakeRequest(mechanism="PLAIN"), correlation_id)


def sasl_handshake_response(correlation_id: int) -> bytes:
    return encode_response(0, correlation_id, SaslHandshakeResponse(error_code=ErrorCode.none,
                                                                    mechanisms=("PLAIN",)))


async def test_a_sasl_exchange_must_succeed_within_the_deadline_of_its_handshake() -> None:
    w = world(LimitSettings(handshake_timeout_ms=10_000, idle_timeout_ms=600_000))
    stalled, t1 = await w.connect()
    assert stalled is not None
    stalled.data_received(frame(api_versions(1)))  # t=1000: the first handshake is over
    stalled.on_upstream_frame(response(1))
    w.timers.advance(5_000)
    stalled.data_received(sasl_handshake(2))        # t=6000: an exchange opens, due by t=16 000
    stalled.on_upstream_frame(sasl_handshake_response(2))
    stalled.data_received(frame(api_versions(3)))  # ApiVersions inside the exchange does not end it
    stalled.on_upstream_frame(response(3))
    closes_after(w, t1, 10_000, HANDSHAKE_TIMEOUT)


async def test_a_successful_sasl_exchange_ends_the_handshake_each_time() -> None:
    w = world(LimitSettings(handshake_timeout_ms=10_000, idle_timeout_ms=600_000))
    conn, transport = await w.connect()
    assert conn is not None
    for round_no in range(2):                      # the second is a re-authentication (KIP-368)
        cid = 10 * round_no
        conn.data_received(sasl_handshake(cid + 1))
        conn.on_upstream_frame(sasl_handshake_response(cid + 1))
        conn.data_received(sasl_authenticate(b"\x00alice\x00pw", cid + 2))
        conn.on_upstream_frame(sasl_authenticate_response(cid + 2)[4:])  # (without its size prefix)
        w.timers.advance(30_000)                   # three deadlines, nothing sent after the success
        assert not transport.closed
    assert w.limits.log.hits == {}


async def test_idle_connection_closes_after_the_idle_timeout_but_not_with_a_request_in_flight() -> None:
    w = world(LimitSettings(handshake_timeout_ms=10_000, idle_timeout_ms=60_000))
    idle, t1 = await w.connect()
    busy, t2 = await w.connect()
    assert idle is not None and busy is not None
    idle.data_received(frame(metadata_request(1)))
    idle.on_upstream_frame(response(1))          # answered at t=1000 (last activity)
    busy.data_received(frame(metadata_request(1)))  # never answered: the broker has it
    w.timers.advance(59_999)
    assert not t1.closed
    w.timers.advance(1)                            # 60 000 ms with nothing read or written
    assert t1.closed and not t2.closed
    assert w.limits.log.hits == {IDLE_TIMEOUT: 1}
    busy.on_upstream_frame(response(1))            # answered at t=61000: idle from then on
    w.timers.advance(59_999)
    assert not t2.closed
    w.timers.advance(60_000)
    assert t2.closed


async def test_activity_pushes_the_idle_deadline() -> None:
    w = world(LimitSettings(idle_timeout_ms=60_000))
    conn, transport = await w.connect()
    assert conn is not None
    conn.data_received(frame(metadata_request(1)))
    conn.on_upstream_frame(response(1))
    w.timers.advance(50_000)
    conn.data_received(b"\x00")  # a byte read at 51 000: idle until 111 000
    w.timers.advance(50_000)
    assert not transport.closed
    w.timers.advance(10_000)
    assert transport.closed


# ---------------------------------------------------------------- in flight


async def test_in_flight_limit_stops_reading_until_a_response_drains() -> None:
    w = world(LimitSettings(max_in_flight_requests_per_connection=2))
    conn, transport = await w.connect()
    assert conn is not None
    conn.data_received(b"".join(frame(metadata_request(i)) for i in (1, 2, 3)))
    upstream = w.upstreams[0]
    assert upstream.written == [metadata_request(1), metadata_request(2)]  # 3 waits in Sluice
    assert transport.paused and conn.in_flight == 2
    conn.on_upstream_frame(response(1))
    assert upstream.written[-1] == metadata_request(3)
    assert w.limits.log.hits == {MAX_IN_FLIGHT: 1}


# ---------------------------------------------------------------- buffered bytes


async def test_a_full_client_buffer_stops_reading_the_broker_until_it_drains() -> None:
    w = world(LimitSettings(max_buffered_bytes_per_connection=64 * 1024))
    conn, transport = await w.connect()
    assert conn is not None
    assert transport.write_limits == (64 * 1024, 16 * 1024)  # the high-water mark is the limit
    upstream = w.upstreams[0]
    conn.pause_writing()          # the transport is over 64 KiB: the client does not read
    assert not upstream.reading
    conn.resume_writing()         # down to 16 KiB
    assert upstream.reading
    assert w.limits.log.hits == {MAX_BUFFERED_PER_CONNECTION: 1}


async def test_total_budget_pauses_the_biggest_holder_and_resumes_as_buffers_drain() -> None:
    w = world(total_bytes=100_000)  # resume at 75 000
    a, ta = await w.connect()
    b, tb = await w.connect()
    assert a is not None and b is not None
    a.data_received(frame(metadata_request(1)))
    b.data_received(frame(metadata_request(1)))
    ta.buffered = 70_000           # a's client reads nothing
    a.on_upstream_frame(response(1))
    tb.buffered = 40_000           # 110 000 > 100 000: a is the biggest, its broker side pauses
    b.on_upstream_frame(response(1))
    ua, ub = w.upstreams
    assert not ua.reading and ub.reading
    assert w.limits.budget.total_bytes == 110_000
    ta.buffered = 10_000           # a's client reads; the refresh timer sees it: 50 000 <= 75 000
    w.timers.advance(round(REFRESH_INTERVAL_S * 1000))
    assert ua.reading and w.limits.budget.total_bytes == 50_000
    assert w.limits.log.hits == {MAX_BUFFERED_TOTAL: 1}
    a.connection_lost(None)        # a closed connection's bytes leave the budget
    assert w.limits.budget.total_bytes == 40_000


async def test_closing_releases_the_admission(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    w = world(max_connections=1)
    conn, _ = await w.connect()
    assert conn is not None and w.limits.limiter.total == 1
    refused, t2 = await w.connect("127.0.0.9")
    assert refused is None and t2.closed
    conn.connection_lost(None)
    assert w.limits.limiter.total == 0
    again, _ = await w.connect("127.0.0.9")
    assert again is not None


# ---------------------------------------------------------------- the TLS handshake


@pytest.mark.parametrize("proxy_header", [b"", b"PROXY TCP4 203.0.113.7 127.0.0.1 4711 9092\r\n"])
async def test_a_tls_handshake_that_never_completes_is_closed(tmp_path: Path, proxy_header: bytes) -> None:
    # handshake_timeout_ms bounds the TLS handshake too (asyncio's own default is 60 s): a client
    # that sends the start of a ClientHello and then nothing is closed. Real sockets; the wait is
    # a deadline, not a sleep.
    listener = ListenerSettings(tls=server_tls(TestCA(tmp_path)), tls_handshake_timeout_s=0.2,
                                proxy_versions=frozenset({1}) if proxy_header else frozenset())
    w = world()
    w.services.listener = listener
    loop = asyncio.get_running_loop()
    server = await loop.create_server(connection_factory(w.services)(UpstreamTarget(None)), "127.0.0.1", 0,
                                      ssl=listener.server_ssl,
                                      ssl_handshake_timeout=listener.server_ssl_handshake_timeout)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        writer.write(proxy_header + b"\x16\x03\x01\x02\x00")  # a TLS record header, then silence
        assert await asyncio.wait_for(reader.read(), 10.0) == b""  # closed by Sluice
        writer.close()
    finally:
        server.close()


# ---------------------------------------------------------------- metrics


async def test_limits_collector_exposes_hits_buffered_bytes_and_limits() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from proxy.ops.metrics import LimitsCollector

    w = world(LimitSettings(handshake_timeout_ms=10_000), per_ip=1)
    conn, transport = await w.connect("127.0.0.2")
    refused, _ = await w.connect("127.0.0.2")
    assert conn is not None and refused is None
    conn.data_received(frame(metadata_request(1)))
    transport.buffered = 1234  # the client has not read this much
    conn.on_upstream_frame(response(1))
    registry = CollectorRegistry()
    registry.register(LimitsCollector(w.limits))
    text = generate_latest(registry).decode()
    assert 'sluice_limit_hits_total{cause="max_connections_per_ip"} 1.0' in text
    assert 'sluice_limit_hits_total{cause="idle_timeout"} 0.0' in text  # every cause, from 0
    assert "sluice_limit_buffered_bytes 1234.0" in text
    assert "sluice_limit_admitted_connections 1.0" in text
    assert 'sluice_limit{limit="max_connections_per_ip"} 1.0' in text


# ---------------------------------------------------------------- reload


def test_sighup_applies_new_ip_rates_and_keeps_what_was_measured(caplog: pytest.LogCaptureFixture) -> None:
    from proxy.config import ProxyConfig, load_config
    from proxy.server import ProxyServer

    def config(rate: int, idle_ms: int = 600_000) -> ProxyConfig:
        entries = [{"ip": "<default>", "connection_creation_rate": rate}]
        return load_config(None, {"upstream": {"bootstrap": "a:1"}, "store": {"type": "memory"},
                                  "limits": {"idle_timeout_ms": idle_ms}, "quotas": {"entries": entries}},
                           environ={})

    caplog.set_level(logging.INFO, "sluice.server")
    server = ProxyServer(config(10), clock=FakeClock(0))
    limiter = server.limits.limiter  # asks the engine's verb
    assert all(limiter.admit("10.0.0.1").allowed for _ in range(100))  # 100 / 10 s = 10/s: allowed
    server._reload_ip_rates(config(5))
    # the 100 already counted stay: 101 / 10 s = 10.1/s against 5/s, (10.1 - 5) / 5 x 10000 ms,
    # capped at one window: 1000 ms
    assert limiter.admit("10.0.0.1").throttle_ms == 1000
    assert server.quotas.new_connection("10.0.0.1").bound == 5
    assert "connection_creation_rate per ip: <default>=5/s" in caplog.text
    server._reload_ip_rates(config(5, idle_ms=1_000))
    assert "limits: changes need a restart" in caplog.text


async def test_a_proxy_header_that_never_comes_counts_as_a_handshake_timeout(caplog: pytest.LogCaptureFixture
                                                                             ) -> None:
    w = world()
    w.services.listener = ListenerSettings(proxy_versions=frozenset({1}), header_timeout_s=0.1,
                                           on_header_timeout=w.limits.log.hit)
    server = await asyncio.get_running_loop().create_server(
        connection_factory(w.services)(UpstreamTarget(None)), "127.0.0.1", 0)
    try:
        for _ in range(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
            writer.write(b"PROXY TCP4 ")  # the start of a header, then silence
            assert await asyncio.wait_for(reader.read(), 10.0) == b""
            writer.close()
    finally:
        server.close()
    assert w.limits.log.hits == {HANDSHAKE_TIMEOUT: 2}
    assert caplog.text.count("no PROXY protocol header") == 1  # logged once, counted twice
