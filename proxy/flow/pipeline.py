"""What happens to one request and its response, apart from moving bytes.

The connection (`proxy.pumps.connection`) frames bytes and keeps order; the pipeline decides. It is a
short list of stages, each with one job, called in order:

    on_request(ctx, entry, header, payload) -> a RequestOutcome or None (no say)
    on_response(ctx, entry, payload)        -> a ResponseOutcome or None (no say)
    on_complete(ctx, entry, sent_ms)        -> after the response left (access log, metrics)

Outcomes are frozen values; the pipeline combines them by fixed rules, so stage order decides
nothing but which stage sees which payload first:

- requests: `Close` beats an answer (`AnswerHere`, `AnswerLater`; the first stage to answer wins),
  which beats `Forward`. A `Forward` with a payload replaces the client's bytes for the stages after
  it and for the broker. The throttle is the largest any stage asked for.
- responses: each stage sees the payload the previous ones produced; the throttle is the largest;
  `replaced` (the broker's response is not what the client gets) sticks once set.

Data one stage leaves for a later one travels in typed slots of the in-flight entry
(`proxy.flow.inflight.InFlight`). Before any response stage runs, the pipeline keeps the broker's
response in `entry.broker_response` (a reference, no copy): whoever needs the broker's own
throttle_time_ms reads it there (`broker_throttle_ms`), whatever stage patched the payload first.

A stage never sees a socket; it gets a `ConnectionContext` and the frame's bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from protocol.errors import ProtocolError
from protocol.headers import RequestHeader
from protocol.throttle import read_throttle_time_ms
from proxy.flow.connection_stats import ConnectionStats
from proxy.flow.inflight import InFlight


@dataclass(slots=True)
class ConnectionContext:
    """What a stage may know about the connection a request came on."""

    connection_id: int
    client_address: str
    listener: str                       # "bootstrap" or "broker N"
    broker_id: int | None
    principal: str = "ANONYMOUS"
    client_software_name: str | None = None
    client_software_version: str | None = None
    stats: ConnectionStats = field(default_factory=ConnectionStats)  # the connection inventory's
    # Sluice's own request (a payload, no size prefix) on this connection's upstream, authenticated
    # as the client: a future of the broker's response, or None when it cannot be sent now
    # (`proxy.pumps.connection.ClientConnection.send_own`); None when the connection offers none
    send_own: Callable[[bytes], asyncio.Future[bytes] | None] | None = None


# ---------------------------------------------------------------------- request outcomes


@dataclass(frozen=True, slots=True)
class Forward:
    """Send the request on to the broker: the client's bytes, or `payload` instead."""

    payload: bytes | None = None
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class AnswerHere:
    """Sluice answers the request itself with `response` (a response payload, no size prefix)."""

    response: bytes
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class AnswerLater:
    """Sluice answers the request itself once `pending` is done (e.g. after a write); the requests
    after it wait their turn. A failed or cancelled future closes the connection."""

    pending: asyncio.Future[bytes]
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class Close:
    """Close the client connection, with `reason` logged."""

    reason: str
    throttle_time_ms: int = 0


RequestOutcome = Forward | AnswerHere | AnswerLater | Close

FORWARD = Forward()
"""Forward the client's bytes, no throttle: what the pipeline says when no stage says anything."""


def _request_rank(outcome: RequestOutcome) -> int:
    if isinstance(outcome, Forward):
        return 0
    if isinstance(outcome, Close):
        return 2
    return 1


def combine_request(first: RequestOutcome, then: RequestOutcome) -> RequestOutcome:
    """`first` (the stages so far) combined with a later stage's `then`, by the rules above."""
    throttle_ms = max(first.throttle_time_ms, then.throttle_time_ms)
    if isinstance(first, Forward) and isinstance(then, Forward):
        payload = then.payload if then.payload is not None else first.payload
        if payload is then.payload and throttle_ms == then.throttle_time_ms:
            return then
        return Forward(payload, throttle_ms)
    winner = then if _request_rank(then) > _request_rank(first) else first
    if winner.throttle_time_ms == throttle_ms:
        return winner
    return replace(winner, throttle_time_ms=throttle_ms)


# ---------------------------------------------------------------------- response outcomes


class StreamTail(Protocol):
    """Holds back and rewrites the end of a streamed response, its length unchanged (the size
    prefix has gone out): the leader endpoints of a Fetch v16+ (`proxy.stages.addresses`)."""

    def feed(self, chunk: bytes | bytearray | memoryview) -> int:
        """Sees the next bytes (the head first); returns how many leading ones may go out now."""
        ...

    def finish(self) -> bytes:
        """After the last chunk: the held bytes, rewritten, to send last."""
        ...


@dataclass(frozen=True, slots=True)
class ResponseOutcome:
    """`payload` is what goes to the client. A stage given only the head of a streamed response
    patches bytes in place (same length), sets `replaced` to send `payload` instead of the
    broker's response (the rest of which is then discarded), or sets `tail` to rewrite the end of
    the response as it streams. `throttle_time_ms` > 0 mutes the channel (a throttle decided now,
    at response time)."""

    payload: bytes
    throttle_time_ms: int = 0
    replaced: bool = False
    tail: StreamTail | None = None


def combine_response(first: ResponseOutcome, then: ResponseOutcome) -> ResponseOutcome:
    throttle_ms = max(first.throttle_time_ms, then.throttle_time_ms)
    replaced = first.replaced or then.replaced
    tail = then.tail or first.tail
    if then.throttle_time_ms == throttle_ms and then.replaced == replaced and then.tail is tail:
        return then
    return ResponseOutcome(then.payload, throttle_ms, replaced, tail)


# ---------------------------------------------------------------------- stages


class Stage(Protocol):
    def on_request(self, ctx: ConnectionContext, entry: InFlight, header: RequestHeader,
                   payload: bytes) -> RequestOutcome | None: ...

    def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome | None:
        ...

    def on_complete(self, ctx: ConnectionContext, entry: InFlight, sent_ms: int) -> None: ...


class StageBase:
    """No-op defaults, so a stage implements only the hooks it needs.

    `handles` lets a stage say which requests a hook can have a say on: the pipeline asks it once
    per (hook, API key, version) and leaves the stage out of that hook for the requests it answers
    False for. The answer may depend on nothing else (it is cached): a stage whose interest changes
    at run time keeps answering True and decides in the hook."""

    def handles(self, hook: str, api_key: int, api_version: int) -> bool:
        return True

    def on_request(self, ctx: ConnectionContext, entry: InFlight, header: RequestHeader,
                   payload: bytes) -> RequestOutcome | None:
        return None

    def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome | None:
        return None

    def on_complete(self, ctx: ConnectionContext, entry: InFlight, sent_ms: int) -> None:
        return None


def _implements(stage: Stage, hook: str) -> bool:
    method = getattr(type(stage), hook, None)
    return method is not None and method is not getattr(StageBase, hook)


def _handles(stage: Stage, hook: str, api_key: int, api_version: int) -> bool:
    handles = getattr(stage, "handles", None)
    return handles is None or bool(handles(hook, api_key, api_version))


RequestHook = Callable[[ConnectionContext, InFlight, RequestHeader, bytes], RequestOutcome | None]
ResponseHook = Callable[[ConnectionContext, InFlight, bytes], ResponseOutcome | None]
CompleteHook = Callable[[ConnectionContext, InFlight, int], None]


@dataclass(frozen=True, slots=True)
class Route:
    """The stages of each hook that can have a say on one API key and version, bound once."""

    on_request: tuple[RequestHook, ...]
    on_response: tuple[ResponseHook, ...]
    on_complete: tuple[CompleteHook, ...]


#: Routes a pipeline keeps (a client may send any int16 key and version; beyond this it starts over).
MAX_ROUTES = 4096


def broker_throttle_ms(entry: InFlight) -> int | None:
    """The broker's throttle_time_ms in its response to `entry`; None if it has none or unreadable."""
    if entry.broker_response is None:
        return None
    try:
        return read_throttle_time_ms(entry.broker_response, entry.api_key, entry.api_version)
    except ProtocolError:
        return None


class Pipeline:
    """Calls, per hook, only the stages that implement it and handle the request's API key and
    version (this runs for every request: the stages of each key and version are found once)."""

    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages = list(stages)
        self._on_request = [s for s in self.stages if _implements(s, "on_request")]
        self._on_response = [s for s in self.stages if _implements(s, "on_response")]
        self._on_complete = [s for s in self.stages if _implements(s, "on_complete")]
        self._routes: dict[int, Route] = {}

    def route(self, api_key: int, api_version: int) -> Route:
        """The stages of every hook for requests of `api_key` v`api_version` (the hooks below look
        the route up themselves, so that a known one costs a dict lookup, not a call)."""
        key = ((api_key & 0xFFFF) << 16) | (api_version & 0xFFFF)
        route = self._routes.get(key)
        if route is None:
            route = Route(
                tuple(s.on_request for s in self._on_request
                      if _handles(s, "on_request", api_key, api_version)),
                tuple(s.on_response for s in self._on_response
                      if _handles(s, "on_response", api_key, api_version)),
                tuple(s.on_complete for s in self._on_complete
                      if _handles(s, "on_complete", api_key, api_version)))
            if len(self._routes) >= MAX_ROUTES:
                self._routes.clear()
            self._routes[key] = route
        return route

    def on_request(self, ctx: ConnectionContext, entry: InFlight, header: RequestHeader,
                   payload: bytes) -> RequestOutcome:
        outcome: RequestOutcome | None = None
        route = self._routes.get(((header.api_key & 0xFFFF) << 16) | (header.api_version & 0xFFFF))
        if route is None:
            route = self.route(header.api_key, header.api_version)
        for on_request in route.on_request:
            said = on_request(ctx, entry, header, payload)
            if said is None:
                continue
            outcome = said if outcome is None else combine_request(outcome, said)
            if isinstance(outcome, Forward) and outcome.payload is not None:
                payload = outcome.payload  # later stages see what will be forwarded
        return FORWARD if outcome is None else outcome

    def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome:
        entry.broker_response = payload
        outcome: ResponseOutcome | None = None
        route = self._routes.get(((entry.api_key & 0xFFFF) << 16) | (entry.api_version & 0xFFFF))
        if route is None:
            route = self.route(entry.api_key, entry.api_version)
        for on_response in route.on_response:
            said = on_response(ctx, entry, payload)
            if said is None:
                continue
            outcome = said if outcome is None else combine_response(outcome, said)
            payload = said.payload
        return ResponseOutcome(payload) if outcome is None else outcome

    def on_complete(self, ctx: ConnectionContext, entry: InFlight, sent_ms: int) -> None:
        route = self._routes.get(((entry.api_key & 0xFFFF) << 16) | (entry.api_version & 0xFFFF))
        if route is None:
            route = self.route(entry.api_key, entry.api_version)
        for on_complete in route.on_complete:
            on_complete(ctx, entry, sent_ms)
