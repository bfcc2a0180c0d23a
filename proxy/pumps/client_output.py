"""Everything written to one client goes through here.

A write is activity for the idle timeout (`ConnectionWatchdog.last_active_ms`), and what the
client's transport holds afterwards is re-measured for the buffer limits (`ClientBuffer`) when it
changed. Writes after the transport started closing are dropped: the client is gone.

**Corked writes.** When one read brings more than one frame (the client's pipelined requests, or
the broker's responses), the connection corks the output while it handles them (`cork`, `uncork`,
nested): what is written meanwhile is held in order and handed to the transport as one
`writelines` when the outermost cork is taken out, so a read that completes sixteen pipelined
responses costs one `writev`, not sixteen (uvloop sends each write at once when its socket buffer
is empty). Nothing waits past the read being handled, and a read of one frame is not corked.
`release` writes what is held at once: a connection that closes first sends what its client was
already answered, as the transport's own close does with its buffer.

This is the readable reference of `proxy.pumps._speedups.ClientOutput`, which a connection uses
when the compiled orchestration was built (`proxy.pumps.connection`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from protocol._wire import I32
from proxy.pumps.limits import ClientBuffer, ConnectionWatchdog

_pack_size = I32.pack  # `protocol.framing.size_prefix` without its call


class WriteCork:
    """What is written to one transport between `cork` and `uncork` (nested), held in order for its
    owner (`ClientOutput`, `proxy.pumps.upstream.UpstreamConnection`) to write as one `writelines`."""

    __slots__ = ("corked", "held")

    def __init__(self) -> None:
        self.corked = 0  # how many corks are in: held while > 0
        self.held: list[bytes | memoryview] = []

    def cork(self) -> None:
        self.corked += 1

    def uncork(self) -> bool:
        """Take out one cork: whether it was the last with something held (to `take` and write)."""
        self.corked -= 1
        return not self.corked and bool(self.held)

    def take(self) -> list[bytes | memoryview]:
        """What is held, in order; nothing is held afterwards."""
        held, self.held = self.held, []
        return held


class ClientOutput:
    __slots__ = ("_buffer", "_cork", "_now_ms", "_transport", "_watchdog")

    def __init__(self, buffer: ClientBuffer, watchdog: ConnectionWatchdog, now_ms: Callable[[], int]) -> None:
        self._buffer = buffer
        self._watchdog = watchdog
        self._now_ms = now_ms
        self._transport: asyncio.Transport | None = None
        self._cork = WriteCork()

    def attach(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def write(self, data: bytes | memoryview) -> None:
        if self._cork.corked:
            self._cork.held.append(data)
            return
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(data)
            self._wrote(transport)

    def writelines(self, parts: tuple[bytes | memoryview, ...]) -> None:
        if self._cork.corked:
            self._cork.held.extend(parts)
            return
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.writelines(parts)
            self._wrote(transport)

    def frame(self, payload: bytes) -> None:
        """One whole Kafka frame: the size prefix, then the payload (`writelines` and `_wrote` in
        one call: every response goes through here)."""
        if self._cork.corked:
            held = self._cork.held
            held.append(_pack_size(len(payload)))
            held.append(payload)
            return
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.writelines((_pack_size(len(payload)), payload))
            self._watchdog.last_active_ms = self._now_ms()
            buffer = self._buffer
            if transport.get_write_buffer_size() != buffer.held_bytes:
                buffer.measure()

    def cork(self) -> None:
        """Hold what is written from now until the matching `uncork`."""
        self._cork.cork()

    def uncork(self) -> None:
        """Take out one cork; the last one writes what is held, as one `writelines`."""
        if self._cork.uncork():
            self.release()

    def release(self) -> None:
        """Write what is held now, corked or not."""
        held = self._cork.take()
        if not held:
            return
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.writelines(held)
            self._wrote(transport)

    def _wrote(self, transport: asyncio.Transport) -> None:
        self._watchdog.last_active_ms = self._now_ms()
        buffer = self._buffer
        if transport.get_write_buffer_size() != buffer.held_bytes:
            buffer.measure()


__all__ = ["ClientOutput", "WriteCork"]
