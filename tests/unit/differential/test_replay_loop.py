"""The replay's three deciders on the same arrivals: the quota engine itself, one sensor's readable
arithmetic (`quotas.replay_loop.replay_sensor`) and its compiled twin
(`quotas._replay_speedups.replay_sensor`).

* the sensor's decisions are the engine's: every admission, throttle and the backlog equal,
  for each kind `SensorDecider` decides, windowed and token bucket;
* the compiled loop is bit-exact to the readable one, on the same columns (values with fractions
  too, as a consumer's demand has).
"""

from __future__ import annotations

from array import array
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotas import QuotaConfig, QuotaEntry, RateConfig, RateModel
from quotas import replay as replay_module
from quotas.entity import ClientIdentity, QuotaEntity, QuotaKind
from quotas.replay import sensor_model
from quotas.replay_loop import SensorModel, replay_sensor, run_loop
from tests.unit.differential.impls import built

KINDS = (QuotaKind.PRODUCE, QuotaKind.PRODUCER_RECORD_RATE, QuotaKind.REQUEST_RATE, QuotaKind.FETCH)
CLIENTS = [ClientIdentity("alice", f"app-{i}") for i in range(3)]


def compiled() -> Any:
    """quotas._replay_speedups."""
    return built(replay_module.COMPILED_MODULE, "quotas._replay_speedups")


@st.composite
def recordings(draw: st.DrawFn, *, whole: bool = True) -> dict[str, Any]:
    """A sharing group's sorted arrivals (up to 3 clients of user alice) and its quota."""
    n = draw(st.integers(1, 120))
    gaps = draw(st.lists(st.integers(0, 700), min_size=n, max_size=n))
    ts = []
    t = 1_767_225_600_000 + draw(st.integers(0, 999))
    for g in gaps:
        t += g
        ts.append(t)
    number = st.integers(0, 60_000).map(float) if whole else st.floats(0, 60_000, allow_nan=False)
    return {
        "ts": ts,
        "client": draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)),
        "value": draw(st.lists(number, min_size=n, max_size=n)),
        "response": draw(st.lists(st.integers(0, 40), min_size=n, max_size=n)),
        "kind": draw(st.sampled_from(KINDS)),
        "bound": draw(st.sampled_from([1.0, 3.0, 1000.0, 20_000.0, 65_536.0, 1_048_576.0])),
        "window": RateConfig(draw(st.integers(2, 11)), draw(st.sampled_from([100, 500, 1000]))),
        "bucket": draw(st.booleans()),
        "end_extra": draw(st.integers(1, 5000)),
    }


def config_of(r: dict[str, Any]) -> QuotaConfig:
    model = RateModel.TOKEN_BUCKET if r["bucket"] else RateModel.WINDOWED
    return QuotaConfig((QuotaEntry(QuotaEntity(user="alice"), {r["kind"]: r["bound"]}),),
                       window=r["window"], rate_model=model)


def columns(r: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    return (array("q", r["ts"]), array("i", r["client"]), array("d", r["value"]), array("q", r["response"]))


def plain(result: Any) -> tuple[Any, ...]:
    return (list(result.admitted_ms), list(result.remaining), list(result.throttle_at_ms),
            list(result.throttle_ms), list(result.throttle_arrival), result.max_backlog, result.max_idle_ms)


@settings(max_examples=150, deadline=None)
@given(recordings())
def test_one_sensors_arithmetic_decides_as_the_engine(r: dict[str, Any]) -> None:
    config, kind = config_of(r), r["kind"]
    model = sensor_model(config, kind, CLIENTS, topics=False)
    if r["bucket"] and kind is QuotaKind.FETCH:  # the engine's own: its last-second guard
        assert model is None
        return
    assert model is not None
    end_ms = r["ts"][-1] + r["end_extra"]
    from_response = kind in (QuotaKind.PRODUCE, QuotaKind.PRODUCER_RECORD_RATE)
    coalesce = kind is QuotaKind.FETCH
    ts, client, value, response = columns(r)
    mine = replay_sensor(ts, client, value, response, end_ms, from_response, coalesce, model)
    enforcer = replay_module._Enforcer(config, kind, topics=False)

    def decide(now_ms: int, who: int, head: int, asked: float) -> tuple[int, float]:
        d = enforcer.decide(now_ms, CLIENTS[who], None, asked)
        return d.throttle_ms, d.delivered

    engine = run_loop(ts, client, value, response, end_ms, from_response=from_response, coalesce=coalesce,
                      decide=decide)
    assert plain(mine)[:6] == plain(engine)[:6]


@settings(max_examples=150, deadline=None)
@given(recordings(whole=False))
def test_the_compiled_loop_is_the_readable_one(r: dict[str, Any]) -> None:
    kind = r["kind"]
    model = SensorModel(kind, r["bound"], r["window"], r["window"].retention_ms if r["bucket"] else None)
    end_ms = r["ts"][-1] + r["end_extra"]
    from_response = kind in (QuotaKind.PRODUCE, QuotaKind.PRODUCER_RECORD_RATE)
    coalesce = kind is QuotaKind.FETCH
    pure = replay_sensor(*columns(r), end_ms, from_response, coalesce, model)
    fast = compiled().replay_sensor(*columns(r), end_ms, from_response, coalesce, model)
    assert plain(fast) == plain(pure)


def test_a_long_idle_sensor_is_left_to_the_engine() -> None:
    # two requests 2 h apart: the engine drops a sensor idle for more than an hour and starts a
    # fresh one; the sensor's arithmetic reports the idle time and the engine decides instead
    config = QuotaConfig((QuotaEntry(QuotaEntity(user="alice"), {QuotaKind.PRODUCE: 100.0}),))
    out = replay_module.replay_columns([0, 7_200_000], [0, 0], [5000.0, 5000.0], [0, 0], CLIENTS[:1], config,
                                       QuotaKind.PRODUCE, end_ms=7_200_001)
    assert out.path == "engine"
    quick = replay_module.replay_columns([0, 1000], [0, 0], [5000.0, 5000.0], [0, 0], CLIENTS[:1], config,
                                         QuotaKind.PRODUCE, end_ms=1001)
    assert quick.path in ("compiled", "pure")


@settings(max_examples=100, deadline=None)
@given(recordings(whole=False))
def test_a_group_no_quota_counts_is_what_the_engine_answers(r: dict[str, Any]) -> None:
    # a baseline that limits bob only: alice's clients are unlimited there. `replay_columns` answers
    # without asking (admitted as they arrive); the engine, asked request by request, the same
    kind = r["kind"]
    model = RateModel.TOKEN_BUCKET if r["bucket"] else RateModel.WINDOWED
    config = QuotaConfig((QuotaEntry(QuotaEntity(user="bob"), {kind: r["bound"]}),), window=r["window"],
                         rate_model=model)
    end_ms = r["ts"][-1] + r["end_extra"]
    ts, client, value, response = columns(r)
    fast = replay_module.replay_columns(ts, client, value, response, CLIENTS, config, kind, end_ms=end_ms)
    assert fast.path == "unlimited"
    enforcer = replay_module._Enforcer(config, kind, topics=False)

    def decide(now_ms: int, who: int, head: int, asked: float) -> tuple[int, float]:
        d = enforcer.decide(now_ms, CLIENTS[who], None, asked)
        return d.throttle_ms, d.delivered

    engine = run_loop(ts, client, value, response, end_ms, from_response=kind in (
        QuotaKind.PRODUCE, QuotaKind.PRODUCER_RECORD_RATE), coalesce=kind is QuotaKind.FETCH, decide=decide)
    assert plain(fast.result)[:5] == plain(engine)[:5]
    # the loop's backlog is a running float sum: adding then removing the same values in one
    # millisecond leaves a residue of ~1e-12 of a unit (seen 3.6e-12), where nothing waited: 0
    assert fast.result.max_backlog == 0.0 and engine.max_backlog == pytest.approx(0.0, abs=1e-6)
