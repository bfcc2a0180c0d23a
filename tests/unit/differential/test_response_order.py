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
  completed request's row: the same client byte stream (Produce v8 and Metadata, pipelined, one
  frame or a burst of three to a read) and the same broker responses (one or all outstanding to a
  read) and clock give the same bytes forwarded, the same responses to the client (their
  throttle_time_ms patched), the same verdicts (each request's quota decisions), the same rows and
  the same number of writes to each socket (the corked writes).
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from protocol.apis import ApiKey
from protocol.framing import FrameSplitter
from proxy.flow.connection_stats import ConnectionStats
from proxy.flow.inflight import InFlight, InFlightRequests
from proxy.flow.pipeline import (
    AnswerHere,
    AnswerLater,
    ConnectionContext,
    Pipeline,
    ResponseOutcome,
    StageBase,
)
from proxy.pumps import connection as connection_module
from proxy.pumps import responses
from proxy.pumps import upstream as upstream_module
from proxy.pumps.client_output import ClientOutput
from proxy.pumps.connection import ClientConnection, ConnectionServices
from proxy.pumps.limits import ConnectionLimits, LimitLog, LimitSettings
from proxy.pumps.read_gate import ReadGate
from proxy.pumps.services import Upstream
from proxy.pumps.throttle_timer import ThrottleTimer
from proxy.pumps.upstream import UpstreamConnection
from proxy.pumps.upstreams import BrokerRegistry, UpstreamTarget
from proxy.stages.quota import QuotaStage
from quotas.clock import FakeClock
from quotas.config import QuotaConfig
from quotas.connection_limits import BufferBudget, ConnectionLimiter
from quotas.engine import QuotaEngine
from tests.unit.differential.impls import built
from tests.unit.proxy.test_connection import FakeTimers, FakeTransport, read_into, run_ready_callbacks
from tests.unit.proxy.test_read_gate import FakeBuffer, FakeWatchdog


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


class OtherEntry(InFlight):
    """An in-flight entry of another class than `InFlight` (the same fields)."""

    __slots__ = ()


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
            # every third entry of another class: the compiled twin reads it by name, not at its slots
            version = 3 if api_key == ApiKey.API_VERSIONS else 8
            entry = (OtherEntry if cid % 3 == 0 else InFlight)(cid, api_key, version, "c", 20, now)
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
                    self.loop.run_until_complete(future)  # runs the done callbacks set_result queued
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
                          entry.response_bytes, entry.forwarded, entry.expects_response, entry.mutes_channel,
                          verdicts))


class AnswerSome(StageBase):
    """Answers ApiVersions itself (at once) and, for client id "later", Metadata once asked to."""

    def __init__(self) -> None:
        self.pending: list[asyncio.Future[bytes]] = []

    def on_request(self, ctx: ConnectionContext, entry: InFlight, header: Any, payload: bytes) -> Any:
        if header.api_key == ApiKey.API_VERSIONS:
            return AnswerHere(struct.pack(">ih", header.correlation_id, 0) + b"\x00" * 8)
        if header.api_key == ApiKey.METADATA and header.client_id == "later":
            future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
            self.pending.append(future)
            return AnswerLater(future)
        return None


def produce_v8(correlation_id: int, size: int, acks: int = 1) -> bytes:
    head = struct.pack(">hhih", ApiKey.PRODUCE, 8, correlation_id, 3) + b"app"
    body = struct.pack(">hhii", -1, acks, 30_000, 0)  # transactional id null, acks, timeout, no topics
    return head + body + b"\x00" * max(0, size - len(head) - len(body))


def metadata_v8(correlation_id: int, client_id: bytes = b"app") -> bytes:
    head = struct.pack(">hhih", ApiKey.METADATA, 8, correlation_id, len(client_id)) + client_id
    return head + struct.pack(">i", -1) + b"\x00" * 3  # all topics, then three booleans


def api_versions_v3(correlation_id: int) -> bytes:
    return struct.pack(">hhih", ApiKey.API_VERSIONS, 3, correlation_id, 3) + b"app" + b"\x00\x01a\x011\x00"


def client_frame(what: str, cid: int, n: int) -> bytes:
    if what == "produce":
        return produce_v8(cid, n)
    if what == "produce0":
        return produce_v8(cid, n, acks=0)
    if what == "metadata":
        return metadata_v8(cid)
    if what == "later":
        return metadata_v8(cid, b"later")
    if what == "versions":
        return api_versions_v3(cid)
    return b"\x00\x01"  # "garbage": too short for a request header: the connection closes


@dataclass
class TwinConnection:
    """A real `ClientConnection` and its `UpstreamConnection`, on one twin, over fake sockets."""

    conn: ClientConnection
    transport: FakeTransport  # the client's socket
    broker: FakeTransport     # the upstream socket: what the connection forwards, size-prefixed
    upstream: Any
    timers: FakeTimers


async def twin_connection(compiled: bool, pipeline: Pipeline, clock: FakeClock,
                          max_in_flight: int = 100) -> TwinConnection:
    timers = FakeTimers(clock)
    broker = FakeTransport()

    async def connect(client: ClientConnection, target: UpstreamTarget) -> Upstream | str:
        upstream = UpstreamConnection(client, 1024 * 1024)  # made here, as tcp_upstream makes it
        upstream.connection_made(broker)  # type: ignore[arg-type]
        return upstream

    registry = BrokerRegistry("127.0.0.1", "127.0.0.1", lambda n: 0, lambda s, t: None)
    limits = ConnectionLimits(LimitSettings(max_in_flight_requests_per_connection=max_in_flight),
                              ConnectionLimiter(10_000, 1_000), BufferBudget(256 * 1024 * 1024), clock,
                              timers.call_later)
    services = ConnectionServices(pipeline=pipeline, registry=registry,
                                  clock=clock, bootstrap=[], connect_upstream=connect,
                                  call_later=timers.call_later, limits=limits)
    module = built(responses.COMPILED_MODULE, "proxy.pumps._speedups")
    chosen = (module.ResponseOrder, module) if compiled else (responses.ResponseOrder, None)
    previous = (connection_module.ResponseOrderImpl, connection_module.COMPILED_REQUESTS,
                upstream_module.COMPILED_REQUESTS)
    connection_module.ResponseOrderImpl, connection_module.COMPILED_REQUESTS = chosen  # type: ignore[misc]
    upstream_module.COMPILED_REQUESTS = chosen[1]  # type: ignore[misc]
    try:
        conn = ClientConnection(services, UpstreamTarget(1))
        transport = FakeTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        await run_ready_callbacks()  # the upstream connects (UpstreamConnection made in connect)
    finally:
        connection_module.ResponseOrderImpl, connection_module.COMPILED_REQUESTS = previous[:2]  # type: ignore[misc]
        upstream_module.COMPILED_REQUESTS = previous[2]  # type: ignore[misc]
    assert type(conn.responses) is chosen[0]
    upstream = conn._link.upstream
    # every twin in place on the compiled side, none on the reference's
    assert (getattr(conn.data_received, "__self__", None).__class__ is module.RequestReader) == compiled
    assert (getattr(upstream.data_received, "__self__", None).__class__ is module.UpstreamReader) == compiled
    assert (type(conn._out) is module.ClientOutput) == compiled
    assert (type(conn.fetch_stream) is module.FetchStream) == compiled
    return TwinConnection(conn, transport, broker, upstream, timers)


async def connection_run(compiled: bool, budget: dict[str, float], max_in_flight: int,
                         script: list[tuple[str, int, int, int]]) -> tuple[Any, ...]:
    clock = FakeClock(1_000)
    engine = QuotaEngine(QuotaConfig.from_dict({"entries": [{"client_id": "<default>", **budget}]}), clock)
    rows, answers = RowStage(), AnswerSome()
    rig = await twin_connection(compiled, Pipeline([answers, QuotaStage(engine), rows]), clock, max_in_flight)
    conn, transport, broker, upstream, timers = rig.conn, rig.transport, rig.broker, rig.upstream, rig.timers
    answered = resolved = 0
    held = b""  # the second half of a frame sent in two reads
    mute = conn.throttle.mute
    seen: list[tuple[Any, ...]] = []  # after every step: what a client, the broker and the log see
    for step, (what, n, cut, ms) in enumerate(script, start=1):
        if what in ("answer", "answer_all"):  # the oldest unanswered request, or all of them in one read
            data = b""
            while answered < len(broker.frames()) and (what == "answer_all" or not data):
                request = broker.frames()[answered]
                answered += 1
                cid = struct.unpack_from(">i", request, 4)[0]
                produce = struct.unpack_from(">h", request)[0] == ApiKey.PRODUCE
                # no topics, then the broker's own throttle_time_ms
                body = struct.pack(">ii", 0, n % 50) if produce else struct.pack(">i", 0) + b"\x00" * 12
                response = struct.pack(">i", cid) + body
                data += struct.pack(">i", len(response)) + response
            if data:
                if cut:  # the broker's bytes in two reads, cut inside the first frame
                    read_into(upstream, data[:cut])
                read_into(upstream, data[cut:])
        elif what == "resolve":
            if resolved < len(answers.pending):
                answers.pending[resolved].set_result(struct.pack(">i", 0) + b"later")
                resolved += 1
                await run_ready_callbacks()
        else:  # one frame, or (a burst) three pipelined in one read
            kinds = ("metadata", "versions", "produce") if what == "burst" else (what,)
            data = held + b"".join(struct.pack(">i", len(frame)) + frame for frame in
                                   (client_frame(kind, step * 4 + i, n) for i, kind in enumerate(kinds)))
            cut = min(cut, len(data))
            read_into(conn, data[:cut] if cut else data)  # as the event loop reads a socket
            held = data[cut:] if cut else b""
        seen.append((len(transport.data), len(broker.frames()), len(rows.rows), conn.in_flight, mute.state,
                     mute.deadline_ms, transport.paused, transport.closed, conn._close_reason,
                     transport.writes, broker.writes))
        timers.advance(ms)
        await run_ready_callbacks()
        if transport.closed and not conn.closed:  # what the event loop does after a transport's close
            conn.connection_lost(None)  # (the broker's answers after it are dropped, on both twins)
    return bytes(transport.data), bytes(broker.data), tuple(rows.rows), tuple(seen)


# a throttled Produce answered, its delay over, then another: the mute's whole cycle (KIP-219)
THROTTLE_CYCLE = [("produce", 900, 0, 0)] * 3 + [("answer", 1, 0, 0)] * 2 + [("answer", 1, 0, 5_000),
                                                                          ("produce", 900, 0, 0),
                                                                          ("answer", 1, 0, 0)]


@pytest.mark.both_twins
@settings(max_examples=150, deadline=None)
@example(budget={"producer_byte_rate": 200.0, "request_percentage": 1e6}, max_in_flight=100,
         script=THROTTLE_CYCLE)
@example(budget={"producer_byte_rate": 200.0, "request_percentage": 1e6}, max_in_flight=100,
         script=[(what, 900, 0, 0) for what, *_ in THROTTLE_CYCLE if what == "produce"]
         + [("produce0", 900, 0, 5_000), ("produce", 900, 0, 0)])  # acks=0: muted with no response
@given(budget=st.fixed_dictionaries({"producer_byte_rate": st.sampled_from([50.0, 200.0, 20_000.0, 1e12]),
                                     "request_percentage": st.sampled_from([1.0, 50.0, 1e6])}),
       max_in_flight=st.sampled_from([1, 2, 100]),
       script=st.lists(st.tuples(st.sampled_from(["produce", "produce", "produce0", "metadata", "later",
                                                  "versions", "answer", "answer", "answer", "resolve",
                                                  "garbage", "burst", "answer_all"]),
                                 st.integers(20, 900), st.sampled_from([0, 0, 0, 3, 10]),
                                 st.sampled_from([0, 0, 3, 40, 400, 5_000])), max_size=30))
def test_a_connection_with_the_quota_stage_forwards_answers_and_logs_the_same_on_both_twins(
        budget: dict[str, float], max_in_flight: int, script: list[tuple[str, int, int, int]]) -> None:
    expected = asyncio.run(connection_run(False, budget, max_in_flight, script))
    got = asyncio.run(connection_run(True, budget, max_in_flight, script))
    assert got == expected


# ----------------------------------------------------------------------------- corked writes


def framed(*payloads: bytes) -> bytes:
    return b"".join(struct.pack(">i", len(p)) + p for p in payloads)


@pytest.mark.both_twins
@pytest.mark.parametrize("compiled", [False, True], ids=["reference", "compiled"])
def test_what_one_read_brings_is_written_once_each_way(compiled: bool) -> None:
    async def run() -> None:
        rig = await twin_connection(compiled, Pipeline([AnswerSome()]), FakeClock(1_000))
        # five requests in one read: four forwarded (Metadata), one answered here (ApiVersions, third)
        kinds = ["metadata", "metadata", "versions", "metadata", "metadata"]
        rig.conn.data_received(framed(*(client_frame(kind, cid, 0) for cid, kind in enumerate(kinds, 1))))
        # the four forwarded in one write to the broker; nothing to the client yet (the answer waits
        # for the two before it)
        assert [struct.unpack_from(">i", f, 4)[0] for f in rig.broker.frames()] == [1, 2, 4, 5]
        assert rig.broker.writes == 1 and rig.transport.writes == 0
        # the broker answers all four in one read: the five responses reach the client in one write,
        # in request order (the answer made here in its place)
        rig.upstream.data_received(framed(*(struct.pack(">i", cid) + b"\x00" * 16 for cid in (1, 2, 4, 5))))
        assert [struct.unpack_from(">i", f)[0] for f in rig.transport.frames()] == [1, 2, 3, 4, 5]
        assert rig.transport.writes == 1
        # a lone request and its response: one write each, as before
        rig.conn.data_received(framed(client_frame("metadata", 6, 0)))
        rig.upstream.data_received(framed(struct.pack(">i", 6) + b"\x00" * 16))
        assert (rig.broker.writes, rig.transport.writes) == (2, 2)

    asyncio.run(run())


@pytest.mark.both_twins
@pytest.mark.parametrize("compiled", [False, True], ids=["reference", "compiled"])
def test_a_close_inside_a_read_first_sends_what_was_already_written(compiled: bool) -> None:
    async def run() -> None:
        rig = await twin_connection(compiled, Pipeline([AnswerSome()]), FakeClock(1_000))
        # an ApiVersions answered here, a Metadata forwarded, then a frame too short for a request
        # header: the connection closes inside the read that brought all three
        rig.conn.data_received(framed(client_frame("versions", 1, 0), client_frame("metadata", 2, 0),
                                      client_frame("garbage", 3, 0)))
        assert rig.transport.closed and rig.broker.closed
        assert [struct.unpack_from(">i", f)[0] for f in rig.transport.frames()] == [1]  # the answer
        assert [struct.unpack_from(">i", f, 4)[0] for f in rig.broker.frames()] == [2]  # the forward

    asyncio.run(run())


@pytest.mark.both_twins
@pytest.mark.parametrize("which", [0, 1], ids=["reference", "compiled"])
def test_corked_writes_go_out_as_one_writelines_when_the_last_cork_comes_out(which: int) -> None:
    clock = FakeClock(5_000)
    buffer, watchdog, transport = FakeBuffer(), FakeWatchdog(), FakeTransport()
    module = built(responses.COMPILED_MODULE, "proxy.pumps._speedups")
    out = (ClientOutput, module.ClientOutput)[which](buffer, watchdog, clock.now_ms)
    out.attach(transport)
    transport.buffered = 64                                # the client is not reading: each write is measured
    out.cork()
    out.cork()                                             # nested: the outer one decides
    out.frame(b"one")
    out.write(b"raw")
    out.writelines((b"a", b"b"))
    out.uncork()
    assert (transport.writes, buffer.measured, watchdog.last_active_ms) == (0, 0, 0)  # all held
    clock.advance(7)
    out.uncork()
    # one writelines: size 3 + "one", then "raw", "a", "b" in the order written; one activity, one measure
    assert bytes(transport.data) == b"\x00\x00\x00\x03oneraw" + b"ab"
    assert (transport.writes, buffer.measured, watchdog.last_active_ms) == (1, 1, 5_007)
    out.frame(b"two")                                      # uncorked: written at once
    assert transport.writes == 2
    out.cork()
    out.frame(b"three")
    out.release()                                          # a close: what is held goes now
    assert transport.writes == 3 and bytes(transport.data).endswith(b"\x00\x00\x00\x05three")
    out.uncork()                                           # nothing left to write
    assert transport.writes == 3


@pytest.mark.both_twins
@pytest.mark.parametrize("which", [0, 1], ids=["reference", "compiled"])
def test_a_frame_s_size_prefix_is_its_length_as_a_big_endian_int32(which: int) -> None:
    # sizes that set each of the prefix's three low bytes, alone and together (distinct values, so a
    # swapped pair of bytes shows), corked and not
    sizes = [0, 1, 255, 256, 0x0102, 0x010203, 0x020304]
    module = built(responses.COMPILED_MODULE, "proxy.pumps._speedups")
    for corked in (False, True):
        transport = FakeTransport()
        out = (ClientOutput, module.ClientOutput)[which](FakeBuffer(), FakeWatchdog(), FakeClock(0).now_ms)
        out.attach(transport)
        if corked:
            out.cork()
        for size in sizes:
            out.frame(b"x" * size)
        if corked:
            out.uncork()
        expected = b"".join(struct.pack(">i", size) + b"x" * size for size in sizes)
        assert bytes(transport.data) == expected


def test_the_connection_uses_the_compiled_twins_unless_the_pure_path_is_asked_for() -> None:
    module = built(responses.COMPILED_MODULE, "proxy.pumps._speedups")
    if responses.IMPLEMENTATION == "compiled":
        assert responses.ResponseOrderImpl is module.ResponseOrder
        assert responses.COMPILED_REQUESTS is module
    else:
        assert responses.ResponseOrderImpl is responses.ResponseOrder
        assert responses.COMPILED_REQUESTS is None
