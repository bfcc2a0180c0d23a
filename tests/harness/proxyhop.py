"""A load balancer for tests: a TCP relay that announces a client address with the PROXY protocol.

Sluice listens on one loopback address (127.0.0.2) and the hop on another (127.0.0.1) with the same
port numbers, so the broker addresses Sluice advertises (advertised_host 127.0.0.1) lead clients to
the hop, which opens a connection to the same port on Sluice, writes a PROXY header naming
`source` as the client, then relays bytes both ways.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from protocol.proxy_protocol import encode_v1, encode_v2


class ProxyHop:
    def __init__(self, listen_host: str, target_host: str, ports: list[int], source: tuple[str, int],
                 version: int = 2) -> None:
        self.listen_host = listen_host
        self.target_host = target_host
        self.ports = ports
        self.source = source
        self.version = version
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._servers: list[asyncio.Server] = []

    def header(self, port: int) -> bytes:
        destination = (self.target_host, port)
        encode = encode_v1 if self.version == 1 else encode_v2
        return encode(self.source, destination)

    def start(self) -> ProxyHop:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    def stop(self) -> None:
        async def close() -> None:
            for server in self._servers:
                server.close()
            # end the relays while the loop runs: a relay left pending would be closed by the
            # garbage collector later, and its `finally` would touch a closed loop
            relays = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for relay in relays:
                relay.cancel()
            await asyncio.gather(*relays, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():  # stopped: its self-pipe and selector are closed with it
            self._loop.close()

    async def _listen(self) -> None:
        for port in self.ports:
            self._servers.append(await asyncio.start_server(
                lambda r, w, p=port: self._relay(r, w, p), self.listen_host, port))

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, port)
        except OSError:
            writer.close()
            return
        up_writer.write(self.header(port))

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))


@contextlib.contextmanager
def proxy_hop(listen_host: str, target_host: str, ports: list[int], source: tuple[str, int],
              version: int = 2) -> Iterator[ProxyHop]:
    hop = ProxyHop(listen_host, target_host, ports, source, version).start()
    try:
        yield hop
    finally:
        hop.stop()
