"""Run the proxy process: event loop, signals, metrics endpoint."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from proxy.config import ProxyConfig
from proxy.server import ProxyServer

log = logging.getLogger("sluice")


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


async def serve(config: ProxyConfig) -> int:
    server = ProxyServer(config)
    await server.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"sluice ready: bootstrap {server.bootstrap}", file=sys.stderr, flush=True)
    await stop.wait()
    log.info("shutting down")
    await server.drain()
    return 0


def run(config: ProxyConfig) -> int:
    configure_logging(config.log_level)
    if config.event_loop == "uvloop":
        import uvloop

        return uvloop.run(serve(config))
    return asyncio.run(serve(config))
