"""`ResponseOrder`: a connection's responses, in request order, over a fake clock and recorded writes
(the connection around it: `test_connection.py`)."""

from __future__ import annotations

import asyncio
import struct

import pytest

from protocol.apis import ApiKey
from protocol.framing import FrameSplitter
from proxy.flow.connection_stats import ConnectionStats
from proxy.flow.inflight import InFlight, InFlightRequests
from proxy.flow.pipeline import ConnectionContext, Pipeline, ResponseOutcome, StageBase
from proxy.pumps.limits import LimitLog
from proxy.pumps.read_gate import ReadGate
from proxy.pumps.responses import ResponseOrder
from proxy.pumps.throttle_timer import ThrottleTimer
from quotas.clock import FakeClock
from tests.unit.proxy.test_connection import FakeTimers


class ThrottleEvery(StageBase):
    """A response stage that asks for `throttle_ms` on every response and marks the payload."""

    def __init__(self, throttle_ms: int) -> None:
        self.throttle_ms = throttle_ms
        self.completed: list[int] = []

    def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome:
        return ResponseOutcome(payload + b"!", self.throttle_ms)

    def on_complete(self, ctx: ConnectionContext, entry: InFlight, sent_ms: int) -> None:
        self.completed.append(entry.correlation_id)


class Parts:
    def __init__(self, throttle_ms: int = 0) -> None:
        self.clock = FakeClock(1_000)
        self.timers = FakeTimers(self.clock)
        self.stage = ThrottleEvery(throttle_ms)
        self.inflight = InFlightRequests()
        self.splitter = FrameSplitter(1024)
        self.read_ons = 0
        self.throttle = ThrottleTimer(self.clock, self.timers.call_later, self.read_on)
        ctx = ConnectionContext(3, "127.0.0.1:5000", "broker 1", 1, stats=ConnectionStats(1_000))
        self.gate = ReadGate(self.throttle.mute, self.splitter, self.inflight.queue, 5, ctx, LimitLog(),
                             self.timers.call_later, lambda: None)
        self.sent: list[bytes] = []
        self.throttles: list[tuple[int, int]] = []
        self.closes: list[str | None] = []
        self.closed = False
        self.order = ResponseOrder(ctx, Pipeline([self.stage]), self.clock, self.inflight, self.throttle,
                                   self.gate, self.splitter, "broker 1", send=self.sent.append,
                                   start_throttle=self.start_throttle, read_on=self.read_on,
                                   close=self.closes.append, is_closed=lambda: self.closed)

    def read_on(self) -> None:
        self.read_ons += 1

    def start_throttle(self, now_ms: int, throttle_ms: int) -> None:
        self.throttles.append((now_ms, throttle_ms))
        self.throttle.start(now_ms, throttle_ms)

    def request(self, correlation_id: int) -> InFlight:
        return self.inflight.add(InFlight(correlation_id, ApiKey.METADATA, 12, "c", 20, self.clock.now_ms()))


def response(correlation_id: int, body: bytes = b"") -> bytes:
    return struct.pack(">i", correlation_id) + body   # correlation id, then the body as the broker sent it


def test_a_broker_response_goes_out_through_the_stages_and_completes_its_request() -> None:
    parts = Parts()
    entry = parts.request(1)
    parts.clock.advance(7)
    parts.order.on_broker_frame(response(1, b"ab"))
    assert parts.sent == [response(1, b"ab!")]             # the stage's payload, not the broker's
    assert entry.upstream_response_bytes == 6 and entry.response_bytes == 7   # 4 + 2, then + b"!"
    assert entry.response_received_ms == 1_007
    assert parts.stage.completed == [1] and len(parts.inflight) == 0


def test_an_answer_here_waits_for_the_broker_response_of_an_earlier_request() -> None:
    parts = Parts()
    parts.request(1)
    second = parts.request(2)
    second.answer(response(2, b"own"), parts.clock.now_ms())   # a stage answered request 2 itself
    parts.order.flush()
    assert parts.sent == []                                # request 1 has not been answered yet
    parts.order.on_broker_frame(response(1))
    assert parts.sent == [response(1, b"!"), response(2, b"own")]
    assert parts.stage.completed == [1, 2]


def test_a_response_for_another_correlation_id_closes_the_connection_with_the_reason() -> None:
    parts = Parts()
    parts.request(1)
    parts.order.on_broker_frame(response(9))
    assert parts.sent == [] and len(parts.closes) == 1
    assert parts.closes[0] is not None and "bad response from broker 1" in parts.closes[0]
    assert "9" in parts.closes[0]


def test_a_throttle_asked_for_at_response_time_mutes_until_that_response_is_sent() -> None:
    parts = Parts(throttle_ms=250)
    entry = parts.request(1)
    outcome = parts.order.run_stages(entry, response(1), 4)
    assert outcome.throttle_time_ms == 250 and parts.throttles == [(1_000, 250)]
    assert entry.mutes_channel and not parts.throttle.mute.reading_allowed
    entry.response = outcome.payload
    parts.order.flush()                                    # the throttled response went out: RESPONSE_SENT
    assert parts.sent == [response(1, b"!")]
    parts.timers.advance(250)                              # then the delay ends: reading resumes
    assert parts.throttle.mute.reading_allowed


def test_a_write_reads_on_only_when_frames_wait_or_the_socket_is_paused() -> None:
    parts = Parts()
    parts.request(1)
    parts.order.on_broker_frame(response(1))
    assert parts.read_ons == 0                             # nothing buffered, nothing paused
    parts.request(2)
    parts.splitter.feed(struct.pack(">i", 3) + b"abc")     # a client frame waits
    parts.order.on_broker_frame(response(2))
    assert parts.read_ons == 1


def test_a_draining_connection_reads_on_after_each_response() -> None:
    parts = Parts()
    parts.request(1)
    parts.request(2)
    parts.gate.draining = True
    parts.order.on_broker_frame(response(1))
    assert parts.read_ons == 1 and parts.closes == []      # the connection closes, between requests
    parts.order.on_broker_frame(response(2))
    assert parts.read_ons == 2 and parts.closes == []


async def callbacks_ran(future: asyncio.Future[bytes], timeout_s: float = 5.0) -> None:
    """Until the future's done callbacks have run: they run in the order they were added, so once
    one added now has run, ResponseOrder's has too (a deadline, not a fixed wait)."""
    ran = asyncio.Event()
    future.add_done_callback(lambda _: ran.set())
    await asyncio.wait_for(ran.wait(), timeout_s)


async def test_an_answer_later_goes_out_in_turn_and_a_failed_one_closes_with_the_reason() -> None:
    parts = Parts()
    first = parts.request(1)
    first.forwarded = False
    pending: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    parts.order.answer_later(first, pending)
    pending.set_result(response(1, b"later"))
    await callbacks_ran(pending)
    assert parts.sent == [response(1, b"later")]

    second = parts.request(2)
    failing: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    parts.order.answer_later(second, failing)
    failing.set_exception(RuntimeError("store down"))
    await callbacks_ran(failing)
    assert parts.closes == ["Sluice could not answer Metadata: RuntimeError('store down')"]


async def test_an_answer_that_comes_after_the_connection_closed_is_dropped() -> None:
    parts = Parts()
    entry = parts.request(1)
    pending: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    parts.order.answer_later(entry, pending)
    parts.closed = True
    pending.set_result(response(1))
    await callbacks_ran(pending)
    assert parts.sent == [] and parts.closes == []


@pytest.mark.parametrize("streamed", [False, True])
def test_a_streamed_response_is_completed_without_being_written_again(streamed: bool) -> None:
    parts = Parts()
    entry = parts.request(1)
    entry.response, entry.streamed = b"", streamed         # FetchStream wrote it piece by piece
    if not streamed:
        entry.response = response(1, b"whole")
    parts.order.flush()
    assert parts.sent == ([] if streamed else [response(1, b"whole")])
    assert parts.stage.completed == [1]
