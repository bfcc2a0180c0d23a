"""The listening sockets of one process, and how they stop accepting when it drains.

The kernel completes a TCP handshake before the process accepts the connection: a client may
have connected and sent its request (a PROXY header and a long-poll Fetch) while the connection
still waits in the listening socket's accept queue. Closing that socket resets every connection
in its queue, and with `workers: N` (SO_REUSEPORT) the queue is the closing worker's own: the
kernel gives its connections to no other socket. So a drain does not merely close its listeners:
`Listener.stop` stops asyncio accepting, then accepts what the kernel has queued (through a
duplicate of the socket, which keeps it listening until the queue is empty) and only then closes
it; `Listener.serve_accepted` serves those connections as draining ones (they are answered, then
closed between requests, as every other connection of a draining process).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("sluice.server")


@dataclass
class Listener:
    """A listening socket served by asyncio, with what serves the connections it accepts."""

    factory: Callable[[], asyncio.Protocol]
    tls: ssl.SSLContext | None = None
    tls_handshake_timeout_s: float | None = None
    server: asyncio.Server | None = None
    sock: socket.socket | None = None  # bound and listening, before asyncio serves it
    stopped: bool = False

    def stop(self) -> list[socket.socket]:
        """Stop accepting: asyncio no longer accepts, the connections the kernel had queued are
        accepted here (returned, for `serve_accepted`), then the listening socket is closed."""
        self.stopped = True
        if self.server is not None:
            fds = [s.fileno() for s in self.server.sockets]
        else:
            fds = [self.sock.fileno()] if self.sock is not None and self.sock.fileno() >= 0 else []
        duplicates = [socket.socket(fileno=os.dup(fd)) for fd in fds]
        if self.server is not None:
            self.server.close()  # asyncio stops reading the socket: the duplicate keeps it listening
        elif self.sock is not None:
            self.sock.close()
        accepted: list[socket.socket] = []
        for duplicate in duplicates:
            accepted += accept_queued(duplicate)
            duplicate.close()
        return accepted

    def serve_accepted(self, socks: list[socket.socket]) -> list[asyncio.Task[object]]:
        """Serve connections `stop` accepted, as the server would have (TLS handshake included)."""
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[object]] = []
        for sock in socks:
            coro = loop.connect_accepted_socket(
                self.factory, sock, ssl=self.tls,
                ssl_handshake_timeout=self.tls_handshake_timeout_s if self.tls is not None else None)
            task: asyncio.Task[object] = loop.create_task(coro)
            task.add_done_callback(_log_failure)
            tasks.append(task)
        return tasks


def accept_queued(listening: socket.socket) -> list[socket.socket]:
    """Every connection the kernel has queued on a listening socket, accepted without blocking."""
    listening.setblocking(False)
    accepted: list[socket.socket] = []
    while True:
        try:
            conn, _ = listening.accept()
        except (BlockingIOError, InterruptedError):
            return accepted
        except ConnectionAbortedError:  # the client gave up while queued: the next one
            continue
        except OSError as exc:
            log.warning("accepting the queued connections before closing a listener: %s", exc)
            return accepted
        conn.setblocking(False)
        accepted.append(conn)


def _log_failure(task: asyncio.Task[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.info("a connection accepted while draining could not be served: %s", task.exception())
