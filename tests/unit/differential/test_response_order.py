"""A connection's response side, compiled (`proxy.pumps._speedups.ResponseOrder`) against its
readable reference (`proxy.pumps.responses.ResponseOrder`, with `Pipeline.on_response` and
`Pipeline.on_complete`).

Two properties, each fed the same random events and the same fake clock on both twins:

* **The response order alone**, with scripted stages: requests forwarded, answered here, answered
  later (a future) and Sluice's own; broker responses for the right correlation id, the wrong one,
  or too short to hold one; stages that say nothing, patch the payload, replace it, ask for a
  throttle or a delay past the response; a client frame buffered, the socket paused, a drain; the
  clock stepping and the throttle's timers firing. Everything observable must be the reference's:
  the frames written, the throttles started, the closes and their reasons, the read-ons, each
  completion (stage, correlation id, time), each in-flight entry's slots after every event, own
  requests' results, the mute. Run through a `Pipeline` (the compiled twin reads its routes
  itself) and through another pipeline object (it calls its hooks).
* **A real `ClientConnection` with the quota stage** (a produce budget and a request-time
  budget, small enough to throttle, over Kafka's windowed rate) and a stage recording each
  completed request's row: the same client byte stream (Produce v8 and Metadata, pipelined) and
  the same broker responses and clock give the same bytes forwarded, the same responses to the
  client (their throttle_time_ms patched), the same verdicts (each request's quota decisions) and
  the same rows.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.apis import ApiKey
from protocol.framing import FrameSplitter
from proxy.flow.connection_stats import ConnectionStats
from proxy.flow.inflight import InFlight, InFlightRequests
from proxy.flow.pipeline import ConnectionContext, Pipeline, ResponseOutcome, StageBase
from proxy.pumps import connection as connection_module
from proxy.pumps import responses
from proxy.pumps.connection import ClientConnection, ConnectionServices
from proxy.pumps.limits import LimitLog
from proxy.pumps.read_gate import ReadGate
from proxy.pumps.services import Upstream
from proxy.pumps.throttle_timer import ThrottleTimer
from proxy.pumps.upstreams import BrokerRegistry, UpstreamTarget
from proxy.stages.quota import QuotaStage
from quotas.clock import FakeClock
from quotas.config import QuotaConfig
from quotas.engine import QuotaEngine
from tests.unit.differential.impls import built
from tests.unit.proxy.test_connection import FakeTimers, FakeTransport, FakeUpstream, run_ready_callbacks


def twins() -> tuple[Any, Any]:
    """(the reference class, the compiled class)."""
    module = built(responses.COMPILED_MODULE, "proxy.pumps._speedups")
    return responses.ResponseOrder, module.ResponseOrder


# ----------------------------------------------------------------------------- the response order alone

# what a scripted stage does with one response: None (no say), or (suffix to add, throttle ms,
# replaced, delay past the response to set)
Say = tuple[bytes, int, bool, int] | None
says = st.one_of(st.none(), st.tuples(st.sampled_from([b"", b"!", b"??"]), st.sampled_from([0, 0, 5, 40]),
                                      st.booleans(), st.sampled_from([0, 0, 30])))


class ScriptedStage(StageBase):
    """Says its script's next item on each response (cycling) and logs each completion."""

    def __init__(self, index: int, script: list[Say], log: list[tuple[Any, ...]]) -> None:
        self.index, self.script, self.log, self.calls = index, script, log, 0

    def handles(self, hook: str, api_key: int, api_version: int) -> bool:
        return not (self.index == 1 and hook == "on_response" and api_key == ApiKey.API_VERSIONS)

    def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome | None:
        say = self.script[self.calls % len(self.script)]
        self.calls += 1
        self.log.append(("response", self.index, entry.correlation_id, bytes(payload)))
        if say is None:
            return None
        suffix, throttle_ms, replaced, delay_ms = say
        if delay_ms:
            entry.delay_from_response_ms = delay_ms
        return ResponseOutcome(payload + suffix, throttle_ms, replaced)

    def on_complete(self, ctx: ConnectionContext, entry: InFlight, sent_ms: int) -> None:
        self.log.append(("complete", self.index, entry.correlation_id, sent_ms))


class OtherPipeline:
    """Not a `Pipeline`: the compiled twin must call its hooks, not read its routes."""

    def __init__(self, inner: Pipeline) -> None:
        self.inner = inner

    def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome:
        return self.inner.on_response(ctx, entry, payload)

    def on_complete(self, ctx: ConnectionContext, entry: InFlight, sent_ms: int) -> None:
        self.inner.on_complete(ctx, entry, sent_ms)


@dataclass
class Rig:
    """One twin's response order, over its own clock, timers, in-flight queue and gate."""

    cls: Any
    scripts: list[list[Say]]
    plain: bool
    loop: asyncio.AbstractEventLoop
    log: list[tuple[Any, ...]] = field(default_factory=list)
    entries: list[InFlight] = field(default_factory=list)
    futures: dict[int, asyncio.Future[bytes]] = field(default_factory=dict)
    closed: bool = False

    def __post_init__(self) -> None:
        self.clock = FakeClock(1_000)
        self.timers = FakeTimers(self.clock)
        self.inflight = InFlightRequests()
        self.splitter = FrameSplitter(1024)
        self.throttle = ThrottleTimer(self.clock, self.timers.call_later,
                                      lambda: self.log.append(("unmuted",)))
        ctx = ConnectionContext(3, "127.0.0.1:5000", "broker 1", 1, stats=ConnectionStats(1_000))
        self.gate = ReadGate(self.throttle.mute, self.splitter, self.inflight.queue, 1000, ctx, LimitLog(),
                             self.timers.call_later, lambda: None)
        pipeline = Pipeline([ScriptedStage(i, s, self.log) for i, s in enumerate(self.scripts)])
        self.order = self.cls(ctx, pipeline if self.plain else OtherPipeline(pipeline), self.clock,
                              self.inflight, self.throttle, self.gate, self.splitter, "broker 1",
                              send=lambda p: self.log.append(("sent", bytes(p))),
                              start_throttle=self.start_throttle,
                              read_on=lambda: self.log.append(("read_on",)),
                              close=lambda reason: self.log.append(("close", reason)),
                              is_closed=lambda: self.closed)

    def start_throttle(self, now_ms: int, throttle_ms: int) -> None:
        self.log.append(("throttle", now_ms, throttle_ms))
        self.throttle.start(now_ms, throttle_ms)

    def apply(self, op: tuple[Any, ...], cid: int) -> None:
        """One event; a request gets correlation id `cid`."""
        kind = op[0]
        now = self.clock.now_ms()
        if kind == "request":
            _, api_key, how = op
            entry = InFlight(cid, api_key, 3 if api_key == ApiKey.API_VERSIONS else 8, "c", 20, now)
            if how == "own":
                entry.own = self.futures[cid] = self.loop.create_future()
            self.entries.append(self.inflight.add(entry))
            if how == "here":
                entry.answer(struct.pack(">i", cid) + b"here", now)
                self.order.flush()
            elif how == "later":
                entry.forwarded = False
                self.futures[cid] = future = self.loop.create_future()
                self.order.answer_later(entry, future)
        elif kind == "broker":
            _, which, body = op
            waiting = [e for e in self.inflight.queue if e.forwarded and e.response is None]
            if which == "short":
                frame = b"\x00\x01"
            elif which == "wrong" or not waiting:
                frame = struct.pack(">i", 99_999) + body
            else:
                frame = struct.pack(">i", waiting[0].correlation_id) + body
            self.order.on_broker_frame(frame)
        elif kind == "resolve":  # the oldest unresolved answer-later future
            for cid, future in self.futures.items():
                entry = next((e for e in self.entries if e.correlation_id == cid), None)
                if entry is not None and entry.own is None and not future.done():
                    future.set_result(struct.pack(">i", cid) + b"later")
                    self.loop.run_until_complete(asyncio.sleep(0))
                    break
        elif kind == "advance":
            self.timers.advance(op[1])
        elif kind == "buffer":
            self.splitter.feed(struct.pack(">i", 3) + b"abc")
        elif kind == "take":
            self.splitter.next_frame()
        elif kind == "pause":
            self.gate.paused = op[1]
        elif kind == "drain":
            self.gate.draining = True
        elif kind == "close":
            self.closed = True

    def state(self) -> tuple[Any, ...]:
        slots = tuple((e.correlation_id, e.forwarded, e.response, e.upstream_response_bytes, e.response_bytes,
                       e.response_received_ms, e.mutes_channel, e.delay_from_response_ms, e.broker_response)
                      for e in self.entries)
        owns = tuple((cid, f.done() and f.result()) for cid, f in sorted(self.futures.items())
                     if not f.cancelled() and (not f.done() or f.exception() is None))
        mute = self.throttle.mute
        return (tuple(self.log), slots, owns, len(self.inflight), mute.state, mute.deadline_ms,
                self.throttle.mute.reading_allowed, self.gate.paused, self.splitter.buffered_bytes)


ops = st.one_of(
    st.tuples(st.just("request"),
              st.sampled_from([ApiKey.PRODUCE, ApiKey.METADATA, ApiKey.API_VERSIONS]),
              st.sampled_from(["forward", "forward", "forward", "here", "later", "own"])),
    st.tuples(st.just("broker"), st.sampled_from(["right"] * 6 + ["wrong", "short"]),
              st.sampled_from([b"", b"body", b"x" * 100])),
    st.tuples(st.just("resolve")),
    st.tuples(st.just("advance"), st.sampled_from([1, 5, 30, 100])),
    st.tuples(st.just("buffer")), st.tuples(st.just("take")),
    st.tuples(st.just("pause"), st.booleans()), st.tuples(st.just("drain")),
    st.tuples(st.just("close")),
)


@pytest.mark.both_twins
@settings(max_examples=300, deadline=None)
@given(scripts=st.lists(st.lists(says, min_size=1, max_size=4), min_size=0, max_size=3),
       plain=st.booleans(), events=st.lists(ops, max_size=40))
def test_the_compiled_response_order_does_what_the_reference_does(
        scripts: list[list[Say]], plain: bool, events: list[tuple[Any, ...]]) -> None:
    reference, compiled = twins()
    loop = asyncio.new_event_loop()
    try:
        a, b = Rig(reference, scripts, plain, loop), Rig(compiled, scripts, plain, loop)
        for cid, op in enumerate(events, start=1):
            if op[0] == "take" and not a.splitter.buffered_bytes:
                continue
            a.apply(op, cid)
            b.apply(op, cid)
            assert b.state() == a.state(), op
        # run_stages alone (a streamed Fetch's head), on a fresh slot of each
        for rig in (a, b):
            entry = rig.inflight.add(InFlight(7, ApiKey.FETCH, 12, "c", 20, rig.clock.now_ms()))
            rig.entries.append(entry)
            outcome = rig.order.run_stages(entry, struct.pack(">i", 7) + b"head", 1_000)
            rig.log.append(("outcome", outcome))
        assert b.state() == a.state()
    finally:
        loop.close()


# ----------------------------------------------------------------------------- a real connection


class RowStage(StageBase):
    """The access log's view of each completed request: the fields its row is built from."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []

    def on_complete(self, ctx: ConnectionContext, entry: InFlight, sent_ms: int) -> None:
        quota = entry.quota
        verdicts = None if quota is None else (quota.enforced_ms, tuple(
            (d.kind, d.key, d.throttle_time_ms, d.would_throttle_ms, d.bound, d.shadow)
            for d in quota.decisions))
        self.rows.append((entry.correlation_id, entry.api_key, entry.request_bytes, entry.received_ms,
                          entry.response_received_ms, sent_ms, entry.upstream_response_bytes,
                          entry.response_bytes, entry.forwarded, entry.mutes_channel, verdicts))


def produce_v8(correlation_id: int, size: int) -> bytes:
    head = struct.pack(">hhih", ApiKey.PRODUCE, 8, correlation_id, 3) + b"app"
    body = struct.pack(">hhii", -1, 1, 30_000, 0)  # transactional id null, acks=1, timeout, no topics
    return head + body + b"\x00" * max(0, size - len(head) - len(body))


def metadata_v8(correlation_id: int) -> bytes:
    head = struct.pack(">hhih", ApiKey.METADATA, 8, correlation_id, 3) + b"app"
    return head + struct.pack(">i", -1) + b"\x00" * 3  # all topics, then three booleans


async def connection_run(cls: Any, budget: dict[str, float], script: list[tuple[str, int, int]]
                         ) -> tuple[Any, ...]:
    clock = FakeClock(1_000)
    timers = FakeTimers(clock)
    engine = QuotaEngine(QuotaConfig.from_dict({"entries": [{"client_id": "<default>", **budget}]}), clock)
    upstream = FakeUpstream()

    async def connect(client: ClientConnection, target: UpstreamTarget) -> Upstream | str:
        return upstream

    rows = RowStage()
    registry = BrokerRegistry("127.0.0.1", "127.0.0.1", lambda n: 0, lambda s, t: None)
    services = ConnectionServices(pipeline=Pipeline([QuotaStage(engine), rows]), registry=registry,
                                  clock=clock, bootstrap=[], connect_upstream=connect,
                                  call_later=timers.call_later)
    previous = connection_module.ResponseOrderImpl
    connection_module.ResponseOrderImpl = cls  # type: ignore[misc]
    try:
        conn = ClientConnection(services, UpstreamTarget(1))
    finally:
        connection_module.ResponseOrderImpl = previous  # type: ignore[misc]
    assert type(conn.responses) is cls
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    await run_ready_callbacks()
    answered = 0
    for step, (what, n, ms) in enumerate(script):
        if what == "produce" or what == "metadata":
            frame = produce_v8(step, n) if what == "produce" else metadata_v8(step)
            conn.data_received(struct.pack(">i", len(frame)) + frame)
        elif what == "answer" and answered < len(upstream.written):
            cid = struct.unpack_from(">i", upstream.written[answered], 4)[0]
            api_key = struct.unpack_from(">h", upstream.written[answered], 0)[0]
            answered += 1
            body = (struct.pack(">ii", 0, n % 50) if api_key == ApiKey.PRODUCE  # no topics, broker throttle
                    else struct.pack(">i", 0) + b"\x00" * 12)
            conn.on_upstream_frame(struct.pack(">i", cid) + body)
        timers.advance(ms)
    return (bytes(transport.data), tuple(upstream.written), tuple(rows.rows), conn.in_flight,
            conn.throttle.mute.state, transport.paused, transport.closed)


@pytest.mark.both_twins
@settings(max_examples=60, deadline=None)
@given(budget=st.fixed_dictionaries({"producer_byte_rate": st.sampled_from([200.0, 2_000.0, 1e12]),
                                     "request_percentage": st.sampled_from([1.0, 50.0, 1e6])}),
       script=st.lists(st.tuples(st.sampled_from(["produce", "produce", "metadata", "answer", "answer"]),
                                 st.integers(20, 900), st.sampled_from([0, 0, 3, 40, 400])), max_size=30))
def test_a_connection_with_the_quota_stage_forwards_answers_and_logs_the_same_on_both_twins(
        budget: dict[str, float], script: list[tuple[str, int, int]]) -> None:
    reference, compiled = twins()
    expected = asyncio.run(connection_run(reference, budget, script))
    got = asyncio.run(connection_run(compiled, budget, script))
    assert got == expected


def test_the_connection_uses_the_compiled_twin_unless_the_pure_path_is_asked_for() -> None:
    module = built(responses.COMPILED_MODULE, "proxy.pumps._speedups")
    if responses.IMPLEMENTATION == "compiled":
        assert responses.ResponseOrderImpl is module.ResponseOrder
    else:
        assert responses.ResponseOrderImpl is responses.ResponseOrder
