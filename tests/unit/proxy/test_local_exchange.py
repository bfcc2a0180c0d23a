"""LocalExchange and the supervisor's hub over a real Unix socket: every worker gets every payload
(its own included), nothing blocks, and a lost hub is counted and reconnected."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from proxy.fleet.exchange import Exchange, ExchangeError
from proxy.fleet.local import HubServer, LocalExchange
from tests.harness.wait import wait_until


class HubThread:
    """A HubServer on its own event loop in a thread (the supervisor runs it on its loop)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.loop = asyncio.new_event_loop()
        self.hub = HubServer(path)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.hub.start(), self.loop).result(5)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.hub.close(), self.loop).result(5)

    def restart(self) -> None:
        self.hub = HubServer(self.path)
        asyncio.run_coroutine_threadsafe(self.hub.start(), self.loop).result(5)

    def shutdown(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()  # and its self-pipe's two sockets, which would otherwise be left to the collector


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubThread]:
    h = HubThread(tmp_path / "hub.sock")
    yield h
    h.shutdown()


def collect(exchanges: list[LocalExchange], want: int, into: list[list[bytes]]) -> Callable[[], bool]:
    def check() -> bool:
        for got, ex in zip(into, exchanges, strict=True):
            got.extend(ex.drain())
        return all(len(g) >= want for g in into)

    return check


def test_every_member_receives_every_payload_its_own_included(hub: HubThread) -> None:
    members = [LocalExchange(hub.path) for _ in range(3)]
    for m in members:
        m.start()
    wait_until(lambda: hub.hub.stats().clients == 3, 10, "three members on the hub")
    exchange: Exchange = members[0]  # the protocol the fleet member uses
    assert exchange.connected and exchange.errors == 0
    big = bytes(range(256)) * 1000  # larger than one socket read
    for i, m in enumerate(members):
        m.publish(f"report from {i}".encode())
    members[2].publish(big)
    got: list[list[bytes]] = [[], [], []]
    wait_until(collect(members, 4, got), 10, "every payload at every member")
    for received in got:
        expected = [b"report from 0", b"report from 1", b"report from 2", big]
        assert sorted(received[:4], key=lambda b: (len(b), b)) == expected
    assert all(m.errors == 0 for m in members)
    for m in members:
        m.close()


def test_publish_and_drain_do_not_block(hub: HubThread) -> None:
    member = LocalExchange(hub.path, max_queued=10)
    member.start()
    started = time.monotonic()
    for _ in range(1000):
        member.publish(b"x" * 100)
    member.drain()
    assert time.monotonic() - started < 1.0  # queued or counted, never waited on
    member.close()


def test_lost_hub_is_counted_and_reconnected(hub: HubThread) -> None:
    member = LocalExchange(hub.path, reconnect_ms=50)
    member.start()
    wait_until(lambda: hub.hub.stats().clients == 1, 10, "the member on the hub")
    hub.stop()
    wait_until(lambda: not member.connected, 10, "the member to see the hub gone")
    assert member.errors >= 1
    errors = member.errors
    member.publish(b"lost")  # while down: counted, not raised
    assert member.errors == errors + 1
    hub.restart()
    wait_until(lambda: member.connected, 10, "the member to reconnect")
    member.publish(b"back")
    got: list[list[bytes]] = [[]]
    wait_until(collect([member], 1, got), 10, "the payload after reconnecting")
    assert got[0] == [b"back"]
    member.close()


def test_start_without_a_hub_raises_exchange_error(tmp_path: Path) -> None:
    member = LocalExchange(tmp_path / "nothing.sock")
    with pytest.raises(ExchangeError, match=r"nothing\.sock"):
        member.start()
    assert "nothing.sock" in member.describe()
