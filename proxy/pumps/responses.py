"""Responses to the client, in the order their requests came.

A Kafka client may pipeline requests on one connection and the broker answers them in order; so
must Sluice, also when a stage answers a request itself (at once or later) while earlier ones
still wait for the broker. `ResponseOrder` is that half of a client connection: it matches each
broker response to its in-flight slot, runs the response stages on it once (the one place they
run, for whole responses and for the head of a streamed Fetch), starts the throttle they ask for,
and writes every response whose turn has come. What happens after a write (a mute that may have
ended, frames waiting, a drain that may end between requests) is the `ReadGate`'s and the connection's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final, cast

from contracts.compiled import choose
from protocol.apis import api_name
from protocol.errors import ProtocolError
from protocol.fastpath import read_response_correlation_id
from protocol.framing import FrameSplitter
from protocol.sasl import SASL_API_KEYS
from proxy.flow.inflight import CorrelationMismatch, InFlight, InFlightRequests
from proxy.flow.pipeline import ConnectionContext, Pipeline, ResponseOutcome
from proxy.pumps.read_gate import ReadGate
from proxy.pumps.sasl_mode import SaslMode
from proxy.pumps.throttle_timer import ThrottleTimer
from quotas.clock import Clock


class ResponseOrder:
    """One connection's responses: matched, passed through the response stages, written in order."""

    __slots__ = ("_clock", "_close", "_ctx", "_gate", "_inflight", "_is_closed", "_pipeline", "_read_on",
                 "_send", "_splitter", "_start_throttle", "_throttle", "_upstream_name", "sasl")

    def __init__(self, ctx: ConnectionContext, pipeline: Pipeline, clock: Clock, inflight: InFlightRequests,
                 throttle: ThrottleTimer, gate: ReadGate, splitter: FrameSplitter, upstream_name: str, *,
                 send: Callable[[bytes], None], start_throttle: Callable[[int, int], None],
                 read_on: Callable[[], None], close: Callable[[str | None], None],
                 is_closed: Callable[[], bool]) -> None:
        self._ctx, self._pipeline, self._clock, self._inflight = ctx, pipeline, clock, inflight
        self._throttle, self._gate, self._splitter = throttle, gate, splitter
        self._upstream_name = upstream_name
        self._send, self._start_throttle, self._read_on = send, start_throttle, read_on
        self._close, self._is_closed = close, is_closed
        self.sasl: SaslMode | None = None  # set by the connection at its first SASL request

    def on_broker_frame(self, payload: bytes) -> None:
        """A whole response from the broker: the oldest forwarded request's."""
        try:
            entry = self._inflight.match_upstream(read_response_correlation_id(payload))
        except (ProtocolError, CorrelationMismatch) as exc:
            self._close(f"bad response from {self._upstream_name}: {exc}")
            return
        if entry.own is not None:  # Sluice's own request: its answer goes to Sluice, not to the client
            if not entry.own.done():
                entry.own.set_result(payload)
            entry.response = b""
            self.flush()
            return
        if self.sasl is not None and entry.api_key in SASL_API_KEYS:
            self.sasl.on_response(entry, payload)
        outcome = self.run_stages(entry, payload, len(payload))
        entry.response = outcome.payload
        entry.response_bytes = len(outcome.payload)
        self.flush()

    def run_stages(self, entry: InFlight, payload: bytes, size: int) -> ResponseOutcome:
        """The response stages on `payload` (a whole response of `size` bytes, or a streamed one's head)."""
        now_ms = self._clock.now_ms()
        entry.response_received_ms = now_ms
        entry.upstream_response_bytes = size
        outcome = self._pipeline.on_response(self._ctx, entry, payload)
        if outcome.throttle_time_ms > 0:
            self._start_throttle(now_ms, outcome.throttle_time_ms)
            entry.mutes_channel = True
        if entry.delay_from_response_ms > 0 and entry.mutes_channel:
            self._throttle.extend(now_ms, entry.delay_from_response_ms)
        return outcome

    def answer_later(self, entry: InFlight, pending: asyncio.Future[bytes]) -> None:
        """A stage answers this request itself once `pending` is done; later requests wait their turn."""
        def done(future: asyncio.Future[bytes]) -> None:
            if self._is_closed():
                return
            if future.cancelled() or future.exception() is not None:
                self._close(f"Sluice could not answer {api_name(entry.api_key)}: "
                            f"{'cancelled' if future.cancelled() else future.exception()!r}")
                return
            entry.answer(future.result(), self._clock.now_ms())
            self.flush()

        pending.add_done_callback(done)

    def flush(self) -> None:
        """Write the responses at the head whose turn has come; then read on (which also ends a drain)."""
        send, ctx, on_complete, clock = self._send, self._ctx, self._pipeline.on_complete, self._clock
        sent_any = False
        slots = self._inflight.queue  # `InFlightRequests.ready`, without the generator's two calls
        while slots and slots[0].response is not None:
            entry = slots.popleft()
            response = entry.response
            assert response is not None
            if entry.own is not None:  # never the client's: nothing is sent, nothing completes
                entry.response = None
                sent_any = True  # a slot is free all the same: the gate may let frames on
                continue
            if not entry.streamed:
                send(response)
            entry.response = None
            if entry.mutes_channel:
                self._throttle.response_sent()
            on_complete(ctx, entry, clock.now_ms())
            sent_any = True
        gate = self._gate
        if sent_any and (gate.paused or gate.draining or self._splitter.buffered_bytes):
            self._read_on()  # a response left: a mute may have ended, frames wait, or a drain may end


_CHOICE: Final = choose("proxy.pumps._speedups", ("ResponseOrder", "RequestReader", "FetchStream"))
COMPILED_MODULE: Final = _CHOICE.compiled_module
"""proxy.pumps._speedups if it was built (whatever SLUICE_PURE_PYTHON says: the tests use both), else None."""
IMPLEMENTATION: Final = _CHOICE.implementation
describe: Final = _CHOICE.describe

# The compiled class has the reference's constructor, methods and effects (tests/unit/differential).
ResponseOrderImpl: Final = cast(type[ResponseOrder],
                                ResponseOrder if _CHOICE.active is None else _CHOICE.active.ResponseOrder)
COMPILED_REQUESTS: Final = _CHOICE.active
"""The same module for `ClientConnection`'s request side (`RequestReader`) and its `FetchStream`, or
None: the references run."""
