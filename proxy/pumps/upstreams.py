"""Which brokers exist behind Sluice, and the Sluice listener that stands for each.

Clients must never learn a broker's real address: every broker address in Metadata,
FindCoordinator and DescribeCluster responses is replaced by Sluice's advertised host and the port
of a per-broker listener. That port is deterministic (`broker_port_base + node_id`) so that clients
that cached it find it again after a Sluice restart.

A listener is created the first time a broker appears. Its socket is bound and listening before
the rewritten response leaves Sluice, so a client that connects at once lands in the kernel's
accept queue even while the asyncio server is still being set up.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from protocol.rewrite import BrokerAddress

log = logging.getLogger("sluice.brokers")


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
            port = self._open_listener(original.node_id)
        return BrokerAddress(original.node_id, self._advertised_host, port)

    def upstream_address(self, node_id: int) -> tuple[str, int] | None:
        return self.upstream.get(node_id)

    def _open_listener(self, node_id: int) -> int:
        wanted = self._port_for_node(node_id)
        sock = socket.socket(socket.AF_INET6 if ":" in self._bind_host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self._reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind((self._bind_host, wanted))
            sock.listen(1024)
        except OSError as exc:
            sock.close()
            log.error("cannot listen for broker %d on %s:%d: %s", node_id, self._bind_host, wanted, exc)
            raise
        sock.setblocking(False)
        port = int(sock.getsockname()[1])
        self.listen_ports[node_id] = port
        self._start_listener(sock, UpstreamTarget(node_id))
        log.info("listening for broker %d on %s:%d (advertised as %s:%d)", node_id, self._bind_host, port,
                 self._advertised_host, port)
        return port


def schedule_server(loop: asyncio.AbstractEventLoop, servers: list[asyncio.Server],
                    factory: Callable[[UpstreamTarget], Callable[[], asyncio.Protocol]],
                    tls: ssl.SSLContext | None = None) -> Callable[[socket.socket, UpstreamTarget], None]:
    """A `start_listener` that serves an already-listening socket with asyncio."""

    def start(sock: socket.socket, target: UpstreamTarget) -> None:
        async def serve() -> None:
            servers.append(await loop.create_server(factory(target), sock=sock, ssl=tls))

        task = loop.create_task(serve())
        task.add_done_callback(_log_failure)

    return start


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("starting a broker listener failed: %s", task.exception())
