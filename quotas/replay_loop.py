"""The replay's loop over typed columns, and one sensor's decisions: the readable reference.

`run_loop` is the open-loop queue of `quotas.replay` (see its docstring for the model) over
columns sorted by arrival time: `ts_ms`, `client` (0..m-1, the connection), `value`,
`response_ms`. Each decision goes through `decide(now_ms, client, head, asked) -> (throttle_ms,
delivered)` (`head`: the arrival at the head of the client's queue): `quotas.replay`'s seam that
asks the quota engine, or `SensorDecider`, which makes
the same decisions for the common case of one sharing group in one sensor (a windowed rate or a
token bucket, no shadow, no fleet share) with the engine's own arithmetic (`quotas.stats`,
`quotas.throttle`) and none of its lookups.

`quotas._replay_speedups.replay_sensor` is the compiled twin of `run_loop` with `SensorDecider`
(tests/unit/differential hold them bit-exact, and `SensorDecider` to the engine's decisions).

The loop keeps, per client, a linked queue of its waiting arrivals and the running sum of what
they still want (a fetch asks for all of it: a fetch returns what is there), one heap entry per
client with a non-empty queue at ``max(head's arrival, end of its mute, its last decision)``,
and the backlog (arrived, not admitted) measured at the end of each millisecond. Time never runs
backwards: an arrival is fed before any decision due at or after it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from quotas.entity import QuotaKind
from quotas.stats import RateConfig, SampledRate, TokenBucket
from quotas.throttle import bucket_throttle_time_ms, throttle_time_ms

NOT_ADMITTED = -(2**63)
"""`LoopResult.admitted_ms` of an arrival still (partly) waiting at the end."""

_LONG_AGO = -(2**62)

Decide = Callable[[int, int, int, float], tuple[int, float]]


@dataclass(frozen=True, slots=True)
class LoopResult:
    """Per arrival (in the sorted input order) when its last piece was admitted
    (`NOT_ADMITTED`: waiting at the end) and what of it was still waiting; per throttling
    decision its instant, its throttle and the arrival at the head of its client's queue; the
    largest backlog; the longest a sensor went without a record before a decision
    (`SensorDecider` only, else 0: past the engine's idle expiry it would have been dropped)."""

    admitted_ms: Sequence[int]
    remaining: Sequence[float]
    throttle_at_ms: Sequence[int]
    throttle_ms: Sequence[int]
    throttle_arrival: Sequence[int]
    max_backlog: float
    max_idle_ms: int


def run_loop(ts_ms: Sequence[int], client: Sequence[int], value: Sequence[float],
             response_ms: Sequence[int], end_ms: int, *, from_response: bool, coalesce: bool,
             decide: Decide) -> LoopResult:
    """The open-loop queue over sorted columns; `from_response`: a throttle's mute starts after
    the head's `response_ms` (a produce, KIP-219); `coalesce`: a decision asks for everything the
    client waits for (a fetch), else for the head alone."""
    n = len(ts_ms)
    m = max(client) + 1 if n else 0
    admitted = [NOT_ADMITTED] * n
    remaining = [float(v) for v in value]
    after = [-1] * n  # the next arrival in the same client's queue
    head = [-1] * m
    tail = [-1] * m
    queued = [0.0] * m
    muted_until = [_LONG_AGO] * m
    last_at = [_LONG_AGO] * m
    heap: list[tuple[int, int, int]] = []
    seq = 0
    t_at: list[int] = []
    t_ms: list[int] = []
    t_arrival: list[int] = []
    backlog = peak = 0.0
    backlog_ms = _LONG_AGO
    i = 0
    while i < n or heap:
        if i < n and (not heap or ts_ms[i] <= heap[0][0]):
            c = client[i]
            at = ts_ms[i]
            if at != backlog_ms:
                peak = max(peak, backlog)
                backlog_ms = at
            backlog += value[i]
            queued[c] += value[i]
            if head[c] < 0:
                head[c] = tail[c] = i
                heapq.heappush(heap, (max(at, muted_until[c], last_at[c]), seq, c))
                seq += 1
            else:
                after[tail[c]] = i
                tail[c] = i
            i += 1
            continue
        at, _, c = heapq.heappop(heap)
        if at >= end_ms:
            continue  # not decided within the recording: stays queued (deferred)
        j = head[c]
        # a fetch asks for all its client waits for, and never less than the head still wants:
        # `queued` is a running float sum, and drifted ~1e-10 below the head's remainder it asked
        # for nothing, was given nothing and was decided again at the same instant, for ever
        # (seen in bench_tune's 1 M-record simulation: a worker at one `now` for minutes)
        throttle, delivered = decide(at, c, j, max(queued[c], remaining[j]) if coalesce else remaining[j])
        last_at[c] = at
        if throttle > 0:
            t_at.append(at)
            t_ms.append(throttle)
            t_arrival.append(j)
            muted_until[c] = at + (response_ms[j] if from_response else 0) + throttle
        if delivered > 0:
            if at != backlog_ms:
                peak = max(peak, backlog)
                backlog_ms = at
            backlog -= delivered
            queued[c] -= delivered
        # oldest first; an arrival with nothing left (or nothing at all) is admitted now
        while j >= 0 and (delivered > 0 or remaining[j] <= 1e-9):
            part = min(delivered, remaining[j])
            remaining[j] -= part
            delivered -= part
            if remaining[j] > 1e-9:
                break
            remaining[j] = 0.0
            admitted[j] = at
            j = after[j]
        head[c] = j
        if j < 0:
            queued[c] = 0.0
        if j >= 0:
            heapq.heappush(heap, (max(ts_ms[j], muted_until[c], at), seq, c))
            seq += 1
    peak = max(peak, backlog)
    return LoopResult(admitted, remaining, t_at, t_ms, t_arrival, peak, 0)


def replay_sensor(ts_ms: Sequence[int], client: Sequence[int], value: Sequence[float],
                  response_ms: Sequence[int], end_ms: int, from_response: bool, coalesce: bool,
                  model: SensorModel) -> LoopResult:
    """`run_loop` with one sensor's decisions (`SensorDecider`): the reference of the compiled
    `quotas._replay_speedups.replay_sensor`, which takes the same arguments."""
    decider = SensorDecider(model)
    out = run_loop(ts_ms, client, value, response_ms, end_ms, from_response=from_response,
                   coalesce=coalesce, decide=decider.decide)
    return LoopResult(out.admitted_ms, out.remaining, out.throttle_at_ms, out.throttle_ms,
                      out.throttle_arrival, out.max_backlog, decider.max_idle_ms)


_PRODUCE_LIKE = (QuotaKind.PRODUCE, QuotaKind.PRODUCER_RECORD_RATE)
FAST_KINDS = frozenset((QuotaKind.PRODUCE, QuotaKind.PRODUCER_RECORD_RATE, QuotaKind.REQUEST_RATE,
                        QuotaKind.FETCH))
"""The kinds `SensorDecider` decides (a consumer_record_rate fetch is capped by what the engine
remembers of the last fetch's bytes per record: the engine decides it)."""


@dataclass(frozen=True, slots=True)
class SensorModel:
    """One sensor's quota as the engine binds it: the bound (units per second), the window,
    the token bucket's burst in ms (None: the windowed rate), and the kind decided."""

    kind: QuotaKind
    bound: float
    window: RateConfig
    burst_ms: int | None

    @property
    def fetch_cap(self) -> float:
        """The engine's fetch cap (`QuotaManager.max_value_in_quota_window`, KAFKA-9677) as the
        replay asks with it: whole bytes, at least 1."""
        from quotas.manager import BUCKET_REQUEST_CAP_MS

        if self.burst_ms is not None:
            cap = self.bound * min(BUCKET_REQUEST_CAP_MS / 1000.0, (self.burst_ms / 1000.0) / 2)
        else:
            cap = self.bound * (self.window.samples - 1) * (self.window.window_ms / 1000.0)
        return float(max(int(cap), 1))


class SensorDecider:
    """`decide` for one sensor (`SensorModel`), as the engine's verbs decide for it:

    * produce and request_rate: record (the bytes, the records, or 1 request; whole numbers),
      then check; the value is admitted and the throttle mutes what follows;
    * fetch: a piece of at most the cap; windowed: record, check, and if throttled un-record it
      and answer empty; token bucket: a fetch in debt is emptied unrecorded, one in credit is
      delivered and its debt mutes what follows.

    The check is `QuotaManager._decide`'s: the windowed rate's throttle
    ``(rate - bound) / bound x window`` or the bucket's time to refill to zero, capped at one
    window for request_rate."""

    def __init__(self, model: SensorModel) -> None:
        self.model = model
        self._bound = model.bound
        self._rate = SampledRate(model.window)
        self._bucket = TokenBucket() if model.burst_ms is not None else None
        self._burst_s = (model.burst_ms or 0) / 1000.0
        self._cap_ms = model.window.window_ms if model.kind.caps_throttle else None
        self._cap = model.fetch_cap if model.kind is QuotaKind.FETCH else 0.0
        self._last_record_ms: int | None = None
        self.max_idle_ms = 0

    def _record(self, value: float, now_ms: int) -> None:
        self._last_record_ms = now_ms
        self._rate.record(value, now_ms)
        if self._bucket is not None:
            self._bucket.record(value, self._bound, self._bound * self._burst_s, now_ms)

    def _check(self, now_ms: int) -> int:
        bound = self._bound
        if self._bucket is not None:
            credits = self._bucket.measure(bound, bound * self._burst_s, now_ms)
            throttle = bucket_throttle_time_ms(credits, bound)
        else:
            total, window_ms = self._rate.measure_parts(now_ms)
            observed = total / (window_ms / 1000.0)
            throttle = throttle_time_ms(observed, bound, window_ms) if observed > bound else 0
        return throttle if self._cap_ms is None else min(throttle, self._cap_ms)

    def decide(self, now_ms: int, client: int, head: int, asked: float) -> tuple[int, float]:
        if self._last_record_ms is None:
            self._last_record_ms = now_ms  # the sensor is created at its first decision
        self.max_idle_ms = max(self.max_idle_ms, now_ms - self._last_record_ms)
        kind = self.model.kind
        if kind in _PRODUCE_LIKE:
            self._record(int(asked), now_ms)
            return self._check(now_ms), asked
        if kind is QuotaKind.REQUEST_RATE:
            self._record(1.0, now_ms)
            return self._check(now_ms), asked
        piece = min(asked, self._cap)
        size = int(piece)
        if self._bucket is not None:
            before = self._check(now_ms)
            if before > 0:  # in debt: emptied, not recorded
                return before, 0.0
            self._record(size, now_ms)
            return self._check(now_ms), piece  # delivered; its debt mutes what follows
        self._record(size, now_ms)
        throttle = self._check(now_ms)
        if throttle > 0:
            self._record(-size, now_ms)  # emptied: un-recorded
            return throttle, 0.0
        return 0, piece
