"""How a client connection starts: client TLS, the PROXY protocol header, the principal settings.

Every Sluice listener (the bootstrap listener and one per broker) shares these settings:

* **TLS** (`listen_tls`): the asyncio server terminates TLS 1.2+ with the configured certificate,
  optionally asking for (`requested`) or requiring (`required`) client certificates.
* **PROXY protocol** (`proxy_protocol: v1|v2|any`): a load balancer sends a header with the real
  client address before anything else. `ProxyHeaderReader` is then the connection's first
  protocol: it reads the header (a malformed or missing one closes the connection, with the reason
  logged; so does silence for `header_timeout_s`, `limits.handshake_timeout_ms`), and hands the
  transport to the `ClientConnection`, which gets the real address. With TLS as well, the TLS handshake starts
  after the header, on the bytes that follow it (an `asyncio.sslproto.SSLProtocol` is put between
  the transport and the connection, fed whatever was read past the header).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from asyncio import sslproto
from collections.abc import Callable
from dataclasses import dataclass

from protocol.proxy_protocol import ProxyHeaderError, parse_proxy_header
from proxy.pumps.limits import HANDSHAKE_TIMEOUT

log = logging.getLogger("sluice.listeners")

HEADER_TIMEOUT_S = 10.0
PROXY_VERSIONS = {"off": frozenset(), "v1": frozenset({1}), "v2": frozenset({2}), "any": frozenset({1, 2})}

# (real client address or None) -> the connection's protocol
ConnectionMaker = Callable[[tuple[str, int] | None], asyncio.Protocol]


@dataclass(frozen=True)
class ListenerSettings:
    tls: ssl.SSLContext | None = None
    proxy_versions: frozenset[int] = frozenset()
    header_timeout_s: float = HEADER_TIMEOUT_S
    tls_handshake_timeout_s: float | None = None  # limits.handshake_timeout_ms (None: asyncio's 60 s)
    # a PROXY header not in time: (cause, detail) to count and log once (None: logged each time)
    on_header_timeout: Callable[[str, str], None] | None = None

    @property
    def server_ssl_handshake_timeout(self) -> float | None:
        """The `ssl_handshake_timeout` of `create_server` (given only with its `ssl`)."""
        return self.tls_handshake_timeout_s if self.server_ssl is not None else None

    @property
    def server_ssl(self) -> ssl.SSLContext | None:
        """The `ssl` argument of `create_server`: with the PROXY protocol, TLS starts after the header."""
        return None if self.proxy_versions else self.tls

    def protocol_factory(self, make: ConnectionMaker) -> Callable[[], asyncio.Protocol]:
        if not self.proxy_versions:
            return lambda: make(None)
        return lambda: ProxyHeaderReader(make, self)


class ProxyHeaderReader(asyncio.Protocol):
    """A connection's first protocol on a PROXY-protocol listener."""

    def __init__(self, make: ConnectionMaker, settings: ListenerSettings) -> None:
        self._make = make
        self._settings = settings
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._done = False  # handed over, refused or lost

    @property
    def pending(self) -> bool:
        """Accepted, the header not read yet (a drain waits for the request that follows it)."""
        return not self._done

    def abort(self, reason: str) -> None:
        self._refuse(reason)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's are not subclasses
        self._timer = asyncio.get_running_loop().call_later(self._settings.header_timeout_s, self._timed_out)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        try:
            header = parse_proxy_header(self._buffer, self._settings.proxy_versions)
        except ProxyHeaderError as exc:
            self._refuse(str(exc))
            return
        if header is None:
            return
        self._cancel_timer()
        self._done = True
        transport = self._transport
        assert transport is not None
        rest = bytes(self._buffer[header.consumed:])
        self._buffer = bytearray()
        connection = self._make(header.source)
        if self._settings.tls is None:
            transport.set_protocol(connection)
            connection.connection_made(transport)
            if rest:
                connection.data_received(rest)
        else:
            start_tls(transport, connection, self._settings.tls, rest, self._settings.tls_handshake_timeout_s)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._done = True
        self._cancel_timer()

    def _timed_out(self) -> None:
        self._timer = None
        hook = self._settings.on_header_timeout
        transport = self._transport
        if hook is None or transport is None or transport.is_closing():
            self._refuse("no PROXY protocol header in time")
            return
        peer = transport.get_extra_info("peername")
        hook(HANDSHAKE_TIMEOUT, f"no PROXY protocol header from {_address(peer)} within "
                                f"{self._settings.header_timeout_s * 1000:.0f} ms")
        self._done = True
        transport.close()

    def _refuse(self, reason: str) -> None:
        self._done = True
        self._cancel_timer()
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        peer = transport.get_extra_info("peername")
        log.warning("connection from %s refused: %s", _address(peer), reason)
        transport.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _address(peer: tuple[str, int] | None) -> str:
    return f"{peer[0]}:{peer[1]}" if peer else "?"


def start_tls(transport: asyncio.Transport, app: asyncio.Protocol, context: ssl.SSLContext,
              initial: bytes, handshake_timeout_s: float | None = None) -> None:
    """Server-side TLS on an open transport, starting with bytes already read from it (what
    `loop.start_tls` cannot do). The app protocol's `connection_made` follows the handshake."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    waiter.add_done_callback(lambda f: f.cancelled() or f.exception())  # a failed handshake closes
    tls = sslproto.SSLProtocol(loop, app, context, waiter, server_side=True,
                               ssl_handshake_timeout=handshake_timeout_s)  # type: ignore[arg-type]  # a float works
    transport.set_protocol(tls)
    tls.connection_made(transport)
    view = memoryview(initial)
    while view:
        buf = tls.get_buffer(len(view))
        n = min(len(buf), len(view))
        buf[:n] = view[:n]
        tls.buffer_updated(n)
        view = view[n:]
