"""The connection inventory: every open client connection of this process, as `GET /connections`.

The live connections are the server's own set (`ConnectionServices.connections`: a connection
joins it when it opens and leaves it when it closes); each carries its `ConnectionContext` with
the principal, the client software, the address (the real client's behind a PROXY-protocol hop)
and a `ConnectionStats` that `proxy.stages.connection_stats` keeps. `ConnectionInventory` samples
those counters about once a second (`tick`) and, when asked, freezes each connection into a
`ConnectionInfo` with its rates over the last window. It holds no secret: nothing of a SASL
exchange but the principal it authenticated reaches the context.

JSON (one object per connection; `worker` is the `--workers N` index, null for a lone process):

    {"window_ms": 10000, "connections": [{"id": 7, "worker": null, "listener": "broker 1", ...}]}
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from proxy.flow.pipeline import ConnectionContext
from proxy.pumps.muting import ChannelMuteState
from quotas.clock import Clock

DEFAULT_WINDOW_MS = 10_000
SAMPLE_INTERVAL_MS = 1_000


class LiveConnection(Protocol):
    """What the inventory reads of a connection (`proxy.pumps.connection.ClientConnection`)."""

    @property
    def ctx(self) -> ConnectionContext: ...

    @property
    def in_flight(self) -> int: ...

    @property
    def mute_state(self) -> ChannelMuteState: ...


class TokenSource(Protocol):
    """`proxy.config.ConnectionsEndpointConfig` as seen from here."""

    @property
    def enabled(self) -> bool: ...

    def token(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class QuotaMatch:
    """The configured entity whose value applied to the connection's latest request of `kind`."""

    kind: str                               # producer_byte_rate, request_rate, ...
    entity: tuple[tuple[str, str | None], ...]  # Kafka's entity components; None = <default>


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """One connection at one moment."""

    id: int
    worker: int | None
    listener: str
    broker_id: int | None
    client_address: str
    principal: str
    client_id: str | None
    client_software_name: str | None
    client_software_version: str | None
    connected_since: str                    # ISO 8601, UTC
    connected_ms: int
    in_flight: int
    window_ms: int                          # what the rates below cover (shorter for young connections)
    requests_per_s: float
    produce_requests_per_s: float
    produce_bytes_per_s: float
    fetch_requests_per_s: float
    fetch_bytes_per_s: float
    throttle_ms: int                        # throttle time told to the client within the window
    muted: bool
    mute_state: str
    quota: tuple[QuotaMatch, ...]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["quota"] = [{"kind": q.kind, "entity": dict(q.entity)} for q in self.quota]
        for key in ("requests_per_s", "produce_requests_per_s", "produce_bytes_per_s",
                    "fetch_requests_per_s", "fetch_bytes_per_s"):
            out[key] = round(out[key], 3)
        return out


class ConnectionInventory:
    """Snapshots of `connections` (the live set) with rates over `window_ms`."""

    def __init__(self, connections: Callable[[], Collection[LiveConnection]], clock: Clock,
                 worker: int | None = None, window_ms: int = DEFAULT_WINDOW_MS,
                 wall_clock_s: Callable[[], float] = time.time) -> None:
        self._connections = connections
        self._clock = clock
        self._wall_clock_s = wall_clock_s
        self.worker = worker
        self.window_ms = window_ms

    def tick(self) -> None:
        """Sample every connection's counters (the server calls this every `SAMPLE_INTERVAL_MS`)."""
        now_ms = self._clock.now_ms()
        for conn in list(self._connections()):
            conn.ctx.stats.sample(now_ms, self.window_ms)

    def snapshot(self) -> list[ConnectionInfo]:
        now_ms = self._clock.now_ms()
        wall_ms = int(self._wall_clock_s() * 1000)
        infos = [self._info(conn, now_ms, wall_ms) for conn in list(self._connections())]
        infos.sort(key=lambda i: i.id)
        return infos

    def _info(self, conn: LiveConnection, now_ms: int, wall_ms: int) -> ConnectionInfo:
        ctx = conn.ctx
        stats = ctx.stats
        rates = stats.window(now_ms, self.window_ms)
        age_ms = max(0, now_ms - stats.opened_ms)
        since = datetime.fromtimestamp((wall_ms - age_ms) / 1000, UTC)
        state = conn.mute_state
        quota = tuple(QuotaMatch(kind.value, tuple(entity.to_kafka()))
                      for kind, entity in sorted(stats.quota_entities.items(), key=lambda kv: kv[0].value))
        return ConnectionInfo(
            id=ctx.connection_id, worker=self.worker, listener=ctx.listener, broker_id=ctx.broker_id,
            client_address=ctx.client_address, principal=ctx.principal, client_id=stats.client_id,
            client_software_name=ctx.client_software_name,
            client_software_version=ctx.client_software_version,
            connected_since=since.isoformat(timespec="seconds").replace("+00:00", "Z"),
            connected_ms=age_ms, in_flight=conn.in_flight, window_ms=rates.window_ms,
            requests_per_s=rates.requests_per_s, produce_requests_per_s=rates.produce_requests_per_s,
            produce_bytes_per_s=rates.produce_bytes_per_s, fetch_requests_per_s=rates.fetch_requests_per_s,
            fetch_bytes_per_s=rates.fetch_bytes_per_s, throttle_ms=rates.throttle_ms,
            muted=state is not ChannelMuteState.NOT_MUTED, mute_state=state.value, quota=quota)

    def render(self) -> bytes:
        """The `GET /connections` body."""
        return render_json(self.window_ms, [i.to_json() for i in self.snapshot()])


def render_json(window_ms: int, connections: Iterable[dict[str, Any]]) -> bytes:
    return (json.dumps({"window_ms": window_ms, "connections": list(connections)}, indent=1) + "\n").encode()


def merge_workers(window_ms: int, bodies: dict[int, bytes | str | None]) -> bytes:
    """The supervisor's `GET /connections`: every worker's list, each entry naming its `worker`;
    a worker that did not answer is listed in `unavailable_workers`."""
    out: list[dict[str, Any]] = []
    missing: list[int] = []
    for index in sorted(bodies):
        body = bodies[index]
        try:
            data = json.loads(body) if body is not None else None
        except ValueError:
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("connections"), list):
            missing.append(index)
            continue
        out.extend({**conn, "worker": index} for conn in data["connections"] if isinstance(conn, dict))
    doc: dict[str, Any] = {"window_ms": window_ms, "connections": out}
    if missing:
        doc["unavailable_workers"] = missing
    return (json.dumps(doc, indent=1) + "\n").encode()


class BearerToken:
    """Checks an ``Authorization: Bearer <token>`` header in constant time (`hmac.compare_digest`).
    Its repr never shows the token."""

    __slots__ = ("_token",)

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("empty token")
        self._token = token.encode()

    @classmethod
    def configured(cls, endpoint: TokenSource) -> BearerToken | None:
        """The token `GET /connections` requires, or None (disabled, or no token configured)."""
        if not endpoint.enabled:
            return None
        token = endpoint.token()  # checked when the configuration was loaded
        return None if token is None else cls(token)

    def allows(self, authorization: str | None) -> bool:
        if authorization is None:
            return False
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(value.strip().encode(), self._token)

    def header(self) -> str:
        """The header value that passes (the supervisor asking its workers)."""
        return f"Bearer {self._token.decode()}"

    def __repr__(self) -> str:
        return "BearerToken(***)"
