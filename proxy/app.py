"""Run the proxy process: event loop, signals, metrics endpoint."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable

from proxy.config import ConfigError, ProxyConfig
from proxy.server import ProxyServer

log = logging.getLogger("sluice")


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


async def serve(config: ProxyConfig, reload: Callable[[], ProxyConfig] | None = None) -> int:
    server = ProxyServer(config)
    await server.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def on_sighup() -> None:
        if reload is None:
            log.warning("SIGHUP ignored: Sluice was started without a config file")
            return
        try:
            server.reload(reload())
        except ConfigError as exc:
            log.error("reload refused, keeping the running configuration: %s", exc)

    loop.add_signal_handler(signal.SIGHUP, on_sighup)
    print(f"sluice ready: bootstrap {server.bootstrap}", file=sys.stderr, flush=True)
    await stop.wait()
    log.info("shutting down")
    await server.drain()
    return 0


def run(config: ProxyConfig, reload: Callable[[], ProxyConfig] | None = None) -> int:
    configure_logging(config.log_level)
    if config.event_loop == "uvloop":
        import uvloop

        return uvloop.run(serve(config, reload))
    return asyncio.run(serve(config, reload))
