"""`Listener.stop`: a draining process serves the connections the kernel had already accepted for
its listening socket instead of resetting them, over real loopback sockets; and opens no new one."""

from __future__ import annotations

import asyncio
import socket

from protocol.rewrite import BrokerAddress
from proxy.pumps.accepting import Listener, accept_queued
from proxy.pumps.upstreams import BrokerRegistry, UpstreamTarget


class Recorder(asyncio.Protocol):
    def __init__(self, got: asyncio.Queue[bytes]) -> None:
        self.got = got

    def data_received(self, data: bytes) -> None:
        self.got.put_nowait(data)


async def test_the_connections_queued_when_the_listener_stops_are_served_not_reset() -> None:
    got: asyncio.Queue[bytes] = asyncio.Queue()
    listener = Listener(lambda: Recorder(got))
    listener.server = await asyncio.get_running_loop().create_server(listener.factory, "127.0.0.1", 0)
    port = listener.server.sockets[0].getsockname()[1]
    # the kernel completes these handshakes; the loop does not run, so asyncio accepts none of them
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    for i, client in enumerate(clients):
        client.sendall(b"request %d" % i)
    try:
        queued = listener.stop()                    # SIGTERM: no await between the signal and this
        assert len(queued) == 3
        with socket.socket() as late:               # the listening socket is closed now
            assert late.connect_ex(("127.0.0.1", port)) != 0
        await asyncio.wait_for(asyncio.gather(*listener.serve_accepted(queued)), 10)
        received = {await asyncio.wait_for(got.get(), 10) for _ in clients}
        assert received == {b"request 0", b"request 1", b"request 2"}
    finally:
        for client in clients:
            client.close()


def test_accept_queued_returns_nothing_when_nobody_waits() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        assert accept_queued(listening) == []


async def test_a_listener_stopped_before_asyncio_serves_it_closes_its_socket() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    try:
        listener = Listener(asyncio.Protocol, sock=sock)
        queued = listener.stop()
        assert len(queued) == 1 and sock.fileno() == -1
        for conn in queued:
            conn.close()
    finally:
        client.close()


def test_a_draining_registry_advertises_a_new_broker_without_opening_a_listener() -> None:
    """A Metadata answered during the drain names a broker this process has no listener for: it is
    advertised at its deterministic port, and no listener is opened (one opened now would never be
    stopped, and the drain would wait for it forever)."""
    opened: list[int] = []

    def start(sock: socket.socket, target: UpstreamTarget) -> None:
        opened.append(sock.getsockname()[1])
        sock.close()

    registry = BrokerRegistry("127.0.0.1", "proxy.example", lambda node_id: 0, start)
    registry.stop_listening()
    assert registry.advertise(BrokerAddress(3, "kafka-3", 9092)) == BrokerAddress(3, "proxy.example", 0)
    assert opened == [] and registry.listen_ports == {}
    assert registry.upstream_address(3) == ("kafka-3", 9092)  # still learnt: requests reach it
