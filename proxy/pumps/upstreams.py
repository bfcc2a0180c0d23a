"""Which brokers exist behind Sluice, and the Sluice listener that stands for each.

Clients must never learn a broker's real address: every broker address in Metadata,
FindCoordinator and DescribeCluster responses is replaced by Sluice's advertised host and the port
of a per-broker listener. That port is deterministic (`broker_port_base + node_id`) so that clients
that cached it find it again after a Sluice restart.

A listener is created the first time a broker appears. Its socket is bound and listening before
the rewritten response leaves Sluice, so a client that connects at once lands in the kernel's
accept queue even while the asyncio server is still being set up.

A per-broker port that cannot be bound (in use by another process) must not break Metadata: the
listener falls back to a port the kernel picks (clients still reach the broker through Sluice,
only the port is not the deterministic one), the failure is logged once per broker and kept in
`bind_failures` for /metrics (`proxy.ops.broker_listeners`). If even that fails, the wanted port
is advertised and the listener is tried again at the next Metadata, without logging again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from protocol.rewrite import BrokerAddress
from proxy.pumps.accepting import Listener

log = logging.getLogger("sluice.brokers")


@dataclass(frozen=True, slots=True)
class BindFailure:
    """The deterministic port of a broker could not be bound; `port_in_use` serves it instead (0: none)."""

    node_id: int
    wanted_port: int
    error: str
    port_in_use: int = 0


@dataclass(frozen=True, slots=True)
class UpstreamTarget:
    """Where a client connection's upstream goes: the bootstrap brokers, or one broker by id."""

    node_id: int | None  # None = bootstrap

    def describe(self) -> str:
        return "bootstrap" if self.node_id is None else f"broker {self.node_id}"


class BrokerRegistry:
    def __init__(self, bind_host: str, advertised_host: str, port_for_node: Callable[[int], int],
                 start_listener: Callable[[socket.socket, UpstreamTarget], None], *,
                 reuse_port: bool = False) -> None:
        self._bind_host = bind_host
        self._reuse_port = reuse_port  # `--workers N`: every worker listens on the same per-broker port
        self._advertised_host = advertised_host
        self._port_for_node = port_for_node
        self._start_listener = start_listener
        self.upstream: dict[int, tuple[str, int]] = {}
        self.listen_ports: dict[int, int] = {}
        self.bind_failures: dict[int, BindFailure] = {}
        self.listening = True  # False once the process drains: no new listener is opened

    def stop_listening(self) -> None:
        """A draining process opens no listener: a broker first seen now is advertised at its
        deterministic port, where another instance behind the same load balancer serves it."""
        self.listening = False

    def learn(self, original: BrokerAddress) -> None:
        known = self.upstream.get(original.node_id)
        address = (original.host, original.port)
        if known != address:
            if known is not None:
                log.info("broker %d moved from %s:%d to %s:%d", original.node_id, *known, *address)
            self.upstream[original.node_id] = address

    def advertise(self, original: BrokerAddress) -> BrokerAddress:
        """The address clients see for this broker; creates its listener on first sight."""
        self.learn(original)
        port = self.listen_ports.get(original.node_id)
        if port is None:
            port = self._open_listener(original.node_id) if self.listening else self._port_for_node(
                original.node_id)
        return BrokerAddress(original.node_id, self._advertised_host, port)

    def upstream_address(self, node_id: int) -> tuple[str, int] | None:
        return self.upstream.get(node_id)

    def _bind(self, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET6 if ":" in self._bind_host else socket.AF_INET)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self._reuse_port and port != 0:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((self._bind_host, port))
            sock.listen(1024)
        except OSError:
            sock.close()
            raise
        return sock

    def _open_listener(self, node_id: int) -> int:
        wanted = self._port_for_node(node_id)
        try:
            sock = self._bind(wanted)
            self.bind_failures.pop(node_id, None)
        except OSError as exc:
            first = node_id not in self.bind_failures
            try:
                sock = self._bind(0)
            except OSError:
                self.bind_failures[node_id] = BindFailure(node_id, wanted, str(exc))
                if first:
                    log.error("cannot listen for broker %d on %s:%d (%s) nor on any port: advertising %d "
                              "and trying again at the next Metadata", node_id, self._bind_host, wanted,
                              exc, wanted)
                return wanted
            port_in_use = int(sock.getsockname()[1])
            self.bind_failures[node_id] = BindFailure(node_id, wanted, str(exc), port_in_use)
            if first:
                log.error("cannot listen for broker %d on %s:%d (%s): listening on port %d instead "
                          "(not deterministic: clients re-learn it from Metadata)", node_id, self._bind_host,
                          wanted, exc, port_in_use)
        sock.setblocking(False)
        port = int(sock.getsockname()[1])
        self.listen_ports[node_id] = port
        self._start_listener(sock, UpstreamTarget(node_id))
        log.info("listening for broker %d on %s:%d (advertised as %s:%d)", node_id, self._bind_host, port,
                 self._advertised_host, port)
        return port


def schedule_server(loop: asyncio.AbstractEventLoop, listeners: list[Listener],
                    factory: Callable[[UpstreamTarget], Callable[[], asyncio.Protocol]],
                    tls: ssl.SSLContext | None = None, tls_handshake_timeout_s: float | None = None
                    ) -> Callable[[socket.socket, UpstreamTarget], None]:
    """A `start_listener` that serves an already-listening socket with asyncio (kept in
    `listeners` at once, so that a drain that comes before asyncio serves it still stops it)."""

    def start(sock: socket.socket, target: UpstreamTarget) -> None:
        listener = Listener(factory(target), tls, tls_handshake_timeout_s if tls is not None else None,
                            sock=sock)
        listeners.append(listener)

        async def serve() -> None:
            if listener.stopped:
                return
            server = await loop.create_server(
                listener.factory, sock=sock, ssl=tls, ssl_handshake_timeout=listener.tls_handshake_timeout_s)
            if listener.stopped:  # the drain came while asyncio was setting it up
                with contextlib.suppress(OSError, ValueError):
                    server.close()
                return
            listener.server = server

        task = loop.create_task(serve())
        task.add_done_callback(_log_failure)

    return start


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("starting a broker listener failed: %s", task.exception())
