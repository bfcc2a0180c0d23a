"""What happens to one request and its response, apart from moving bytes.

The connection (`proxy.pumps.connection`) frames bytes and keeps order; the pipeline decides. It is a
short list of stages, each with one job, called in order:

    on_request(ctx, header, payload)   -> RequestVerdict: forward it, or answer it here; throttle?
    on_response(ctx, entry, payload)   -> the payload to send (rewritten/patched) and a throttle
    on_complete(ctx, entry)            -> after the response left (access log, metrics)

A stage never sees a socket; it gets a `ConnectionContext` and the frame's bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from protocol.headers import RequestHeader
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


@dataclass(slots=True)
class RequestVerdict:
    """A stage's say on a request. `throttle_time_ms` > 0 mutes the channel from now on."""

    local_response: bytes | None = None       # answer it here instead of forwarding
    pending_response: asyncio.Future[bytes] | None = None  # answer it here, later (e.g. after a write)
    throttle_time_ms: int = 0
    forward_payload: bytes | None = None      # forward this instead of the client's bytes
    notes: dict[str, object] = field(default_factory=dict)

    def merge(self, other: RequestVerdict) -> None:
        if other.local_response is not None:
            self.local_response = other.local_response
        if other.pending_response is not None:
            self.pending_response = other.pending_response
        if other.forward_payload is not None:
            self.forward_payload = other.forward_payload
        self.throttle_time_ms = max(self.throttle_time_ms, other.throttle_time_ms)
        self.notes.update(other.notes)


@dataclass(slots=True)
class ResponseOutcome:
    """`payload` is what goes to the client. A stage given only the head of a streamed response
    patches bytes in place (same length) or sets `replaced` to send `payload` instead of the
    broker's response (the rest of which is then discarded)."""

    payload: bytes
    throttle_time_ms: int = 0
    replaced: bool = False


class Stage(Protocol):
    def on_request(self, ctx: ConnectionContext, header: RequestHeader, payload: bytes,
                   expects_response: bool) -> RequestVerdict | None: ...

    def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome | None:
        ...

    def on_complete(self, ctx: ConnectionContext, entry: InFlight, sent_ms: int) -> None: ...


class StageBase:
    """No-op defaults, so a stage implements only the hooks it needs."""

    def on_request(self, ctx: ConnectionContext, header: RequestHeader, payload: bytes,
                   expects_response: bool) -> RequestVerdict | None:
        return None

    def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome | None:
        return None

    def on_complete(self, ctx: ConnectionContext, entry: InFlight, sent_ms: int) -> None:
        return None


def _implements(stage: Stage, hook: str) -> bool:
    method = getattr(type(stage), hook, None)
    return method is not None and method is not getattr(StageBase, hook)


NO_VERDICT = RequestVerdict()
"""Shared answer when no stage has anything to say: its `notes` must never be written to."""


class Pipeline:
    """Calls, per hook, only the stages that implement it (this runs for every request)."""

    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages = list(stages)
        self._on_request = [s for s in self.stages if _implements(s, "on_request")]
        self._on_response = [s for s in self.stages if _implements(s, "on_response")]
        self._on_complete = [s for s in self.stages if _implements(s, "on_complete")]

    def on_request(self, ctx: ConnectionContext, header: RequestHeader, payload: bytes,
                   expects_response: bool) -> RequestVerdict:
        verdict: RequestVerdict | None = None
        for stage in self._on_request:
            said = stage.on_request(ctx, header, payload, expects_response)
            if said is not None:
                if verdict is None:
                    verdict = said
                else:
                    verdict.merge(said)
        return NO_VERDICT if verdict is None else verdict

    def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome:
        outcome: ResponseOutcome | None = None
        for stage in self._on_response:
            said = stage.on_response(ctx, entry, payload if outcome is None else outcome.payload)
            if said is not None:
                if outcome is not None:
                    said.throttle_time_ms = max(outcome.throttle_time_ms, said.throttle_time_ms)
                    said.replaced = said.replaced or outcome.replaced
                outcome = said
        return ResponseOutcome(payload) if outcome is None else outcome

    def on_complete(self, ctx: ConnectionContext, entry: InFlight, sent_ms: int) -> None:
        for stage in self._on_complete:
            stage.on_complete(ctx, entry, sent_ms)
