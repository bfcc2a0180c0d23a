"""Everything written to one client goes through here.

A write is activity for the idle timeout (`ConnectionWatchdog.last_active_ms`), and what the
client's transport holds afterwards is re-measured for the buffer limits (`ClientBuffer`) when it
changed. Writes after the transport started closing are dropped: the client is gone.

This is the readable reference of `proxy.pumps._speedups.ClientOutput`, which a connection uses
when the compiled orchestration was built (`proxy.pumps.connection`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from protocol._wire import I32
from proxy.pumps.limits import ClientBuffer, ConnectionWatchdog

_pack_size = I32.pack  # `protocol.framing.size_prefix` without its call


class ClientOutput:
    __slots__ = ("_buffer", "_now_ms", "_transport", "_watchdog")

    def __init__(self, buffer: ClientBuffer, watchdog: ConnectionWatchdog, now_ms: Callable[[], int]) -> None:
        self._buffer = buffer
        self._watchdog = watchdog
        self._now_ms = now_ms
        self._transport: asyncio.Transport | None = None

    def attach(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def write(self, data: bytes | memoryview) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(data)
            self._wrote(transport)

    def writelines(self, parts: tuple[bytes | memoryview, ...]) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.writelines(parts)
            self._wrote(transport)

    def frame(self, payload: bytes) -> None:
        """One whole Kafka frame: the size prefix, then the payload (`writelines` and `_wrote` in
        one call: every response goes through here)."""
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.writelines((_pack_size(len(payload)), payload))
            self._watchdog.last_active_ms = self._now_ms()
            buffer = self._buffer
            if transport.get_write_buffer_size() != buffer.held_bytes:
                buffer.measure()

    def _wrote(self, transport: asyncio.Transport) -> None:
        self._watchdog.last_active_ms = self._now_ms()
        buffer = self._buffer
        if transport.get_write_buffer_size() != buffer.held_bytes:
            buffer.measure()


__all__ = ["ClientOutput"]
