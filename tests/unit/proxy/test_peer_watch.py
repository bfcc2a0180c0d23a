"""`PeerWatch` with fake timers, and `peer_has_closed` against real loopback sockets."""

from __future__ import annotations

import socket

from proxy.pumps.peer_watch import PeerWatch, peer_has_closed
from quotas.clock import FakeClock
from tests.harness.wait import wait_until
from tests.unit.proxy.test_connection import FakeTimers


def test_the_watch_asks_every_interval_until_the_peer_is_gone_then_once_calls_back() -> None:
    timers = FakeTimers(FakeClock(0))
    answers = iter([False, False, True])
    gone: list[int] = []
    watch = PeerWatch(timers.call_later, lambda: next(answers), lambda: gone.append(1), interval_s=1.0)
    watch.start()
    watch.start()  # idempotent: one timer
    assert len(timers.pending) == 1
    timers.advance(1000)
    timers.advance(1000)
    assert gone == [] and watch.armed
    timers.advance(1000)  # the third look: gone
    assert gone == [1] and not watch.armed and timers.pending == []


def test_a_stopped_watch_asks_nothing() -> None:
    timers = FakeTimers(FakeClock(0))
    asked: list[int] = []
    watch = PeerWatch(timers.call_later, lambda: asked.append(1) or False, lambda: None)
    watch.start()
    watch.stop()
    timers.advance(10_000)
    assert asked == [] and not watch.armed


def test_peer_has_closed_reads_the_kernels_tcp_state_behind_unread_bytes() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        with accepted:
            client.sendall(b"a pipelined request nobody has read")
            assert not peer_has_closed(accepted)   # ESTABLISHED
            client.close()                         # FIN, behind the unread bytes
            wait_until(lambda: peer_has_closed(accepted), 10.0, "CLOSE_WAIT behind the unread bytes")


def test_what_is_not_a_tcp_socket_is_never_reported_closed() -> None:
    assert not peer_has_closed(None)
    left, right = socket.socketpair()  # AF_UNIX: no TCP_INFO
    with left, right:
        right.close()
        assert not peer_has_closed(left)
