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

import heapq
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from quotas.clock import FakeClock
from quotas.config import QuotaConfig
from quotas.engine import QuotaEngine
from quotas.entity import ClientIdentity, QuotaKind, SensorKey


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
        request = engine.fetch_request(None, client)
        cap = math.inf if request.fetch_cap_bytes is None else float(max(request.fetch_cap_bytes, 1))
        piece = min(value, cap) if kind is QuotaKind.FETCH else value
        size = int(piece) if kind is QuotaKind.FETCH else 0
        verdict = engine.fetch_response(None, client, size, self._tally(topic, piece), request.throttle_ms)
        if verdict.empty:
            return _Decision(max(verdict.throttle_ms, request.throttle_ms), 0.0)
        return _Decision(max(verdict.delivered_throttle_ms, request.throttle_ms), piece)


def unqueued_response_ms(requests: Iterable[tuple[int, float]]) -> int:
    """One client's response time when it has nothing else in flight: the median recorded wait
    (`(ts_ms, wait_ms)` per request, any order) of the requests that arrived after every earlier
    one of the client had its response; 0 when there is none.

    A throttled produce waits only for the broker's own service time: it is muted from the
    decision, so none of its requests queue behind it. An unthrottled recording of a pipelining
    client (librdkafka sends up to five at once; the broker reads one at a time per connection)
    holds waits of seconds that are the client's own queue, which a throttle removes; a mute from
    such a wait would hold the client far longer than the broker does."""
    free_at = -math.inf
    waits: list[float] = []
    for ts_ms, wait_ms in sorted(requests):
        if ts_ms >= free_at:
            waits.append(wait_ms)
        free_at = max(free_at, ts_ms + wait_ms)
    return round(percentile(waits, 0.5)) if waits else 0


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


class _Client:
    __slots__ = ("muted_until_ms", "queue")

    def __init__(self) -> None:
        self.queue: deque[int] = deque()
        self.muted_until_ms = -(2**62)


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
    enforcer = _Enforcer(config, kind, topics=topics)
    coalesce = kind in _FETCH_KINDS
    from_response = kind in _PRODUCE_KINDS  # KIP-219: the delay starts when the response is sent
    clients: dict[ClientIdentity, _Client] = {}
    admitted_ms: list[int | None] = [None] * len(arrivals)
    remaining = [float(a.value) for a in arrivals]
    throttles: list[Throttle] = []
    backlog_events: list[tuple[int, int, float]] = []  # (ms, 0 arrive / 1 admit, +-value)

    # The heap holds (time the client's head can be decided, sequence, client); arrivals not yet
    # in a queue are fed in time order, so a decision never runs ahead of an arrival before it.
    heap: list[tuple[int, int, ClientIdentity]] = []
    seq = 0
    nxt = 0

    def schedule(who: ClientIdentity, state: _Client) -> None:
        nonlocal seq
        head = arrivals[state.queue[0]].ts_ms
        heapq.heappush(heap, (max(head, state.muted_until_ms), seq, who))
        seq += 1

    while nxt < len(order) or heap:
        due = heap[0][0] if heap else None
        if nxt < len(order) and (due is None or arrivals[order[nxt]].ts_ms <= due):
            i = order[nxt]
            nxt += 1
            a = arrivals[i]
            backlog_events.append((a.ts_ms, 0, a.value))
            state = clients.get(a.client)
            if state is None:
                state = clients[a.client] = _Client()
            state.queue.append(i)
            if len(state.queue) == 1:
                schedule(a.client, state)
            continue
        at_ms, _, who = heapq.heappop(heap)
        if at_ms >= end_ms:
            continue  # not decided within the recording: stays queued (deferred)
        state = clients[who]
        i = state.queue[0]
        a = arrivals[i]
        asked = remaining[i]
        if coalesce:  # a fetch returns what is there: everything this client waits for, to the cap
            asked = sum(remaining[j] for j in state.queue if arrivals[j].ts_ms <= at_ms)
        decision = enforcer.decide(at_ms, a.client, a.topic, asked)
        if decision.throttle_ms > 0:
            throttles.append(Throttle(at_ms, decision.throttle_ms, i))
            state.muted_until_ms = at_ms + (a.response_ms if from_response else 0) + decision.throttle_ms
        delivered = decision.delivered
        if delivered > 0:
            backlog_events.append((at_ms, 1, -delivered))
        while delivered > 0 and state.queue:  # oldest first
            j = state.queue[0]
            part = min(delivered, remaining[j])
            remaining[j] -= part
            delivered -= part
            if remaining[j] <= 1e-9:
                remaining[j] = 0.0
                admitted_ms[j] = at_ms
                state.queue.popleft()
        if state.queue:
            schedule(who, state)

    # The backlog at an instant: arrived by then and not admitted by then (one millisecond's
    # arrivals and admissions net out before it is measured).
    backlog_events.sort(key=lambda e: e[0])
    backlog = peak = 0.0
    for k, (at, _, delta) in enumerate(backlog_events):
        backlog += delta
        if k + 1 == len(backlog_events) or backlog_events[k + 1][0] != at:
            peak = max(peak, backlog)
    admissions = tuple(Admission(i, a.ts_ms, admitted_ms[i], a.value - remaining[i], a.value)
                       for i, a in enumerate(arrivals))
    return ReplayResult(admissions, tuple(throttles), end_ms, peak)


# ------------------------------------------------------------------------------ summaries

@dataclass(frozen=True, slots=True)
class ReplaySummary:
    """One replay in numbers. Rates are per second over the entity's recorded span (first arrival
    to `end_ms`); a throttled second is one that overlaps a mute (a throttle's ``[at, at + ms)``;
    the access log gives the same from `ts_ms` and `throttle_time_ms`); throttle statistics are
    over the throttling decisions (NaN when there were none)."""

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


def summarize(arrivals: Sequence[Arrival], result: ReplayResult) -> ReplaySummary:
    """Numbers of one replay of `arrivals` (see `ReplaySummary`)."""
    seconds = {a.ts_ms // 1000 for a in arrivals}
    start_ms = min((a.ts_ms for a in arrivals), default=result.end_ms)
    span_s = max(result.end_ms - start_ms, 1) / 1000.0
    ms = [float(t.throttle_ms) for t in result.throttles]
    demand = float(sum(a.value for a in arrivals))
    admitted = float(sum(a.admitted_value for a in result.admissions))
    waits = [w for w in (a.wait_ms for a in result.admissions) if w is not None]
    return ReplaySummary(
        active_seconds=len(seconds), span_s=span_s,
        throttled_seconds=len(muted_seconds(result.throttles, result.end_ms)),
        throttles=len(ms), throttle_total_ms=int(sum(ms)),
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
