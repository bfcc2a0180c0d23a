"""A minimal HTTP endpoint on the metrics port: `/metrics` (Prometheus text), `/healthz` (see
`HealthReport` for its status codes), JSON
documents such as `/quotas/usage` (`json_routes`; no authentication, as for `/metrics`: bind
`metrics.host` to a private interface) and, when enabled, `/connections` (JSON,
`proxy.ops.connections`; 404 when not enabled, 401 without the bearer token when one is configured).

asyncio-native so it shares the proxy's loop; prometheus-client renders the exposition format.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from proxy.ops.connections import BearerToken

log = logging.getLogger("sluice.http")


@dataclass(frozen=True, slots=True)
class HealthReport:
    """What `/healthz` answers:

    * 200 ``ok``: serving, and every part works;
    * 207 ``degraded: <part>: <why>`` (a line per problem): serving (a load balancer or readiness
      probe, which take any 2xx, keeps sending connections) but a part is failing: the access log
      is dropping records or its writer is being restarted, or the quota store holds records
      Sluice cannot read. Monitoring alerts on it; the reasons are also metrics;
    * 503 (``draining``, or ``unavailable: N/M workers up``): do not send new connections here.
    """

    serving: bool
    unavailable: str = "draining"           # the body's reason when not serving
    degraded: tuple[str, ...] = ()

    @property
    def status(self) -> str:
        if not self.serving:
            return "503 Service Unavailable"
        return "207 Multi-Status" if self.degraded else "200 OK"

    @property
    def body(self) -> bytes:
        if not self.serving:
            return f"{self.unavailable}\n".encode()
        if self.degraded:
            return "".join(f"degraded: {why}\n" for why in self.degraded).encode()
        return b"ok\n"


Health = Callable[[], Awaitable[HealthReport]]   # what /healthz answers, asked per request
Degraded = Callable[[], Sequence[str]]            # a part's problems now (empty: it works)
Render = Callable[[], Awaitable[bytes]]    # the body of a document
Query = Callable[[Mapping[str, str]], Awaitable[bytes]]  # the body of a document asked with ?k=v&...
_MAX_HEADER_LINES = 100


class MetricsEndpoint:
    """Serves `/metrics` from `scrape` and `/healthz` from `health`. A process serves its own
    registry (`for_registry`); the workers' supervisor serves its merge of theirs."""

    def __init__(self, scrape: Render, health: Health, json_routes: Mapping[str, Render] | None = None, *,
                 connections: Render | None = None, token: BearerToken | None = None,
                 query_routes: Mapping[str, Query] | None = None) -> None:
        self._scrape = scrape
        self._query = dict(query_routes or {})
        self._health = health
        self._json = dict(json_routes or {})
        self._connections = connections
        self._token = token
        self._server: asyncio.Server | None = None
        self.port = 0

    @classmethod
    def for_registry(cls, registry: CollectorRegistry, healthy: Callable[[], bool],
                     json_routes: Mapping[str, Render] | None = None, *, connections: Render | None = None,
                     token: BearerToken | None = None, degraded: Sequence[Degraded] = (),
                     query_routes: Mapping[str, Query] | None = None) -> MetricsEndpoint:
        async def scrape() -> bytes:
            return generate_latest(registry)

        async def health() -> HealthReport:
            return HealthReport(healthy(), degraded=tuple(why for part in degraded for why in part()))

        return cls(scrape, health, json_routes, connections=connections, token=token,
                   query_routes=query_routes)

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._handle, host, port, reuse_address=True)
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info("metrics on http://%s:%d/metrics", host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), 5)
            authorization: str | None = None
            for _ in range(_MAX_HEADER_LINES):
                line = await asyncio.wait_for(reader.readline(), 5)
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _sep, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "authorization":
                    authorization = value.strip()
            parts = request_line.decode("latin-1").split()
            path, _q, query = (parts[1] if len(parts) >= 2 else "").partition("?")
            extra = ""
            if path == "/metrics":
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, await self._scrape()
            elif (route := self._json.get(path)) is not None:
                status, ctype, body = "200 OK", "application/json", await route()
            elif (asked := self._query.get(path)) is not None:
                args = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
                status, ctype, body = "200 OK", "application/json", await asked(args)
            elif path == "/healthz":
                report = await self._health()
                status, ctype, body = report.status, "text/plain", report.body
            elif path == "/connections" and self._connections is not None:
                if self._token is not None and not self._token.allows(authorization):
                    status, ctype, body = "401 Unauthorized", "text/plain", b"unauthorized\n"
                    extra = 'WWW-Authenticate: Bearer realm="sluice"\r\n'
                else:
                    status, ctype, body = "200 OK", "application/json", await self._connections()
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                         f"{extra}Connection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
