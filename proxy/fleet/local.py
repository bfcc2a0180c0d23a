"""The workers of one instance as fleet members: their supervisor relays usage reports over a Unix socket.

`sluice proxy --workers N` runs N worker processes under a supervisor (`proxy.workers`). The
supervisor runs a `HubServer` on a Unix stream socket in a private temporary directory and tells
each worker where it is through the environment (`SLUICE_WORKER_HUB`). Each worker's
`LocalExchange` connects to it. The wire format is a stream of frames, each a 4-byte big-endian
length and that many bytes of payload; every frame a worker sends goes to every connected worker,
the sender included (the `Exchange` contract: a member reads its own reports too).

`LocalExchange` never blocks its caller: `publish` puts the frame on a bounded queue that a
background thread writes, a second thread reads frames into an inbox that `drain` empties. When
the hub goes away, `connected` turns False, `errors` counts it, and the thread reconnects every
`reconnect_ms` until the hub is back.

`worker_index()` and `hub_path()` tell a process whether it runs as a worker (None when it does not).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import socket
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from proxy.fleet.exchange import ExchangeError, Inbox

log = logging.getLogger("sluice.fleet.local")

ENV_INDEX = "SLUICE_WORKER_INDEX"
ENV_HUB = "SLUICE_WORKER_HUB"
_LENGTH = struct.Struct(">I")
MAX_FRAME_BYTES = 16 * 1024 * 1024


def worker_index() -> int | None:
    """This process's worker index (0..N-1) when a supervisor started it, else None."""
    text = os.environ.get(ENV_INDEX)
    return int(text) if text is not None and text.isdigit() else None


def hub_path() -> Path | None:
    """The supervisor's relay socket when this process is a worker, else None."""
    if worker_index() is None:
        return None
    text = os.environ.get(ENV_HUB)
    return Path(text) if text else None


def frame(payload: bytes) -> bytes:
    return _LENGTH.pack(len(payload)) + payload


# ---------------------------------------------------------------------------------- client


class LocalExchange(Inbox):
    """An `Exchange` (proxy.fleet.exchange) over the supervisor's hub."""

    def __init__(self, path: Path, *, reconnect_ms: int = 200, max_queued: int = 1000,
                 max_inbox: int = 100_000) -> None:
        self.path = path
        self._reconnect_s = reconnect_ms / 1000
        self._outbox: queue.Queue[bytes] = queue.Queue(maxsize=max_queued)
        super().__init__(max_inbox)
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the Exchange contract

    def start(self) -> None:
        try:
            sock = self._connect()
        except OSError as exc:
            reason = exc.strerror or exc
            raise ExchangeError(f"cannot reach the workers' hub at {self.path}: {reason}") from None
        self._adopt(sock)
        self._thread = threading.Thread(target=self._write_loop, name="sluice-hub-writer", daemon=True)
        self._thread.start()

    def publish(self, payload: bytes) -> None:
        if not self.connected:
            self._count_error()
            return
        try:
            self._outbox.put_nowait(frame(payload))
        except queue.Full:
            self._count_error()


    @property
    def connected(self) -> bool:
        return self._sock is not None

    def describe(self) -> str:
        return f"the workers' hub at {self.path}"

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            _close(sock)
        if self._thread is not None:
            self._thread.join(2)

    # ------------------------------------------------------------------ threads

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(2)
            sock.connect(str(self.path))
            sock.settimeout(None)
        except OSError:
            sock.close()
            raise
        return sock

    def _adopt(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
        threading.Thread(target=self._read_loop, args=(sock,), name="sluice-hub-reader", daemon=True).start()

    def _count_error(self) -> None:
        with self._lock:
            self._errors += 1

    def _lost(self, sock: socket.socket, reason: str) -> None:
        with self._lock:
            if self._sock is not sock:
                return  # already handled, or closed on purpose
            self._sock = None
            self._errors += 1
        _close(sock)
        if not self._closed.is_set():
            log.warning("lost the workers' hub at %s (%s); reconnecting", self.path, reason)

    def _write_loop(self) -> None:
        while not self._closed.is_set():
            sock = self._sock
            if sock is None:
                if self._closed.wait(self._reconnect_s):
                    return
                try:
                    sock = self._connect()
                except OSError:
                    continue
                self._drop_queued()  # reports queued while down are stale
                self._adopt(sock)
                log.info("reconnected to the workers' hub at %s", self.path)
                continue
            try:
                data = self._outbox.get(timeout=0.1)
            except queue.Empty:
                continue
            try:
                sock.sendall(data)
            except OSError as exc:
                self._lost(sock, f"send: {exc.strerror or exc}")

    def _drop_queued(self) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                self._outbox.get_nowait()

    def _read_loop(self, sock: socket.socket) -> None:
        buffer = bytearray()
        while True:
            try:
                chunk = sock.recv(65536)
            except OSError as exc:
                self._lost(sock, f"receive: {exc.strerror or exc}")
                return
            if not chunk:
                self._lost(sock, "closed by the hub")
                return
            buffer += chunk
            while len(buffer) >= _LENGTH.size:
                (length,) = _LENGTH.unpack_from(buffer)
                if length > MAX_FRAME_BYTES:
                    self._lost(sock, f"a frame of {length} bytes")
                    return
                end = _LENGTH.size + length
                if len(buffer) < end:
                    break
                self._inbox.append(bytes(buffer[_LENGTH.size:end]))
                del buffer[:end]


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


# ---------------------------------------------------------------------------------- relay


@dataclass(frozen=True)
class HubStats:
    clients: int
    frames_relayed: int
    frames_dropped: int


class HubServer:
    """The supervisor's relay: every frame from any client goes to every client (asyncio)."""

    def __init__(self, path: Path, *, max_buffer_bytes: int = 8 * 1024 * 1024) -> None:
        self.path = path
        self._max_buffer_bytes = max_buffer_bytes
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._relayed = 0
        self._dropped = 0

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, str(self.path))
        os.chmod(self.path, 0o600)

    def stats(self) -> HubStats:
        return HubStats(len(self._writers), self._relayed, self._dropped)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        with contextlib.suppress(OSError):
            self.path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readexactly(_LENGTH.size)
                (length,) = _LENGTH.unpack(head)
                if length > MAX_FRAME_BYTES:
                    log.warning("workers' hub: a frame of %d bytes; closing that connection", length)
                    return
                data = head + await reader.readexactly(length)
                for peer in list(self._writers):
                    transport = peer.transport
                    if transport.is_closing() or transport.get_write_buffer_size() > self._max_buffer_bytes:
                        self._dropped += 1
                        continue
                    peer.write(data)
                    self._relayed += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()
