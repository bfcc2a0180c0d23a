"""Bounded resources for client connections: the thin asyncio side of `quotas.connection_limits`.

* `AdmissionGate` is a connection's first protocol: it asks the `ConnectionLimiter` (total and
  per-IP connection counts, KIP-612's per-IP `connection_creation_rate`) and hands the transport to
  the `ClientConnection` only if admitted. A connection over a count limit is closed at once; one
  over the creation rate is held, unread, for its throttle time and then closed (Kafka's acceptor
  keeps a throttled socket until its throttle time has passed, then closes it).
* `ConnectionWatchdog` is one timer per connection for the handshake deadlines and the idle
  timeout. The first complete request (ApiVersions included) must come within
  `handshake_timeout_ms` of the connection; a SASL exchange must succeed within
  `handshake_timeout_ms` of its SaslHandshake (re-authentication included). A connection that has
  sent its ApiVersions and nothing since is kept, as Kafka keeps it: librdkafka's coordinator
  connection of a consumer that assigns its partitions is one. The idle timeout is Kafka's
  `connections.max.idle.ms`: nothing read or written for that long, and no request in flight.
* `ClientBuffer` bounds the bytes waiting for one client: the client transport's write-buffer
  high-water mark is `max_buffered_bytes_per_connection`; above it, or when the `BufferBudget`
  (`max_buffered_bytes_total`) pauses this connection as one of the biggest holders, the broker
  side of this connection stops being read until the client has read enough. Bytes are never
  dropped: a frame already read is written whole, so one connection holds at most its limit plus
  one read (or one frame, for responses that are not streamed).
* `LimitLog` counts every hit by cause (`sluice_limit_hits_total{cause}`) and logs the first hit
  of each cause only. Nothing else is affected: each decision is about the offending connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast

from protocol.apis import ApiKey
from proxy.pumps.throttle_timer import CallLater, TimerHandle
from quotas.clock import Clock
from quotas.connection_limits import BufferBudget, ConnectionLimiter, canonical_ip

log = logging.getLogger("sluice.limits")

HANDSHAKE_TIMEOUT = "handshake_timeout"
IDLE_TIMEOUT = "idle_timeout"
MAX_BUFFERED_PER_CONNECTION = "max_buffered_bytes_per_connection"
MAX_BUFFERED_TOTAL = "max_buffered_bytes_total"
MAX_IN_FLIGHT = "max_in_flight_requests_per_connection"

#: Requests of a SASL exchange (Kafka's SaslServerAuthenticator states): they never end a handshake.
SASL_APIS = frozenset({int(ApiKey.SASL_HANDSHAKE), int(ApiKey.SASL_AUTHENTICATE)})
_API_VERSIONS = int(ApiKey.API_VERSIONS)

#: How often the bytes held for clients are re-read while some connection holds any.
REFRESH_INTERVAL_S = 0.1


@dataclass(frozen=True, slots=True)
class LimitSettings:
    """The per-connection limits (`limits:` in the configuration, docs/operating.md: Limits)."""

    handshake_timeout_ms: int = 10_000
    idle_timeout_ms: int = 600_000
    max_buffered_bytes_per_connection: int = 1024 * 1024
    max_in_flight_requests_per_connection: int = 100


class LimitLog:
    """Every limit hit counted by cause; the first of each cause logged (never a payload)."""

    def __init__(self) -> None:
        self.hits: dict[str, int] = {}

    def hit(self, cause: str, detail: str) -> None:
        count = self.hits.get(cause, 0)
        self.hits[cause] = count + 1
        if count == 0:
            log.warning("limit %s hit: %s (logged once; sluice_limit_hits_total{cause=\"%s\"} counts "
                        "every hit)", cause, detail, cause)


class ConnectionLimits:
    """What every connection shares: the limiter, the buffer budget, the settings and the log."""

    def __init__(self, settings: LimitSettings, limiter: ConnectionLimiter, budget: BufferBudget,
                 clock: Clock, call_later: CallLater | None = None) -> None:
        self.settings = settings
        self.limiter = limiter
        self.budget = budget
        self.clock = clock
        self.log = LimitLog()
        self.call_later: CallLater = call_later or _loop_call_later
        self._buffers: dict[int, ClientBuffer] = {}
        self._refresh: TimerHandle | None = None

    def gate(self, real_address: tuple[str, int] | None,
             make: Callable[[], Admitted]) -> AdmissionGate:
        return AdmissionGate(self, real_address, make)

    def release(self, ip: str) -> None:
        self.limiter.release(ip)

    # ---- the buffer budget

    def register(self, buffer: ClientBuffer) -> None:
        self._buffers[buffer.key] = buffer

    def report(self, key: int, held_bytes: int) -> None:
        change = self.budget.update(key, held_bytes)
        if change.pause or change.resume:
            self._apply(change.pause, change.resume)
        if held_bytes and self._refresh is None:
            self._refresh = self.call_later(REFRESH_INTERVAL_S, self._refresh_holders)

    def forget(self, key: int) -> None:
        self._buffers.pop(key, None)
        change = self.budget.remove(key)
        self._apply(change.pause, change.resume)

    def _apply(self, pause: tuple[int, ...], resume: tuple[int, ...]) -> None:
        for key in pause:
            buffer = self._buffers.get(key)
            if buffer is not None:
                self.log.hit(MAX_BUFFERED_TOTAL, f"{self.budget.total_bytes} bytes buffered for clients, "
                                                 f"over {self.budget.max_total_bytes}: pausing the biggest "
                                                 "holders")
                buffer.budget_paused(True)
        for key in resume:
            buffer = self._buffers.get(key)
            if buffer is not None:
                buffer.budget_paused(False)

    def _refresh_holders(self) -> None:
        self._refresh = None
        for key in self.budget.holders():
            buffer = self._buffers.get(key)
            if buffer is not None:
                buffer.measure()
        if self.budget.holders() and self._refresh is None:
            self._refresh = self.call_later(REFRESH_INTERVAL_S, self._refresh_holders)


def _ip_of(peer: tuple[str, int] | None) -> str:
    if not peer:
        return "?"
    try:
        return canonical_ip(str(peer[0]))
    except ValueError:  # not an IP address (a Unix socket, say): counted under its own name
        return str(peer[0])


def _loop_call_later(delay_s: float, callback: Callable[[], None]) -> TimerHandle:
    return asyncio.get_running_loop().call_later(delay_s, callback)


class Admitted(Protocol):
    """What the admission gate hands the transport to (`ClientConnection`, an
    `asyncio.BufferedProtocol` that also takes bytes read before it had the socket)."""

    admitted_ip: str | None

    def connection_made(self, transport: asyncio.BaseTransport) -> None: ...

    def data_received(self, data: bytes) -> None: ...

    def eof_received(self) -> bool | None: ...

    def connection_lost(self, exc: Exception | None) -> None: ...


class AdmissionGate(asyncio.Protocol):
    """A client connection's first protocol: admit it, or refuse it as Kafka would."""

    def __init__(self, limits: ConnectionLimits, real_address: tuple[str, int] | None,
                 make: Callable[[], Admitted]) -> None:
        self._limits = limits
        self._real_address = real_address
        self._make = make
        self._timer: TimerHandle | None = None
        self._connection: Admitted | None = None  # once admitted
        self._transport: asyncio.Transport | None = None
        self._decided = False  # admitted, refused, or lost

    @property
    def pending(self) -> bool:
        """Accepted but not yet admitted (a TLS handshake, or held by a rate): a drain waits."""
        return not self._decided or (self._connection is None and self._transport is not None
                                     and not self._transport.is_closing())

    def abort(self, reason: str) -> None:
        log.debug("connection closed before it was admitted: %s", reason)
        self._decided = True
        if self._transport is not None:
            self._transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tr = cast(asyncio.Transport, transport)
        self._transport = tr
        self._decided = True
        peer = self._real_address or transport.get_extra_info("peername")
        ip = _ip_of(peer)
        limits = self._limits
        admission = limits.limiter.admit(ip)
        if admission.allowed:
            connection = self._make()
            connection.admitted_ip = ip  # released when it closes
            self._connection = connection
            tr.set_protocol(cast(asyncio.BaseProtocol, connection))
            connection.connection_made(tr)
            return
        reason = admission.reason or "limit"
        limiter = limits.limiter
        if admission.throttle_ms > 0:
            quota = admission.quota
            limits.log.hit(reason, f"connections from {ip} over connection_creation_rate {quota:g}/s: held "
                                   f"{admission.throttle_ms} ms, then closed")
            tr.pause_reading()
            self._timer = limits.call_later(admission.throttle_ms / 1000, tr.close)
            return
        limit = limiter.max_connections if reason == "max_connections" else limiter.max_for(ip)
        limits.log.hit(reason, f"connection from {ip} refused: {reason} {limit} reached")
        tr.close()

    # Callbacks reach the gate only if the transport was handed over after they were due (bytes read
    # past a PROXY header are given to the gate): they go to the connection. A held connection is
    # not read; anything that arrives anyway is ignored.

    def data_received(self, data: bytes) -> None:
        if self._connection is not None:
            self._connection.data_received(data)

    def eof_received(self) -> bool:
        return False if self._connection is None else bool(self._connection.eof_received())

    def connection_lost(self, exc: Exception | None) -> None:
        self._decided = True
        self._transport = None
        if self._connection is not None:
            self._connection.connection_lost(exc)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class ConnectionWatchdog:
    """The handshake deadlines and the idle timeout of one connection, on one timer.

    The connection sets `last_active_ms` on every read from and write to its client (an attribute,
    not a call: it is on the path of every frame), calls `request` until `handshake_done`, and
    calls `sasl_began` at each SaslHandshake and `sasl_succeeded` when the broker accepts one."""

    __slots__ = ("_call_later", "_clock", "_deadline_ms", "_expire", "_handle", "_handshake_ms", "_idle_ms",
                 "_in_flight", "_in_sasl", "handshake_done", "last_active_ms")

    def __init__(self, clock: Clock, call_later: CallLater, settings: LimitSettings,
                 in_flight: Callable[[], int], expire: Callable[[str, str], None]) -> None:
        self._clock = clock
        self._call_later = call_later
        self._handshake_ms = settings.handshake_timeout_ms
        self._idle_ms = settings.idle_timeout_ms
        self._in_flight = in_flight
        self._expire = expire
        self._handle: TimerHandle | None = None
        self._deadline_ms = 0
        self._in_sasl = False  # a SaslHandshake was sent and no exchange has succeeded since
        self.handshake_done = False
        self.last_active_ms = 0

    def start(self) -> None:
        now_ms = self._clock.now_ms()
        self.last_active_ms = now_ms
        self._open_handshake(now_ms)

    def request(self, api_key: int) -> None:
        """A complete request arrived. Any ends the handshake but a SASL request, and ApiVersions
        inside a SASL exchange."""
        if api_key in SASL_APIS or (api_key == _API_VERSIONS and self._in_sasl):
            return
        self.handshake_done = True
        self._in_sasl = False

    def sasl_began(self) -> None:
        """A SaslHandshake: the exchange it opens must succeed within the handshake timeout."""
        self._in_sasl = True
        self.cancel()
        self._open_handshake(self._clock.now_ms())

    def sasl_succeeded(self) -> None:
        """The broker accepted the exchange: the handshake is over."""
        self.handshake_done = True
        self._in_sasl = False

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _open_handshake(self, now_ms: int) -> None:
        """A handshake due `handshake_timeout_ms` from now; the timer set for it or the idle timeout."""
        self.handshake_done = False
        self._deadline_ms = now_ms + self._handshake_ms
        self._arm(now_ms, min(self._deadline_ms, self.last_active_ms + self._idle_ms))

    def _arm(self, now_ms: int, at_ms: int) -> None:
        self._handle = self._call_later(max(at_ms - now_ms, 1) / 1000, self._fire)

    def _fire(self) -> None:
        self._handle = None
        now_ms = self._clock.now_ms()
        if not self.handshake_done and now_ms >= self._deadline_ms:
            what = ("no successful SASL exchange within handshake_timeout_ms "
                    f"{self._handshake_ms} of its SaslHandshake" if self._in_sasl else
                    f"no complete request within handshake_timeout_ms {self._handshake_ms}")
            self._expire(HANDSHAKE_TIMEOUT, what)
            return
        idle_until = self.last_active_ms + self._idle_ms
        if now_ms >= idle_until:
            if self._in_flight() == 0:
                self._expire(IDLE_TIMEOUT, f"nothing read or written for idle_timeout_ms {self._idle_ms}")
                return
            idle_until = now_ms + self._idle_ms  # a request is with the broker: not idle
        self._arm(now_ms, idle_until if self.handshake_done else min(idle_until, self._deadline_ms))


class ClientBuffer:
    """The bytes waiting for one client, and whether its broker side may be read."""

    __slots__ = ("_budget_paused", "_client_full", "_limits", "_set_upstream_paused", "_transport",
                 "_upstream_paused", "held_bytes", "key")

    def __init__(self, limits: ConnectionLimits, key: int,
                 set_upstream_paused: Callable[[bool], None]) -> None:
        self._limits = limits
        self.key = key
        self._set_upstream_paused = set_upstream_paused
        self._transport: asyncio.WriteTransport | None = None
        self._client_full = self._budget_paused = self._upstream_paused = False
        self.held_bytes = 0

    def attach(self, transport: asyncio.WriteTransport) -> None:
        self._transport = transport
        high = self._limits.settings.max_buffered_bytes_per_connection
        transport.set_write_buffer_limits(high=high, low=high // 4)
        self._limits.register(self)

    def measure(self) -> None:
        """Re-read what the client transport holds (after a write, or as it drains)."""
        transport = self._transport
        if transport is None:
            return
        held = 0 if transport.is_closing() else transport.get_write_buffer_size()
        if held != self.held_bytes:
            self.held_bytes = held
            self._limits.report(self.key, held)

    def client_full(self, full: bool) -> None:
        """The client transport crossed its high (True) or low (False) water mark."""
        self._client_full = full
        if full:
            high = self._limits.settings.max_buffered_bytes_per_connection
            self._limits.log.hit(MAX_BUFFERED_PER_CONNECTION, "a client reads slower than its broker "
                                 f"answers: its broker side paused at {high} bytes buffered")
        self.measure()
        self._apply()

    def budget_paused(self, paused: bool) -> None:
        self._budget_paused = paused
        self._apply()

    def close(self) -> None:
        self._limits.forget(self.key)
        self._transport = None

    def _apply(self) -> None:
        paused = self._client_full or self._budget_paused
        if paused != self._upstream_paused:
            self._upstream_paused = paused
            self._set_upstream_paused(paused)
