"""Run the proxy process: event loop, signals, metrics endpoint."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable

from proxy.config import ConfigError, HostPort, ProxyConfig
from proxy.fleet.local import worker_index
from proxy.server import ProxyServer
from proxy.workers.status import announce_ready, listen_port_override, report_ready

log = logging.getLogger("sluice")


def configure_logging(level: str, worker: int | None = None) -> None:
    who = "" if worker is None else f"[w{worker}]"
    logging.basicConfig(level=level, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s %(name)s{who}: %(message)s")


async def serve(config: ProxyConfig, reload: Callable[[], ProxyConfig] | None = None,
                worker: int | None = None) -> int:
    server = ProxyServer(config, worker_index=worker)
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
    if worker is None:
        announce_ready(server.bootstrap)
    else:  # the supervisor prints the instance's readiness line once every worker is ready
        metrics_port = server.metrics_endpoint.port if server.metrics_endpoint is not None else None
        report_ready(server.bootstrap, metrics_port)
        log.info("worker %d ready: bootstrap %s", worker, server.bootstrap)
    await stop.wait()
    log.info("shutting down")
    await server.drain()
    return 0


def run(config: ProxyConfig, reload: Callable[[], ProxyConfig] | None = None) -> int:
    worker = worker_index()
    configure_logging(config.log_level, worker)
    if worker is None and config.anonymous_admin:  # load_config refuses it unless allowed
        log.warning("admins lists ANONYMOUS and allow_anonymous_admins is true: every client that connects "
                    "without credentials may alter quotas through Sluice")
    if worker is None and config.workers > 1:
        from proxy.workers.supervisor import supervise

        return supervise(config, sys.argv[1:])
    if worker is not None:
        config, reload = as_worker(config, reload)
    if config.event_loop == "uvloop":
        import uvloop

        return uvloop.run(serve(config, reload, worker))
    return asyncio.run(serve(config, reload, worker))


def as_worker(config: ProxyConfig, reload: Callable[[], ProxyConfig] | None
              ) -> tuple[ProxyConfig, Callable[[], ProxyConfig] | None]:
    """A worker listens on the port its supervisor reserved when the configuration says port 0
    (every worker must share it), also after a reload."""
    port = listen_port_override()
    if port is None:
        return config, reload

    def fix(c: ProxyConfig) -> ProxyConfig:
        return c.model_copy(update={"listen": HostPort(host=c.listen.host, port=port)})

    return fix(config), (None if reload is None else lambda: fix(reload()))
