"""What every client connection shares, and how it reaches its broker.

`ConnectionServices` holds the configuration-derived settings and the shared objects (pipeline,
broker registry, clock, timers). `connect_upstream` and `call_later` are the two seams to the event
loop and the network: the defaults use the running loop and TCP (or TLS); unit tests give fakes.
"""

from __future__ import annotations

import asyncio
import ssl
import weakref
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.flow.pipeline import ConnectionContext, Pipeline
from proxy.pumps.limits import ConnectionLimits, LimitSettings
from proxy.pumps.listeners import ListenerSettings
from proxy.pumps.muting import ChannelMuteState
from proxy.pumps.principals import AuthSettings
from proxy.pumps.throttle_timer import TimerHandle
from proxy.pumps.upstream import UpstreamClient, UpstreamConnection
from proxy.pumps.upstreams import BrokerRegistry, UpstreamTarget
from quotas.clock import Clock
from quotas.connection_limits import BufferBudget, ConnectionLimiter


class ServedConnection(UpstreamClient, Protocol):
    """A client connection (`proxy.pumps.connection.ClientConnection`) as the shared services, their
    callbacks and the server see it: this module knows the connection only through this."""

    @property
    def services(self) -> ConnectionServices: ...

    @property
    def ctx(self) -> ConnectionContext: ...

    @property
    def in_flight(self) -> int: ...

    @property
    def mute_state(self) -> ChannelMuteState: ...

    def begin_drain(self) -> None: ...


class Opening(Protocol):
    """A connection's first protocol (`ProxyHeaderReader`, `AdmissionGate`) until it hands over."""

    @property
    def pending(self) -> bool:
        """Accepted and still open, but not yet a served connection."""

    def abort(self, reason: str) -> None: ...


class Upstream(Protocol):
    """The broker side as the client connection drives it (`proxy.pumps.upstream`)."""

    def write(self, payload: bytes) -> None: ...

    def cork(self) -> None:
        """Hold what is written from now until the matching `uncork` (nested)."""

    def uncork(self) -> None:
        """Take out one cork; the last one writes what is held, in order."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None: ...


class UpstreamLink:
    """A client connection's upstream once it is connected. The client buffer may pause its
    reading before it is up: the pause is applied when it comes."""

    __slots__ = ("_paused", "upstream")

    def __init__(self) -> None:
        self.upstream: Upstream | None = None
        self._paused = False

    def connected(self, upstream: Upstream) -> None:
        self.upstream = upstream
        if self._paused:
            upstream.pause_reading()

    def set_paused(self, paused: bool) -> None:
        self._paused = paused
        if self.upstream is not None:
            if paused:
                self.upstream.pause_reading()
            else:
                self.upstream.resume_reading()

    def write(self, payload: bytes) -> None:
        assert self.upstream is not None
        self.upstream.write(payload)

    def close(self) -> None:
        if self.upstream is not None:
            self.upstream.close()


ConnectUpstream = Callable[[ServedConnection, UpstreamTarget], Coroutine[Any, Any, "Upstream | str"]]
"""Connects a client connection's upstream: the upstream, or why it could not be reached."""


def _loop_call_later(delay_s: float, callback: Callable[[], None]) -> TimerHandle:
    return asyncio.get_running_loop().call_later(delay_s, callback)


async def tcp_upstream(client: ServedConnection, target: UpstreamTarget) -> Upstream | str:
    """The default `ConnectUpstream`: each known address of `target` in turn, TLS if configured."""
    services = client.services
    loop = asyncio.get_running_loop()
    addresses = services.upstream_addresses(target)
    if not addresses:
        return f"no known address for {target.describe()}"
    errors = []
    def protocol() -> UpstreamConnection:
        return UpstreamConnection(client, services.max_frame_bytes,
                                  services.limits.settings.max_buffered_bytes_per_connection)

    for host, port in addresses:
        try:
            _, upstream = await asyncio.wait_for(
                loop.create_connection(protocol, host, port,
                                       ssl=services.upstream_ssl,
                                       server_hostname=host if services.upstream_ssl else None),
                services.connect_timeout_s)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            errors.append(f"{host}:{port}: {exc or type(exc).__name__}")
            continue
        return upstream
    return f"cannot connect upstream ({target.describe()}): {'; '.join(errors)}"


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
    connections: set[ServedConnection] = field(default_factory=set)
    # accepted connections that are not yet a ServedConnection (PROXY header or TLS handshake
    # not done, or held by a connection-rate limit): a drain waits for them as well
    opening: weakref.WeakSet[Opening] = field(default_factory=weakref.WeakSet)
    draining: bool = False  # SIGTERM: connections made from now on drain from their start
    on_open: Callable[[ServedConnection], None] | None = None
    on_close: Callable[[ServedConnection], None] | None = None
    auth: AuthSettings = field(default_factory=AuthSettings)            # principals (proxy.pumps.principals)
    listener: ListenerSettings = field(default_factory=ListenerSettings)  # TLS, PROXY protocol
    connect_upstream: ConnectUpstream = tcp_upstream
    call_later: Callable[[float, Callable[[], None]], TimerHandle] = _loop_call_later
    limits: ConnectionLimits = None  # type: ignore[assignment]  # set in __post_init__ when not given

    def __post_init__(self) -> None:
        if self.limits is None:  # Kafka-like defaults (docs/operating.md: Limits)
            self.limits = ConnectionLimits(LimitSettings(), ConnectionLimiter(10_000, 1_000),
                                           BufferBudget(256 * 1024 * 1024), self.clock, self.call_later)

    def upstream_addresses(self, target: UpstreamTarget) -> list[tuple[str, int]]:
        if target.node_id is None:
            return list(self.bootstrap)
        address = self.registry.upstream_address(target.node_id)
        return [address] if address is not None else []
