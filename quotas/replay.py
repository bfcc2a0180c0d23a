"""Replay recorded request arrivals through the quota engine under a candidate quota config.

Sans I/O: arrivals, a `QuotaConfig` (its entries, window and rate model) -> per request when it
was admitted, the throttle each decision gave, and what was still waiting at the end. Time is a
`FakeClock` moved to each decision's instant; nothing here reads a file or a socket.

The model is Kafka's enforcement (kafka-quota-semantics.md §2, §5) as an open-loop queue:

* A client (principal, client id) is one connection. A decision at time ``a`` that throttles by
  ``T`` mutes the client until ``a + T``; a produce's delay starts when its response is sent
  (KIP-219, as the engine's adapter does: the channel is muted at the decision and the delay runs
  from the response), so a produce whose recorded response took ``L`` ms mutes it until
  ``a + L + T``. A request of that client that arrives before then waits,
  in arrival order, and is read at the end of the mute (the backlog carries over: every request
  behind it waits too). Arrivals are never dropped and never slowed down by the client itself
  (open loop: the recording says when the client wanted to send).
* Produce and every other kind: record, then check (the value stays recorded, the request is
  admitted, the throttle mutes what follows).
* Fetch: `fetch_request` then `fetch_response`. A throttled windowed fetch is answered empty and its bytes
  are un-recorded (Kafka's un-record); the bytes stay at the head of the client's queue and are
  asked for again when the mute ends. Under the token bucket a fetch in credit is delivered and
  its debt mutes what follows; one in debt is emptied. A response is never larger than the
  engine's fetch cap (KAFKA-9677 caps the consumer's max_bytes with it): a larger recorded
  response is delivered in several fetches. A fetch returns what is there, so the fetch read
  when a mute ends carries every recorded response the consumer waited for, up to the cap (after
  a long mute a consumer asks for its whole backlog, and one response can fill the window).

Every decision goes through ONE seam, `_Enforcer`, the only code that calls the engine
(`quotas.engine.QuotaEngine`, the verbs the proxy calls: `produce`, `fetch_request` and
`fetch_response`, `request`), with the plan's values of the one replayed key.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from contracts.compiled import choose
from quotas.clock import FakeClock
from quotas.config import QuotaConfig
from quotas.engine import QuotaEngine
from quotas.entity import ClientIdentity, QuotaKind, SensorKey
from quotas.manager import DEFAULT_SENSOR_IDLE_EXPIRY_MS
from quotas.replay_loop import (
    FAST_KINDS,
    NOT_ADMITTED,
    LoopResult,
    SensorModel,
    replay_sensor,
    run_loop,
)


@dataclass(frozen=True, slots=True)
class Arrival:
    """One recorded request for the replayed quota kind.

    `client` is the connection (it is muted, and asks the engine); `topic` is set when the replay
    is of a topic budget: `value` is then what the request carried for that topic. `value` is what
    the kind counts (bytes, records, or 1 for a request). `response_ms` is how long the recorded
    request waited for the broker's response (the access log's `upstream_latency_ms`; 0 when it
    got none): a produce's throttle delay starts after it."""

    ts_ms: int
    client: ClientIdentity
    value: float
    topic: str | None = None
    response_ms: int = 0


@dataclass(frozen=True, slots=True)
class Throttle:
    """One decision that throttled: when (ms), by how much (ms), and which arrival it was for."""

    at_ms: int
    throttle_ms: int
    arrival: int


@dataclass(frozen=True, slots=True)
class Admission:
    """What became of one arrival: when its value was admitted (the last piece, for a fetch
    delivered in pieces), `None` while it was still waiting at the end; `admitted_value` is how
    much of it was admitted by then."""

    arrival: int
    arrival_ms: int
    admitted_ms: int | None
    admitted_value: float
    value: float

    @property
    def wait_ms(self) -> int | None:
        return None if self.admitted_ms is None else self.admitted_ms - self.arrival_ms


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Per arrival (in input order) its admission; every throttling decision in time order;
    `end_ms`, the instant the replay stopped (what was not admitted by then is deferred);
    `max_backlog`, the largest value that had arrived and was not admitted yet at any instant."""

    admissions: tuple[Admission, ...]
    throttles: tuple[Throttle, ...]
    end_ms: int
    max_backlog: float

    @property
    def deferred(self) -> float:
        """Value that had arrived by `end_ms` and was not admitted."""
        return sum(a.value - a.admitted_value for a in self.admissions)


@dataclass(frozen=True, slots=True)
class _Decision:
    throttle_ms: int
    delivered: float  # how much of the value the client received (0: emptied and un-recorded)


@dataclass(frozen=True, slots=True)
class _Tally:
    """A request's usage as the engine reads it (`quotas.engine.TopicTally`)."""

    bytes_by_topic: Mapping[str, int]
    records_by_topic: Mapping[str, int]
    records: int


def only(config: QuotaConfig, kind: QuotaKind, *, topics: bool) -> QuotaConfig:
    """`config` with only `kind`'s values of the client entities (or, with `topics`, of the topic
    entities): one key replayed alone (its own throttles, not another key's)."""
    entries = tuple(replace(e, values={kind: e.values[kind]}) for e in config
                    if kind in e.values and e.entity.is_topic == topics)
    return replace(config, entries=entries)


_PRODUCE_KINDS = (QuotaKind.PRODUCE, QuotaKind.PRODUCER_RECORD_RATE)
_FETCH_KINDS = (QuotaKind.FETCH, QuotaKind.CONSUMER_RECORD_RATE)


class _Enforcer:
    """The seam: the only code that asks the quota engine (`QuotaEngine`'s verbs, one broker
    scope: a replay is one sharing group of one broker, or of the cluster)."""

    def __init__(self, config: QuotaConfig, kind: QuotaKind, *, topics: bool) -> None:
        if kind is QuotaKind.REQUEST_PERCENTAGE:
            raise ValueError("request_percentage is broker thread time: the access log does not have it")
        self._clock = FakeClock(0)
        self._kind = kind
        self._topics = topics
        self._engine = QuotaEngine(only(config, kind, topics=topics), self._clock)

    def _tally(self, topic: str | None, value: float) -> _Tally | None:
        """Usage for a records kind or a topic budget: the value on its topic."""
        if self._kind in (QuotaKind.PRODUCER_RECORD_RATE, QuotaKind.CONSUMER_RECORD_RATE):
            records = int(value)
            return _Tally({topic or "": 0}, {topic or "": records}, records)
        if self._topics:
            return _Tally({topic or "": int(value)}, {topic or "": 0}, 0)
        return None

    def decide(self, now_ms: int, client: ClientIdentity, topic: str | None, value: float) -> _Decision:
        self._clock.set(now_ms)
        engine, kind = self._engine, self._kind
        if kind in _PRODUCE_KINDS:
            size = int(value) if kind is QuotaKind.PRODUCE else 0
            return _Decision(engine.produce(None, client, size, self._tally(topic, value)).throttle_ms, value)
        if kind is QuotaKind.REQUEST_RATE:
            return _Decision(engine.request(None, client).throttle_ms, value)
        # a topic budget caps the fetch of its topic as the proxy does (`topic_fetch_cap`)
        request = engine.fetch_request(None, client, topics=(topic,) if self._topics and topic else ())
        cap = math.inf if request.fetch_cap_bytes is None else float(max(request.fetch_cap_bytes, 1))
        piece = min(value, cap) if kind is QuotaKind.FETCH else value
        size = int(piece) if kind is QuotaKind.FETCH else 0
        verdict = engine.fetch_response(None, client, size, self._tally(topic, piece), request.throttle_ms)
        if verdict.empty:
            return _Decision(max(verdict.throttle_ms, request.throttle_ms), 0.0)
        return _Decision(max(verdict.delivered_throttle_ms, request.throttle_ms), piece)


def service_time_ms(requests: Iterable[tuple[int, float]]) -> int:
    """A broker's produce service time: the mean recorded wait (`(ts_ms, wait_ms)` per produce
    sent to the broker, by every client, any order) of the produces that arrived when the broker
    had no other produce in flight (every earlier one had its response), rounded to whole ms; 0
    when there is none. The mean, not the median: a throttled client's n cycles of mute last
    n x (service + throttle), so what its throttle total loses to the service time is n times the
    mean (on a loaded machine the waits have a tail: median 1 ms, mean 2.5 to 4 ms, p99 26 to
    54 ms in four recordings at load 18 to 27).

    A throttled produce's delay starts when its response is sent (KIP-219), so the replay mutes
    its client for the broker's response time plus the throttle. That response time is the
    broker's, under the load of the run being predicted, not the client's: a throttled client has
    one produce in flight (its channel is muted from the decision), so it waits for no queue of its
    own. The recorded waits hold queues that the plan removes: a pipelining client's own (librdkafka
    sends up to five at once and the broker reads one at a time per connection) and every other
    client's (an unthrottled flooder's requests ahead of it). In one unthrottled recording on a
    loaded 2-core machine every produce of one bursty client waited >= 362 ms, so the median of
    its own unqueued waits was >= 362 ms, while the broker answered the same clients in 1 to 3 ms
    in the throttled run that followed; in another, one producer's waits ran from 0 to 5.3 s
    (median 192 ms) while the 1,890 produces that found the broker idle waited 1 ms (median).
    With a throttle of T ~80 ms per cycle (a 4 KiB batch at 50 KiB/s), a mute of 362 + T ms
    where the run mutes ~2 + T is a cycle (362 + 80) / (2 + 80) = 5.4x too long.
    The broker-wide mean of idle-broker waits takes the broker's service time under the load of
    its whole recording (a machine that is slow throughout is slow in it too), and none of the
    queues."""
    free_at = -math.inf
    waits: list[float] = []
    for ts_ms, wait_ms in sorted(requests):
        if ts_ms >= free_at:
            waits.append(wait_ms)
        free_at = max(free_at, ts_ms + wait_ms)
    return round(math.fsum(waits) / len(waits)) if waits else 0


class SharingGroups:
    """Which sharing group (sensor) the engine counts an identity in under `config`, by the
    engine's own precedence rules; `None` for an identity no quota of the kind limits."""

    def __init__(self, config: QuotaConfig, *, topics: bool = False) -> None:
        self._engine = QuotaEngine(config, FakeClock(0))
        self._topics = topics

    def of(self, kind: QuotaKind, identity: ClientIdentity) -> SensorKey | None:
        """`identity` is the client, or `topic_identity(topic)` for a topic budget."""
        manager = self._engine.for_topics(None) if self._topics else self._engine.for_broker(None)
        if manager is None:
            return None
        decision = manager.check(kind, identity)  # records nothing
        return decision.key if decision.bound is not None else None


_CHOICE: Final = choose("quotas._replay_speedups")
COMPILED_MODULE: Final = _CHOICE.compiled_module
"""quotas._replay_speedups if it was built (whatever SLUICE_PURE_PYTHON says: the tests use both)."""
IMPLEMENTATION: Final = _CHOICE.implementation


def unlimited(config: QuotaConfig, kind: QuotaKind, clients: Iterable[ClientIdentity]) -> bool:
    """No client quota of `kind` under `config` counts any of `clients` (the engine's own
    precedence decides: each one's sensor has no bound)."""
    manager = QuotaEngine(only(config, kind, topics=False), FakeClock(0)).for_broker(None)
    return all(manager.check(kind, who).bound is None for who in clients)


def sensor_model(config: QuotaConfig, kind: QuotaKind, clients: Iterable[ClientIdentity], *,
                 topics: bool) -> SensorModel | None:
    """The one sensor every client in `clients` is counted in for `kind` under `config`, when
    `SensorDecider` decides for it as the engine would (client quotas of a `FAST_KINDS` kind, one
    sharing group with a positive bound, not shadow, not a token bucket's fetch); None otherwise
    (the engine decides)."""
    if topics or kind not in FAST_KINDS:
        return None
    engine = QuotaEngine(only(config, kind, topics=False), FakeClock(0))
    manager = engine.for_broker(None)
    keys = set()
    decision = None
    for who in clients:
        decision = manager.check(kind, who)
        keys.add(decision.key)
    if decision is None or len(keys) != 1 or decision.bound is None or decision.shadow:
        return None
    if not decision.bound > 0:
        return None
    entity = decision.entity
    shape = config.bucket_of(None if entity is None else config.get(entity))
    if shape is not None and kind is QuotaKind.FETCH:
        return None  # a token bucket's fetch also waits for the last second's deliveries: the engine's
    return SensorModel(kind, decision.bound, config.window, None if shape is None else shape.burst_ms)


def _typed(column: Sequence[Any], code: str) -> Any:
    """A column as a buffer of C `code` values (an array of them already is one)."""
    try:
        view = memoryview(column)  # type: ignore[arg-type]
    except TypeError:
        return array(code, column)
    return column if view.itemsize == array(code).itemsize and view.ndim == 1 else array(code, column)


@dataclass(frozen=True, slots=True)
class ReplayColumns:
    """`replay_columns`' answer, per arrival in the sorted input: `LoopResult`'s columns, and
    which path decided (`compiled`, `pure`: one sensor's arithmetic; `engine`)."""

    result: LoopResult
    end_ms: int
    path: str


Column = Any
"""A column: a sequence, or a buffer of C values (an `array.array`, a NumPy array)."""


def replay_columns(ts_ms: Column, client: Column, value: Column, response_ms: Column,
                   identities: Sequence[ClientIdentity], config: QuotaConfig,
                   kind: QuotaKind, *, topic: Sequence[str | None] | None = None, topics: bool = False,
                   end_ms: int) -> ReplayColumns:
    """The replay over columns sorted by `ts_ms` (ties replay in the given order): `client`
    indexes `identities`; `topic` (with `topics`) names each arrival's topic. One sharing group
    in one sensor is decided by its arithmetic (`quotas.replay_loop.SensorDecider`, compiled when
    built), anything else by the engine; both with the same loop."""
    from_response = kind in _PRODUCE_KINDS  # KIP-219: the delay starts when the response is sent
    coalesce = kind in _FETCH_KINDS
    # no quota of the kind, or none that counts any of these clients (a baseline with quotas
    # for other entities only): nothing ever waits. The engine, asked, answers every decision
    # with no throttle and everything asked for, at the instant it arrives (in bench_tune's
    # 1 M-record simulation 48 of the 192 replays were of such groups, and took 90 % of its time)
    if not len(only(config, kind, topics=topics)) or (not topics and unlimited(config, kind, identities)):
        return ReplayColumns(LoopResult([t if t < end_ms else NOT_ADMITTED for t in ts_ms],
                                        [0.0 if t < end_ms else float(v)
                                         for t, v in zip(ts_ms, value, strict=True)],
                                        [], [], [], 0.0, 0), end_ms, "unlimited")
    if len(ts_ms) and not topics:
        model = sensor_model(config, kind, identities, topics=topics)
        if model is not None:
            compiled = _CHOICE.active
            if compiled is not None:
                out = compiled.replay_sensor(_typed(ts_ms, "q"), _typed(client, "i"),
                                             _typed(value, "d"), _typed(response_ms, "q"), end_ms,
                                             from_response, coalesce, model)
                path = "compiled"
            else:
                out = replay_sensor(ts_ms, client, value, response_ms, end_ms, from_response, coalesce, model)
                path = "pure"
            # a sensor idle for longer than the engine keeps one is dropped and starts afresh:
            # the engine decides such a recording
            if out.max_idle_ms <= DEFAULT_SENSOR_IDLE_EXPIRY_MS:
                return ReplayColumns(out, end_ms, path)
    enforcer = _Enforcer(config, kind, topics=topics)

    def decide(now_ms: int, who: int, head: int, asked: float) -> tuple[int, float]:
        decision = enforcer.decide(now_ms, identities[who], None if topic is None else topic[head], asked)
        return decision.throttle_ms, decision.delivered

    out = run_loop(ts_ms, client, value, response_ms, end_ms, from_response=from_response,
                   coalesce=coalesce, decide=decide)
    return ReplayColumns(out, end_ms, "engine")


def replay(arrivals: Sequence[Arrival], config: QuotaConfig, kind: QuotaKind, *,
           topics: bool = False, end_ms: int | None = None) -> ReplayResult:
    """Replay `arrivals` (any order; ties keep input order) under `config` for quota `kind`.

    `topics` replays the topic budgets (each arrival's `topic`) instead of the client ones.
    `end_ms` defaults to one millisecond after the last arrival: a decision due later is not
    made, and what waits for it is deferred."""
    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i].ts_ms)
    if end_ms is None:
        end_ms = arrivals[order[-1]].ts_ms + 1 if arrivals else 0
    if not len(only(config, kind, topics=topics)):  # no quota of the kind: nothing ever waits
        return ReplayResult(tuple(Admission(i, a.ts_ms, a.ts_ms, float(a.value), float(a.value))
                                  if a.ts_ms < end_ms else Admission(i, a.ts_ms, None, 0.0, float(a.value))
                                  for i, a in enumerate(arrivals)), (), end_ms, 0.0)
    index: dict[ClientIdentity, int] = {}
    identities: list[ClientIdentity] = []
    clients: list[int] = []
    for i in order:  # a client is a connection: one queue, whatever the topics of its requests
        who = arrivals[i].client
        if who not in index:
            index[who] = len(identities)
            identities.append(who)
        clients.append(index[who])
    out = replay_columns([arrivals[i].ts_ms for i in order], clients,
                         [float(arrivals[i].value) for i in order],
                         [arrivals[i].response_ms for i in order], identities, config, kind,
                         topic=[arrivals[i].topic for i in order], topics=topics, end_ms=end_ms).result
    admitted: list[int | None] = [None] * len(arrivals)
    remaining = [0.0] * len(arrivals)
    for k, i in enumerate(order):
        at = out.admitted_ms[k]
        admitted[i] = None if at == NOT_ADMITTED else int(at)
        remaining[i] = float(out.remaining[k])
    throttles = tuple(Throttle(int(at), int(ms), order[int(k)])
                      for at, ms, k in zip(out.throttle_at_ms, out.throttle_ms, out.throttle_arrival,
                                           strict=True))
    admissions = tuple(Admission(i, a.ts_ms, admitted[i], a.value - remaining[i], a.value)
                       for i, a in enumerate(arrivals))
    return ReplayResult(admissions, throttles, end_ms, float(out.max_backlog))


# ------------------------------------------------------------------------------ summaries

@dataclass(frozen=True, slots=True)
class ReplaySummary:
    """One replay in numbers. Rates are per second over the entity's recorded span (first arrival
    to `end_ms`); a throttled second is one that overlaps a mute (a throttle's ``[at, at + ms)``;
    the access log gives the same from `ts_ms` and `throttle_time_ms`); an active second is one
    with an arrival or a throttled one (a mute holds a client that would have sent: a recording
    made under a quota has no request in a second its client spent muted), so the throttled
    seconds are never more than the active ones; `throttle_total_ms` is the time muted within
    the recording (each mute up to `end_ms`: what a throttle decided near the end holds the client
    after it is no part of the recording, and how much of it falls after the end depends on the
    phase of the last mute, up to a whole one); the other throttle statistics are over the
    throttling decisions, whole (NaN when there were none)."""

    active_seconds: int
    span_s: float
    throttled_seconds: int
    throttles: int
    throttle_total_ms: int
    throttle_mean_ms: float
    throttle_p50_ms: float
    throttle_p99_ms: float
    throttle_max_ms: float
    demand: float
    admitted: float
    demand_per_s: float
    admitted_per_s: float
    deferred: float
    max_backlog: float
    max_wait_ms: int

    @property
    def throttled_share(self) -> float:
        """Throttled seconds over active seconds (0 when there were none)."""
        return self.throttled_seconds / self.active_seconds if self.active_seconds else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between the two nearest ranks (numpy's default); NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def muted_seconds(throttles: Iterable[Throttle], end_ms: int) -> set[int]:
    """The whole seconds (epoch s) that overlap a mute ``[at, at + throttle)``, up to `end_ms`."""
    seconds: set[int] = set()
    for t in throttles:
        stop = min(t.at_ms + t.throttle_ms, end_ms)
        if stop > t.at_ms:
            seconds.update(range(t.at_ms // 1000, (stop - 1) // 1000 + 1))
    return seconds


def muted_ms(throttles: Iterable[Throttle], end_ms: int) -> int:
    """The throttles' time up to `end_ms`: each mute ``[at, at + throttle)`` cut at the end."""
    return sum(max(min(t.at_ms + t.throttle_ms, end_ms) - t.at_ms, 0) for t in throttles)


def summarize(arrivals: Sequence[Arrival], result: ReplayResult) -> ReplaySummary:
    """Numbers of one replay of `arrivals` (see `ReplaySummary`)."""
    muted = muted_seconds(result.throttles, result.end_ms)
    seconds = {a.ts_ms // 1000 for a in arrivals} | muted
    start_ms = min((a.ts_ms for a in arrivals), default=result.end_ms)
    span_s = max(result.end_ms - start_ms, 1) / 1000.0
    ms = [float(t.throttle_ms) for t in result.throttles]
    demand = float(sum(a.value for a in arrivals))
    admitted = float(sum(a.admitted_value for a in result.admissions))
    waits = [w for w in (a.wait_ms for a in result.admissions) if w is not None]
    return ReplaySummary(
        active_seconds=len(seconds), span_s=span_s,
        throttled_seconds=len(muted),
        throttles=len(ms), throttle_total_ms=muted_ms(result.throttles, result.end_ms),
        throttle_mean_ms=sum(ms) / len(ms) if ms else math.nan,
        throttle_p50_ms=percentile(ms, 0.5), throttle_p99_ms=percentile(ms, 0.99),
        throttle_max_ms=max(ms) if ms else math.nan,
        demand=demand, admitted=admitted, demand_per_s=demand / span_s, admitted_per_s=admitted / span_s,
        deferred=demand - admitted, max_backlog=result.max_backlog, max_wait_ms=max(waits, default=0))


def replay_summary(arrivals: Iterable[Arrival], config: QuotaConfig, kind: QuotaKind, *,
                   topics: bool = False, end_ms: int | None = None) -> ReplaySummary:
    """`replay` then `summarize`."""
    listed = list(arrivals)
    return summarize(listed, replay(listed, config, kind, topics=topics, end_ms=end_ms))
