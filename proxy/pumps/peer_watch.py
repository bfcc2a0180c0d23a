"""Noticing that a client went away while its channel is muted and not being read.

A muted channel (`proxy.pumps.muting`) whose client has sent more than Sluice may process is not
read until the mute ends, so the client's FIN sits behind unread bytes and the event loop never
reports it. librdkafka does exactly this: it ignores `throttle_time_ms`, keeps pipelining, and when
a request times out (60 s by default, and a ten-producer quota debt lasts longer) it closes the
connection and opens a new one. Without a check, each such connection, its upstream connection and
its buffers stay until the mute ends, which for a byte-rate throttle has no bound.

`PeerWatch` checks the socket's TCP state every `interval_s` while it is armed. The kernel knows
the peer closed (CLOSE_WAIT after its FIN, CLOSE after a reset) however much is unread; one
`getsockopt(TCP_INFO)` a second per muted, paused connection reads it without touching the data.
A transport without a TCP socket (a fake, a Unix socket) is never reported closed.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from proxy.pumps.throttle_timer import CallLater, TimerHandle

PEER_CHECK_INTERVAL_S = 1.0

# tcpi_state, the first byte of Linux's struct tcp_info (include/net/tcp_states.h)
_TCP_CLOSE = 7
_TCP_CLOSE_WAIT = 8
_TCP_INFO = getattr(socket, "TCP_INFO", None)


def peer_has_closed(sock: object) -> bool:
    """Whether the peer of a TCP socket has closed or reset the connection (False when unknown)."""
    getsockopt = getattr(sock, "getsockopt", None)
    if getsockopt is None or _TCP_INFO is None:
        return False
    try:
        info = getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 1)
    except (OSError, ValueError):  # not TCP, or the descriptor is already gone
        return False
    return isinstance(info, bytes) and len(info) == 1 and info[0] in (_TCP_CLOSE_WAIT, _TCP_CLOSE)


class PeerWatch:
    """While armed, asks `closed()` every `interval_s`; calls `on_gone()` once it says yes."""

    __slots__ = ("_call_later", "_closed", "_handle", "_interval_s", "_on_gone")

    def __init__(self, call_later: CallLater, closed: Callable[[], bool], on_gone: Callable[[], None],
                 interval_s: float = PEER_CHECK_INTERVAL_S) -> None:
        self._call_later = call_later
        self._closed = closed
        self._on_gone = on_gone
        self._interval_s = interval_s
        self._handle: TimerHandle | None = None

    @property
    def armed(self) -> bool:
        return self._handle is not None

    def start(self) -> None:
        if self._handle is None:
            self._handle = self._call_later(self._interval_s, self._check)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        self._handle = None
        if self._closed():
            self._on_gone()
        else:
            self.start()


__all__ = ["PEER_CHECK_INTERVAL_S", "PeerWatch", "peer_has_closed"]
