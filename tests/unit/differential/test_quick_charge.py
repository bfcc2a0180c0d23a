"""The engine's compiled common case (`quotas._speedups.QuickCharge`) against the engine's Python
verbs, the readable reference it stands in for.

Hypothesis feeds the same random sequence of events to two engines on two fake clocks: Produce
requests and Fetch requests with their responses (single, and steady streams) and other rated
requests of a few clients through two brokers,
clock steps (short ones, sweeps at 30 s, idle expiry past 1 h), quota changes, a storage factor and
fleet shares, under the windowed rate and the token bucket, with shadow entries, bounds from tiny
(every request throttles) to huge (none does). Each verdict must be the reference's: throttle, and
per decision its kind, sensor, would-throttle, bound, shadow and entity (the rate it observed too,
bit for bit, wherever the compiled path carries it: a decision that throttles; a not-throttled one
is the slot's shared decision and carries NaN). And after every event every sensor of every budget
must be the reference's: last record, sweep epoch, total recorded, bound, owed, throttle counters,
bucket; and its windowed rate, float for float, at the end.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from quotas import fastpath
from quotas.clock import FakeClock
from quotas.config import QuotaConfig
from quotas.engine import (
    NOT_LIMITED_REQUEST,
    NOT_LIMITED_RESPONSE,
    QuotaEngine,
    RequestVerdict,
    ResponseVerdict,
)
from quotas.entity import ClientIdentity, QuotaKind
from quotas.manager import SENSOR_SWEEP_INTERVAL_MS, QuotaManager, ThrottleDecision
from tests.unit.differential.impls import built
from tests.unit.differential.test_quota_stats import exact

CLIENTS = ("a", "b", "c")
IDENTITIES = {c: ClientIdentity("ANONYMOUS", c) for c in CLIENTS}  # one object each, as the stage keeps


def compiled() -> Any:
    """quotas._speedups."""
    return built(fastpath.COMPILED_MODULE, "quotas._speedups")


def config(model: str, bounds: dict[str, tuple[float, float | None]], shadow: frozenset[str]) -> QuotaConfig:
    """Each client's bound as its producer_byte_rate and its consumer_byte_rate (the consumer's
    a quarter of it: the two budgets bind apart), its request_rate if given; `model` is the rate
    model, with ``+records`` a consumer_record_rate for each too (not the fetch's common case)."""
    rate_model, _, extra = model.partition("+")
    entries: list[dict[str, Any]] = []
    for client, (byte_rate, request_rate) in bounds.items():
        entry: dict[str, Any] = {"client_id": client, "producer_byte_rate": byte_rate,
                                 "consumer_byte_rate": float(max(1, int(byte_rate) // 4)),
                                 "shadow": client in shadow}
        if request_rate is not None:
            entry["request_rate"] = request_rate
        if extra == "records":
            entry["consumer_record_rate"] = 1_000.0
        entries.append(entry)
    return QuotaConfig.from_dict({"rate_model": rate_model, "entries": entries})


def engines(model: str, bounds: dict[str, tuple[float, float | None]],
            shadow: frozenset[str]) -> tuple[QuotaEngine, QuotaEngine, FakeClock, FakeClock]:
    """(the engine with the compiled common case, the engine on its Python verbs, their clocks)."""
    clocks = FakeClock(1_000_000), FakeClock(1_000_000)
    quick, reference = (QuotaEngine(config(model, bounds, shadow), clock) for clock in clocks)
    quick._quick = quick_charge(quick)
    reference._quick = None
    return quick, reference, clocks[0], clocks[1]


def quick_charge(engine: QuotaEngine) -> Any:
    """The compiled common case for `engine` (whatever SLUICE_PURE_PYTHON says), as the engine makes it."""
    return compiled().QuickCharge(engine, ThrottleDecision, RequestVerdict, NOT_LIMITED_REQUEST,
                                  QuotaKind.REQUEST_RATE, QuotaKind.PRODUCE,
                                  engine.plugins.scope == "cluster", SENSOR_SWEEP_INTERVAL_MS,
                                  QuotaKind.REQUEST_PERCENTAGE, NOT_LIMITED_RESPONSE, ResponseVerdict,
                                  QuotaKind.FETCH,
                                  QuotaKind.CONSUMER_RECORD_RATE)


def seen_verdict(verdict: RequestVerdict) -> tuple[Any, ...]:
    decisions = tuple((d.kind, d.key, d.would_throttle_ms, exact(d.bound), d.shadow, d.entity,
                       exact(d.observed) if d.would_throttle_ms > 0 else "not throttled")
                      for d in verdict.decisions)
    return verdict.throttle_ms, verdict.fetch_cap_bytes, verdict.read_whole_response, decisions


def seen_response(verdict: ResponseVerdict) -> tuple[Any, ...]:
    decisions = tuple((d.kind, d.key, d.would_throttle_ms, exact(d.bound), d.shadow, d.entity,
                       exact(d.observed) if d.would_throttle_ms > 0 else "not throttled")
                      for d in verdict.decisions)
    return verdict.throttle_ms, verdict.empty, verdict.debt_ms, decisions


def seen_sensors(engine: QuotaEngine, *, rates_at: int | None = None) -> list[Any]:
    out: list[Any] = []
    for label, manager in engine.budgets():
        for sensor in manager._sensors.values():
            state = (label, sensor.key, sensor.last_record_ms, sensor.touched_sweep_ms,
                     exact(sensor.used_total), exact(sensor.bound), exact(sensor.base_bound),
                     exact(sensor.share), exact(sensor.owed), sensor.owed_ms, sensor.shadow, sensor.entity,
                     sensor.throttles.snapshot(), sensor.shadow_throttles.snapshot(), repr(sensor.bucket))
            if rates_at is not None:  # purges (the same on both): only once the sequence is over
                state += (exact(sensor.rate.measure_parts(rates_at)),)
            out.append(state)
    return out


bound_st = st.one_of(st.integers(1, 5_000), st.integers(10**9, 10**12)).map(float)  # tight, or never binding
bounds_st = st.dictionaries(st.sampled_from(CLIENTS),
                            st.tuples(bound_st, st.one_of(st.none(), st.floats(0.5, 1_000.0))), min_size=1)
ops_st = st.lists(st.one_of(
    st.tuples(st.just("produce"), st.sampled_from(CLIENTS), st.sampled_from([None, 1]),
              st.integers(0, 20_000)),
    st.tuples(st.just("produces"), st.sampled_from(CLIENTS), st.sampled_from([None, 1]),
              st.tuples(st.integers(2, 30), st.integers(0, 5_000), st.integers(0, 50))),  # n, bytes, ms apart
    st.tuples(st.just("request"), st.sampled_from(CLIENTS), st.sampled_from([None, 1]), st.just(0)),
    st.tuples(st.just("fetch"), st.sampled_from(CLIENTS), st.sampled_from([None, 1]),
              st.integers(0, 200_000)),
    st.tuples(st.just("fetches"), st.sampled_from(CLIENTS), st.sampled_from([None, 1]),
              st.tuples(st.integers(2, 30), st.integers(0, 50_000), st.integers(0, 500))),  # n, B, ms apart
    st.tuples(st.just("advance"), st.just(""), st.just(None),
              st.one_of(st.integers(0, 300), st.integers(300, 40_000), st.just(3_700_000))),
    st.tuples(st.just("bounds"), st.just(""), st.just(None), bounds_st),
    st.tuples(st.just("scale"), st.just(""), st.just(None), st.sampled_from([0.0, 0.25, 1.0])),
    st.tuples(st.just("shares"), st.sampled_from(CLIENTS), st.sampled_from([None, 1]),
              st.floats(0.05, 1.0)),
), max_size=60)


def apply(engine: QuotaEngine, clock: FakeClock, model: str, shadow: frozenset[str],
          op: str, client: str, broker: int | None, arg: Any) -> Any:
    who = IDENTITIES.get(client)
    if op in ("produce", "request"):
        assert who is not None
        verdict = engine.produce(broker, who, arg, None) if op == "produce" else engine.request(broker, who)
        if engine._quick is not None:
            event("throttled" if verdict.throttle_ms else
                  "shared decisions" if any(math.isnan(d.observed) for d in verdict.decisions) else
                  "not throttled, by the engine's Python")
        return seen_verdict(verdict)
    if op == "fetch":  # a Fetch request, then its response of `arg` bytes
        assert who is not None
        asked = engine.fetch_request(broker, who)
        answered = engine.fetch_response(broker, who, arg, None, asked.throttle_ms)
        if engine._quick is not None:
            event("fetch emptied" if answered.empty else "fetch throttled" if answered.throttle_ms else
                  "fetch shared decisions" if any(math.isnan(d.observed) for d in answered.decisions) else
                  "fetch not throttled, by the engine's Python")
        return seen_verdict(asked), seen_response(answered)
    if op in ("produces", "fetches"):  # a producer's or a consumer's steady stream: n requests, ms apart
        assert who is not None
        n, size, step_ms = arg
        out = []
        for _ in range(n):
            one = "produce" if op == "produces" else "fetch"
            out.append(apply(engine, clock, model, shadow, one, client, broker, size))
            clock.advance(step_ms)
        return out
    if op == "advance":
        clock.advance(arg)
    elif op == "bounds":
        engine.update_config(config(model, arg, shadow))
    elif op == "scale":
        engine.set_limit_scale(QuotaKind.PRODUCE, arg)
        engine.set_limit_scale(QuotaKind.FETCH, arg)
    else:  # a fleet share for the client's produce and fetch budgets on one broker, others busy
        assert who is not None
        manager: QuotaManager = engine.for_broker(broker)
        keys = [manager.check(kind, who).key for kind in (QuotaKind.PRODUCE, QuotaKind.FETCH)]
        manager.set_shares(dict.fromkeys(keys, arg), 1.0, busy=frozenset(keys))
    return None


@pytest.mark.both_twins
@settings(max_examples=200, deadline=None)
@given(model=st.sampled_from(["windowed", "token_bucket", "windowed+records"]), bounds=bounds_st,
       shadow=st.frozensets(st.sampled_from(CLIENTS)), ops=ops_st)
def test_the_compiled_common_case_decides_as_the_engine(
        model: str, bounds: dict[str, tuple[float, float | None]], shadow: frozenset[str],
        ops: list[tuple[str, str, int | None, Any]]) -> None:
    quick, reference, quick_clock, reference_clock = engines(model, bounds, shadow)
    for op in ops:
        got = apply(quick, quick_clock, model, shadow, *op)
        expected = apply(reference, reference_clock, model, shadow, *op)
        assert got == expected, op
        assert seen_sensors(quick) == seen_sensors(reference), op
    now = quick_clock.now_ms()
    assert seen_sensors(quick, rates_at=now) == seen_sensors(reference, rates_at=now)


@pytest.mark.both_twins
def test_far_from_its_limit_a_produce_is_one_compiled_call_and_one_shared_verdict() -> None:
    """Once a caller's budgets are bound, a request that does not throttle runs none of the manager's
    Python and returns the same verdict object every time; near the limit the manager decides."""
    quick, reference, _, _ = engines("windowed", {"a": (1e12, 1e9), "b": (100.0, None)}, frozenset())
    who = IDENTITIES["a"]
    first = quick.produce(1, who, 1_000, None)           # binds the sensors (the engine's Python)
    quick.produce(1, who, 1_000, None)                   # reads the bindings once
    manager = quick.for_broker(1)

    def no_python(*_: Any) -> Any:
        raise AssertionError("the manager's Python ran in the common case")

    manager._decide = manager._record_on = manager.record_and_check = no_python  # type: ignore[method-assign]
    shared = quick.produce(1, who, 1_000, None)
    assert all(quick.produce(1, who, 1_000, None) is shared for _ in range(100))
    assert quick.request(1, who) is quick.request(1, who)
    assert shared.throttle_ms == 0 and [d.kind for d in shared.decisions] == [QuotaKind.REQUEST_RATE,
                                                                            QuotaKind.PRODUCE]
    assert shared.decisions[1].entity == first.decisions[1].entity
    assert math.isnan(shared.decisions[1].observed)
    del manager._decide, manager._record_on, manager.record_and_check
    # client b at 100 B/s, at the edge: 1 000 B over the padded 10 s is 100 B/s, not over (the
    # compiled path's own decision); one byte more is 100.1 B/s: (100.1 - 100) / 100 x 10 000 ms
    # = 10 ms, from the manager's Python after the compiled record, as the reference decides
    slow = IDENTITIES["b"]
    for engine in (quick, reference):
        engine.produce(1, slow, 0, None)
        engine.produce(1, slow, 0, None)
    at_bound = quick.produce(1, slow, 1_000, None)
    assert seen_verdict(at_bound) == seen_verdict(reference.produce(1, slow, 1_000, None))
    assert at_bound.throttle_ms == 0 and math.isnan(at_bound.decisions[0].observed)  # compiled
    over_quick = quick.produce(1, slow, 1, None)
    over_reference = reference.produce(1, slow, 1, None)
    assert over_quick.throttle_ms == 10 and seen_verdict(over_quick) == seen_verdict(over_reference)
    b_sensors = [[state for state in seen_sensors(engine, rates_at=1_000_000) if state[1].client_id == "b"]
                 for engine in (quick, reference)]   # client a went through the quick engine only
    assert b_sensors[0] == b_sensors[1] and b_sensors[0]


@pytest.mark.both_twins
def test_a_raised_fleet_share_is_owed_on_the_compiled_path_as_in_the_engine() -> None:
    """A fleet share that rose leaves the sensor owing the fleet (`QuotaManager._owe_raise`); the
    compiled path counts what is owed into the rate, decides, and clears it once repaid, as the
    engine's Python does, without leaving the compiled path while nothing throttles."""
    quick, reference, quick_clock, reference_clock = engines("windowed", {"a": (1_000.0, None)}, frozenset())
    who = IDENTITIES["a"]

    def produces(n: int, size: int, step_ms: int) -> list[RequestVerdict]:
        """n Produce requests of `size` bytes, `step_ms` apart, on both engines: the same verdicts."""
        out = []
        for _ in range(n):
            got, expected = quick.produce(None, who, size, None), reference.produce(None, who, size, None)
            assert seen_verdict(got) == seen_verdict(expected)
            assert seen_sensors(quick) == seen_sensors(reference)
            out.append(got)
            quick_clock.advance(step_ms)
            reference_clock.advance(step_ms)
        return out

    def shares(share: float) -> None:
        for engine in (quick, reference):
            manager = engine.for_broker(None)
            key = manager.check(QuotaKind.PRODUCE, who).key
            manager.set_shares({key: share}, 1.0, busy=frozenset({key}))

    shares(0.1)                     # bound 1 000 x 0.1 = 100 B/s
    produces(150, 9, 100)           # 9 B every 100 ms for 15 s: 90 B/s, under it; the bound of
                                    # 1 000 B/s before the share is older than the retention window
    shares(1.0)                     # bound 1 000 B/s: the rise of 900 B/s is owed
    sensor = next(iter(quick.for_broker(None)._sensors.values()))
    assert sensor.owed > 0          # 900 B/s x the retention window, repaid linearly over it
    # 10 B every 100 ms: 90 + 900 owed + 10 over the window stays under 1 000 B/s, decided by the
    # compiled path (its shared decision carries no observed rate)
    quiet = produces(3, 10, 100)
    assert all(v.throttle_ms == 0 and math.isnan(v.decisions[0].observed) for v in quiet)
    # 400 B every 100 ms: over the bound only with what is owed counted: both throttle
    assert any(v.throttle_ms > 0 for v in produces(10, 400, 100))
    produces(130, 10, 100)          # 13 s more, past the retention window: repaid, and cleared
    assert sensor.owed == 0.0       # (by the compiled path: no sweep is due within these 30 s)
