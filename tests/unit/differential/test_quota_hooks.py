"""The quota stage's compiled hooks (`proxy.stages._speedups.QuotaHooks`) against the stage's own
Python hooks, the readable reference they stand in for.

Hypothesis feeds the same random sequence of events to two stages, each with its own engine on its
own fake clock: requests of a few clients (Produce, with and without a response; ApiVersions and
SASL, which are not rated; Metadata and FindCoordinator, which are; a Fetch, whose max_bytes may
be capped and whose response may be emptied), the broker's responses to them after a random round
trip (a Fetch's as a streamed one's head: its size is the whole response's), clock steps and quota
changes, under configurations that turn on every branch the hooks take: the client's produce and
fetch bytes, request_rate and request_percentage, records/s and topic budgets (a Produce then must
be read per topic; a Fetch's topics are read and its response read whole), shadow entries, and
bounds from tiny (every request throttles) to huge (none does). Per event both must give the same
outcome (its kind, forwarded or patched bytes, throttle), write the same quota note (identity,
decisions, enforced throttle), delay and whole-response flag on the in-flight entry, and tell the
observer the same violations; after the sequence every sensor of every budget must be the same.
"""

from __future__ import annotations

import struct
import sys
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from protocol.apis import ApiKey
from protocol.headers import RequestHeader
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext
from proxy.stages import quota as quota_stage
from proxy.stages.quota import DecisionObserver, QuotaStage
from quotas import fastpath as quota_fastpath
from quotas.clock import FakeClock
from quotas.config import QuotaConfig
from quotas.engine import QuotaEngine
from quotas.manager import ThrottleDecision
from tests.unit.differential.impls import Loose, built
from tests.unit.differential.test_quick_charge import quick_charge, seen_sensors
from tests.unit.differential.test_quota_stats import exact

CLIENTS = ("a", "b", "c")
CTXS = (ConnectionContext(1, "127.0.0.1:5000", "broker 1", 1),
        ConnectionContext(2, "127.0.0.1:5001", "broker 2", 2, principal="User:alice"))
# (API, version): what each request is; its response payload is built by `response_payload`
APIS = ((ApiKey.PRODUCE, 8), (ApiKey.API_VERSIONS, 3), (ApiKey.SASL_HANDSHAKE, 1), (ApiKey.METADATA, 12),
        (ApiKey.FIND_COORDINATOR, 1), (ApiKey.FETCH, 4))


def compiled() -> Any:
    """proxy.stages._speedups."""
    return built(quota_stage.COMPILED_MODULE, "proxy.stages._speedups")


class Violations(DecisionObserver):
    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    def on_violation(self, ctx: ConnectionContext, decision: ThrottleDecision) -> None:
        self.seen.append((ctx.connection_id, *seen_decision(decision)))


def seen_decision(d: ThrottleDecision) -> tuple[Any, ...]:
    return (d.kind, d.key, d.would_throttle_ms, exact(d.bound), d.shadow, d.entity,
            exact(d.observed) if d.would_throttle_ms > 0 else "not throttled")


def config(entries: list[dict[str, Any]]) -> QuotaConfig:
    return QuotaConfig.from_dict({"entries": entries})


def stages(entries: list[dict[str, Any]], quick: bool) -> list[tuple[QuotaStage, FakeClock, Violations]]:
    """(the stage on its compiled hooks, the stage on its own Python hooks), each with its clock and
    observer; `quick`: the engines run their compiled common case (else their Python verbs)."""
    out = []
    for compiled_hooks in (True, False):
        clock = FakeClock(1_000_000)
        engine = QuotaEngine(config(entries), clock)
        if not quick:
            engine._quick = None
        observer = Violations()
        stage = QuotaStage(engine, observer)
        if compiled_hooks:
            hooks = compiled().QuotaHooks(stage, QuotaStage)
            stage.on_request = hooks.on_request  # type: ignore[method-assign]
            stage.on_response = hooks.on_response  # type: ignore[method-assign]
        else:
            vars(stage).pop("on_request", None)  # the class's own methods: the reference
            vars(stage).pop("on_response", None)
        out.append((stage, clock, observer))
    return out


def request(api: int, version: int, client: str | None, correlation_id: int, size: int,
            acks: int) -> tuple[RequestHeader, bytes]:
    """A request of `size` bytes whose header is real (client id, correlation id) and whose body is
    filler: the hooks read no body of these (a Produce's acks are the connection's concern) but a
    Fetch's min_bytes and max_bytes (100 x `size`), which a cap lowers."""
    cid = b"" if client is None else client.encode()
    head = struct.pack(">hhih", api, version, correlation_id, -1 if client is None else len(cid)) + cid
    body = b""
    if api == ApiKey.PRODUCE:
        body = struct.pack(">hi", acks, 1000)
    elif api == ApiKey.FETCH:  # v4: replica_id, max_wait_ms, min_bytes, max_bytes
        body = struct.pack(">iiii", -1, 500, 1, 100 * size)
    payload = head + body + b"\x00" * max(0, size - len(head) - len(body))
    return RequestHeader(api, version, correlation_id, client, 1, len(head)), payload


def response_payload(api: int, correlation_id: int, broker_throttle_ms: int) -> bytes:
    if api == ApiKey.PRODUCE:  # v8: correlation_id, responses[] = empty, throttle_time_ms
        return struct.pack(">iii", correlation_id, 0, broker_throttle_ms)
    if api == ApiKey.FIND_COORDINATOR:  # v1: correlation_id, throttle_time_ms, error_code, ...
        return struct.pack(">iih", correlation_id, broker_throttle_ms, 0) + b"\x00" * 16
    if api == ApiKey.FETCH:  # v4's head: correlation_id, throttle_time_ms, responses[] = empty
        return struct.pack(">iii", correlation_id, broker_throttle_ms, 0)
    return struct.pack(">i", correlation_id) + b"\x00" * 24  # a body the patch may not read: kept


def seen_outcome(outcome: Any) -> Any:
    if outcome is None:
        return None
    return (type(outcome).__name__, getattr(outcome, "payload", None), outcome.throttle_time_ms,
            getattr(outcome, "replaced", None))


def seen_entry(entry: InFlight) -> Any:
    note = entry.quota
    seen_note = None if note is None else (note.identity, [seen_decision(d) for d in note.decisions],
                                           note.enforced_ms)
    return seen_note, entry.delay_from_response_ms, entry.whole_response


bound_st = st.one_of(st.integers(1, 3_000), st.integers(10**9, 10**12)).map(float)  # tight, or never binding
entry_st = st.fixed_dictionaries(
    {"client_id": st.sampled_from([*CLIENTS, "<default>"])},
    optional={"producer_byte_rate": bound_st, "request_rate": st.floats(0.5, 500.0),
              "request_percentage": st.floats(0.5, 200.0), "consumer_byte_rate": bound_st,
              "producer_record_rate": bound_st, "consumer_record_rate": bound_st, "shadow": st.booleans()}
).filter(lambda e: len(e.keys() - {"client_id", "shadow"}) > 0)  # an entry limits something
topic_st = st.fixed_dictionaries({"topic": st.just("t")}, optional={"producer_byte_rate": bound_st,
                                                                   "consumer_byte_rate": bound_st}
                                  ).filter(lambda e: len(e) > 1)
entries_st = st.lists(entry_st, max_size=4, unique_by=lambda e: e["client_id"]).flatmap(
    lambda found: st.one_of(st.just(found), st.just([*found, {"topic": "t", "producer_byte_rate": 10.0**12}]),
                            topic_st.map(lambda t: [*found, t])))
api_st = st.sampled_from([0, 0, 0, *range(1, len(APIS))])  # Produce the most, as on the wire
request_st = st.tuples(st.just("request"), st.sampled_from([*CLIENTS, None]), api_st, st.integers(0, 1),
                       st.tuples(st.integers(20, 20_000), st.sampled_from([1, 1, 0, -1])))
respond_st = st.tuples(st.just("respond"), st.just(None), st.just(0), st.integers(0, 1),
                       st.tuples(st.integers(0, 400), st.sampled_from([0, 0, 50]),
                                 st.integers(12, 400_000)))  # a Fetch response's size
ops_st = st.lists(st.one_of(
    request_st, request_st, respond_st, respond_st,
    st.tuples(st.just("advance"), st.just(None), st.just(0), st.just(0),
              st.one_of(st.integers(0, 300), st.integers(300, 40_000))),
    st.tuples(st.just("config"), st.just(None), st.just(0), st.just(0), entries_st),
), max_size=50)


def run(stage: QuotaStage, clock: FakeClock, pending: list[list[InFlight]], op: str, client: str | None,
        api_index: int, connection: int, arg: Any, correlation: list[int]) -> Any:
    ctx = CTXS[connection]
    if op == "request":
        api, version = APIS[api_index]
        size, acks = arg
        correlation[0] += 1
        header, payload = request(api, version, client, correlation[0], size, acks)
        entry = InFlight(header.correlation_id, api, version, client, len(payload), clock.now_ms(),
                         expects_response=not (api == ApiKey.PRODUCE and acks == 0),
                         forwarded=api != ApiKey.METADATA or size % 2 == 0)  # some answered by Sluice
        outcome = stage.on_request(ctx, entry, header, payload)
        if entry.expects_response:
            pending[connection].append(entry)
        return seen_outcome(outcome), seen_entry(entry)
    if op == "respond":
        if not pending[connection]:
            return None
        elapsed_ms, broker_throttle_ms, fetched_bytes = arg
        entry = pending[connection].pop(0)
        clock.advance(elapsed_ms)
        entry.response_received_ms = clock.now_ms()
        payload = response_payload(entry.api_key, entry.correlation_id, broker_throttle_ms)
        entry.upstream_response_bytes = fetched_bytes if entry.api_key == ApiKey.FETCH else len(payload)
        answer = stage.on_response(ctx, entry, payload)
        return seen_outcome(answer), seen_entry(entry)
    if op == "advance":
        clock.advance(arg)
    else:
        stage._engine.update_config(config(arg))
    return None


# a client throttled on its produce bytes (5 000 B at 100 B/s: 40 000 ms and more), then the responses
# to its throttled requests: each carries the throttle its request was given
THROTTLED_THEN_ANSWERED = [("request", "a", 0, 0, (5000, 1))] * 4 + [("respond", None, 0, 0, (5, 0, 12))] * 4
# a consumer at 1 000 B/s: its max_bytes capped at 1 000 x 10 x 1 s = 10 000 (asked: 100 x 200); its
# fetches of 4 000 B delivered until the window holds more than 10 s of quota, then emptied
FETCHES = [op for _ in range(5)
           for op in (("request", "a", 5, 0, (200, 1)), ("respond", None, 0, 0, (100, 0, 4000)))]


@pytest.mark.both_twins
@settings(max_examples=300, deadline=None)
@given(entries=entries_st, quick=st.booleans(), ops=ops_st)
@example(entries=[{"client_id": "a", "producer_byte_rate": 100.0}], quick=True, ops=THROTTLED_THEN_ANSWERED)
@example(entries=[{"client_id": "<default>", "request_rate": 1.0, "request_percentage": 1.0}], quick=True,
         ops=[("request", "b", 4, 1, (100, 1))] * 12 + [("respond", None, 0, 1, (300, 0, 12))] * 12)
@example(entries=[{"client_id": "a", "consumer_byte_rate": 1000.0}], quick=True, ops=FETCHES)
def test_the_compiled_hooks_do_what_the_stages_python_does(
        entries: list[dict[str, Any]], quick: bool, ops: list[tuple[str, Any, int, int, Any]]) -> None:
    (fast, fast_clock, fast_seen), (readable, readable_clock, readable_seen) = stages(entries, quick)
    fast_pending: list[list[InFlight]] = [[], []]
    readable_pending: list[list[InFlight]] = [[], []]
    fast_ids, readable_ids = [0], [0]
    for op in ops:
        got = run(fast, fast_clock, fast_pending, *op, fast_ids)
        expected = run(readable, readable_clock, readable_pending, *op, readable_ids)
        assert got == expected, op
        assert fast_seen.seen == readable_seen.seen, op
    now = fast_clock.now_ms()
    assert seen_sensors(fast._engine, rates_at=now) == seen_sensors(readable._engine, rates_at=now)


@pytest.mark.both_twins
def test_a_stage_runs_the_compiled_hooks_when_they_are_built_and_the_reference_otherwise() -> None:
    """The switch: with the compiled module active a stage's hooks are the compiled object's, and a
    common Produce enters no Python function of the stage or the engine; with it off, the class's."""
    engine = QuotaEngine(config([{"client_id": "<default>", "producer_byte_rate": 1e12}]), FakeClock(0))
    stage = QuotaStage(engine)
    if quota_stage.QuotaHooksImpl is None:
        assert stage.on_request.__func__ is QuotaStage.on_request  # type: ignore[attr-defined]
        return
    assert type(stage.on_request.__self__) is compiled().QuotaHooks  # type: ignore[attr-defined]
    header, payload = request(ApiKey.PRODUCE, 8, "a", 1, 200, 1)
    for _ in range(3):  # the first binds the sensors (the engine's Python); then the common case
        entry = InFlight(1, ApiKey.PRODUCE, 8, "a", len(payload), 0)
        stage.on_request(CTXS[0], entry, header, payload)
    entered: list[str] = []

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event == "call":
            entered.append(frame.f_code.co_qualname)

    entry = InFlight(1, ApiKey.PRODUCE, 8, "a", len(payload), 0)
    sys.setprofile(profile)
    try:
        outcome = stage.on_request(CTXS[0], entry, header, payload)
    finally:
        sys.setprofile(None)
    assert outcome is None and entry.quota is not None and entry.quota.enforced_ms == 0
    # only the test's own clock (the proxy's is compiled too: `quotas._speedups.SystemClock`)
    assert [name for name in entered if "profile" not in name] == ["FakeClock.now_ms"]


@pytest.mark.both_twins
def test_a_common_fetch_enters_no_python_of_the_stage_or_the_engine() -> None:
    """A Fetch far from its client's consumer_byte_rate (its cap above any max_bytes: nothing to
    rewrite) and its response, on the compiled hooks: no Python function of the stage, the engine
    or the manager runs, only the test's clock (where the quota stats are the compiled ones: the
    common case records into them); and the verdicts are the ones a stage on the engine's Python
    verbs gives."""
    entries = [{"client_id": "<default>", "consumer_byte_rate": 1e12, "request_rate": 1e9}]
    (fast, fast_clock, _), (readable, readable_clock, _) = stages(entries, quick=True)
    fast._engine._quick = quick_charge(fast._engine)  # compiled, even where the engines run pure
    readable._engine._quick = None
    entered: list[str] = []

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event == "call":
            entered.append(frame.f_code.co_qualname)

    for n in range(4):  # the first binds the sensors (the engine's Python); then the common case
        seen = []
        for stage, clock, profiled in ((fast, fast_clock, n == 3), (readable, readable_clock, False)):
            header, payload = request(ApiKey.FETCH, 4, "a", n, 200, 1)
            entry = InFlight(n, ApiKey.FETCH, 4, "a", len(payload), clock.now_ms())
            response = response_payload(ApiKey.FETCH, n, 0)
            sys.setprofile(profile if profiled else None)
            try:
                outcome = stage.on_request(CTXS[0], entry, header, payload)
                entry.upstream_response_bytes = 1_000_000
                answer = stage.on_response(CTXS[0], entry, response)
            finally:
                sys.setprofile(None)
            seen.append((seen_outcome(outcome), seen_outcome(answer), seen_entry(entry)))
            clock.advance(10)
        assert seen[0] == seen[1]
        assert seen[0][:2] == (None, None) and seen[0][2][0][2] == 0  # forwarded as it is, not throttled
    if quota_fastpath.IMPLEMENTATION == "compiled":
        assert entered and {name for name in entered if "profile" not in name} == {"FakeClock.now_ms"}
    else:  # the sensors' rates are the pure ones, which the compiled case never records into
        assert "QuotaManager.admit_fetch_at" in entered


@pytest.mark.both_twins
@pytest.mark.parametrize("loose", ["entry", "header", "context"])
def test_an_object_of_another_class_is_the_references(loose: str) -> None:
    seen = []
    for stage, clock, observer in stages([{"client_id": "a", "producer_byte_rate": 100.0}], quick=True):
        ctx: Any = Loose(CTXS[1]) if loose == "context" else CTXS[1]
        got = []
        for n in range(3):  # 5 000 B at 100 B/s: throttled, and more each time
            header, payload = request(ApiKey.PRODUCE, 8, "a", n, 5000, 1)
            entry: Any = InFlight(n, ApiKey.PRODUCE, 8, "a", len(payload), clock.now_ms())
            if loose == "entry":
                entry = Loose(entry)
            outcome = stage.on_request(ctx, entry, Loose(header) if loose == "header" else header, payload)
            clock.advance(5)
            entry.response_received_ms = clock.now_ms()
            response = response_payload(ApiKey.PRODUCE, n, 0)
            entry.upstream_response_bytes = len(response)
            answer = stage.on_response(ctx, entry, response)
            got.append((seen_outcome(outcome), seen_outcome(answer), seen_entry(entry)))
        seen.append((got, observer.seen))
    assert seen[0] == seen[1]
    assert seen[0][0][-1][0][2] > 0  # the last request was throttled: the hooks did their work
