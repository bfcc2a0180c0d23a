"""The ceiling for a Python Kafka proxy: a raw byte forwarder with no protocol knowledge at all.

Two `asyncio.Protocol`s per client connection on uvloop. `data_received` hands each chunk straight
to the peer's `transport.write`; when a peer's write buffer fills (`pause_writing`) the other side
stops reading until it drains (`resume_writing`). Nothing is framed, parsed, copied or rewritten:
this is the `raw-proto` forwarder of the kio/proxy performance study (shared docs, §5), the
fastest Python forwarder measured there.

A Kafka client behind it still has to be told the forwarder's address instead of the broker's.
The forwarder cannot rewrite Metadata, so the benchmark does it on the broker side: the broker
gets an extra listener whose *advertised* address is this forwarder's port (see
`bench.bench_proxy.BenchCluster`). Every address a client learns through the forwarder points back
at the forwarder.

Run: `python -m bench.common.raw_forwarder --listen 127.0.0.1:PORT --upstream 127.0.0.1:PORT`. It prints
`raw forwarder ready: HOST:PORT` on stderr once listening, and exits on SIGTERM or SIGINT. With
`--workers N`, N such processes share the port (SO_REUSEPORT), as Sluice's workers do.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
from typing import cast


class _Side(asyncio.Protocol):
    """One socket of a forwarded pair. `peer` is the other side, set once both are connected."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; both loops set TCP_NODELAY
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.peer.transport.write(data)  # type: ignore[union-attr]  # _Client buffers until paired

    def eof_received(self) -> bool:
        self.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None:
            self.peer.close()

    # our write buffer is full: stop reading from the peer until it drains
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class _Client(_Side):
    """The accepted side: pauses reading until the upstream connection is made."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__()
        self._upstream = upstream
        self._task: asyncio.Task[None] | None = None
        self._early: list[bytes] | None = []  # bytes that came before the upstream was connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # uvloop may deliver data even after pause_reading() inside connection_made: keep it
        self.transport.pause_reading()  # type: ignore[union-attr]
        self._task = asyncio.get_running_loop().create_task(self._connect())

    def data_received(self, data: bytes) -> None:
        if self._early is None:
            self.peer.transport.write(data)  # type: ignore[union-attr]
        else:
            self._early.append(data)

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await loop.create_connection(_Side, *self._upstream)
        except OSError:
            self.close()
            return
        if self.transport is None or self.transport.is_closing():
            upstream.close()
            return
        upstream.peer, self.peer = self, upstream
        early, self._early = self._early or [], None
        if early:
            upstream.transport.writelines(early)  # type: ignore[union-attr]
        self.transport.resume_reading()


async def serve(listen: tuple[str, int], upstream: tuple[str, int], reuse_port: bool = False) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(upstream), *listen, reuse_address=True,
                                      reuse_port=reuse_port or None)
    host, port = server.sockets[0].getsockname()[:2]
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"raw forwarder ready: {host}:{port}", file=sys.stderr, flush=True)
    await stop.wait()
    server.close()


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--listen", required=True, type=_host_port, metavar="HOST:PORT")
    parser.add_argument("--upstream", required=True, type=_host_port, metavar="HOST:PORT")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes sharing the port with SO_REUSEPORT, as `sluice proxy --workers`")
    parser.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)  # one of --workers
    args = parser.parse_args(argv)
    if args.workers > 1:
        return _supervise(args)
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(serve(args.listen, args.upstream, args.reuse_port))
    else:
        asyncio.run(serve(args.listen, args.upstream, args.reuse_port))
    return 0


def _supervise(args: argparse.Namespace) -> int:
    """`--workers N`: N forwarders on one port (SO_REUSEPORT: the kernel spreads the connections),
    each its own process; ready once all are, stopped together on SIGTERM or SIGINT."""
    listen = f"{args.listen[0]}:{args.listen[1]}"
    upstream = f"{args.upstream[0]}:{args.upstream[1]}"
    workers = [subprocess.Popen([sys.executable, "-m", "bench.common.raw_forwarder", "--listen", listen,
                                 "--upstream", upstream, "--loop", args.loop, "--reuse-port"],
                                stderr=subprocess.PIPE, text=True) for _ in range(args.workers)]
    for worker in workers:
        line = worker.stderr.readline() if worker.stderr else ""  # "raw forwarder ready: ..."
        if not line.startswith("raw forwarder ready"):
            for w in workers:
                w.terminate()
            print(f"a raw forwarder worker did not start: {line!r}", file=sys.stderr)
            return 1
    stopping = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stopping)  # (after the workers started: not theirs)
    print(f"raw forwarder ready: {listen} ({args.workers} workers)", file=sys.stderr, flush=True)
    signal.sigwait(stopping)
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
