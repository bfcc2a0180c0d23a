"""The quota manager: Kafka's `ClientQuotaManager` without threads, delay queues or exceptions.

Per request the proxy calls `record_and_check(kind, identity, value)` and gets a
`ThrottleDecision`. Semantics follow Kafka exactly:

* Record, then check: the value stays recorded; a violation is ``rate > bound`` (strictly).
* The throttle is ``round_half_up((rate - bound) / bound * window_size)``; request kinds cap it
  at one window (`RateConfig.window_ms`), byte rates are uncapped.
* Nothing is recorded for a kind until a quota of that kind has been configured (Kafka's
  ``quotasEnabled``; always on with a custom callback).
* A config update keeps every sensor and its history and only swaps bounds; a removed quota
  makes a sensor unlimited. Callers whose sharing group changes move to a new sensor.
* A sensor that saw no record for longer than `sensor_idle_expiry_ms` (1 h) is dropped with its
  history. Expiry runs lazily every 30 s of clock time, as Kafka's `ExpireSensorTask` does.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from quotas.callback import DefaultQuotaCallback, EntityMatcher, QuotaCallback, RecordObserver
from quotas.clock import Clock
from quotas.cluster import ClusterView
from quotas.config import QuotaConfig
from quotas.entity import ClientIdentity, QuotaEntity, QuotaKind, SensorKey
from quotas.errors import QuotaConfigError
from quotas.fastpath import SampledRateImpl, TokenBucketImpl
from quotas.stats import METRIC_WINDOW, RateConfig, RecentSum, SampledAvgMax, SampledRate, TokenBucket
from quotas.throttle import bucket_throttle_time_ms, throttle_time_ms

#: Kafka's `INACTIVE_SENSOR_EXPIRATION_TIME_SECONDS`.
DEFAULT_SENSOR_IDLE_EXPIRY_MS = 3_600_000
#: How often (in clock time) the manager sweeps idle sensors; Kafka's `ExpireSensorTask` period.
SENSOR_SWEEP_INTERVAL_MS = 30_000
#: Under the token bucket a fetch asks for at most this much quota (`max_value_in_quota_window`).
BUCKET_REQUEST_CAP_MS = 100
#: Under the token bucket no second delivers more fetch bytes than the bound x this + the burst.
PEAK_SECOND_MS = 1000

_CAPPED_KINDS = frozenset(k for k in QuotaKind if k.caps_throttle)


@dataclass(frozen=True, slots=True)
class ThrottleDecision:
    """The outcome of one quota check. Never raised, always returned.

    `would_throttle_ms` is what Kafka would throttle; `throttle_time_ms` is what to enforce, 0 in
    shadow mode. `bound` is `None` when the caller is unlimited; `entity` is the configured entity
    whose value applied, when the callback can tell. `observed` is the rate measured after the
    record; NaN in a decision that did not throttle when the engine's compiled common case made it
    (`quotas.fastpath.QuickChargeImpl`: one decision per budget, made once; the sensor has the rate).
    """

    kind: QuotaKind
    key: SensorKey
    would_throttle_ms: int
    observed: float
    bound: float | None
    shadow: bool = False
    entity: QuotaEntity | None = None

    @property
    def throttle_time_ms(self) -> int:
        """The throttle to enforce: `would_throttle_ms`, or 0 for a shadow decision."""
        return 0 if self.shadow else self.would_throttle_ms

    @property
    def violated(self) -> bool:
        return self.would_throttle_ms > 0


@dataclass(frozen=True, slots=True)
class FetchAdmission:
    """`QuotaManager.admit_fetch`'s outcome: the decision; whether the bytes were recorded (to be
    un-recorded if the response is emptied); whether a throttle in it is debt the delivered fetch
    ran up (token bucket: it delays what follows, it does not empty this one)."""

    decision: ThrottleDecision
    recorded: bool
    throttle_is_debt: bool


@dataclass(frozen=True, slots=True)
class ThrottleStats:
    """Non-zero throttle times of one sensor since it was created (count, sum and maximum, ms)."""

    count: int = 0
    total_ms: int = 0
    max_ms: int = 0

    @property
    def avg_ms(self) -> float:
        """Mean of the non-zero throttles, NaN when there were none (as Kafka's `throttle-time`)."""
        return self.total_ms / self.count if self.count else math.nan


@dataclass(frozen=True, slots=True)
class ThrottleTime:
    """Non-zero throttle times of one sensor within Kafka's metric window (`METRIC_WINDOW`, 2 x 30 s
    unless configured): mean, maximum (ms) and how many; NaN means and count 0 when none."""

    avg_ms: float
    max_ms: float
    count: int


class FleetUsage(NamedTuple):
    key: SensorKey
    used_total: float
    throttle_count: int
    base_bound: float | None
    share: float


class SensorLimit(NamedTuple):
    """The limit in force on a sensor and what made it: `bound` = `base_bound` x `share`, where
    `base_bound` is the callback's limit x the storage factor (`scale`). Bounds are None when
    the sensor is unlimited; `entity` is the configured entity that applied, when known."""

    bound: float | None
    base_bound: float | None
    share: float
    scale: float
    shadow: bool
    entity: QuotaEntity | None


class SensorSnapshot(NamedTuple):
    key: SensorKey
    rate: SampledRate
    last_record_ms: int


class _Sensor:
    """One sharing group's rate, its current bound and bookkeeping. Internal."""

    __slots__ = ("base_bound", "bound", "bucket", "burst_s", "delivered", "entity", "key", "last_record_ms",
                 "owed", "owed_ms", "peak_bound", "peak_ms", "rate", "shadow", "shadow_throttles", "share",
                 "throttles", "touched_sweep_ms", "used_total")

    def __init__(self, key: SensorKey, rate: SampledRate, now_ms: int, sweep_ms: int) -> None:
        self.key = key
        self.rate = rate
        self.last_record_ms = now_ms
        # The sweep epoch (time of the last sweep) when this sensor last moved to the end of the
        # manager's sensor dict; last_record_ms >= touched_sweep_ms always.
        self.touched_sweep_ms = sweep_ms
        self.bound: float | None = None
        self.base_bound: float | None = None  # the bound before the fleet share
        self.share = 1.0                      # this process's share of the bound (fleet)
        self.used_total = 0.0                 # everything recorded, for fleet usage reports
        # windowed rate under a fleet share that rose (`QuotaManager._owe_raise`): what the window
        # owes the fleet at `owed_ms`, repaid linearly over one retention window; and the highest
        # bound in force within the last retention window (`peak_bound`, last in force at `peak_ms`)
        self.owed = 0.0
        self.owed_ms = 0
        self.peak_bound: float | None = None
        self.peak_ms = 0
        # rate_model token_bucket: the bucket (throttles from it; `rate` stays the metric, as in
        # KIP-599) and its burst in seconds of the bound. None under the windowed model.
        self.bucket: TokenBucket | None = None
        self.burst_s = 0.0
        # token bucket, fetch: what was delivered in the last second (`admit_fetch`'s guard)
        self.delivered: RecentSum | None = None
        self.entity: QuotaEntity | None = None
        self.shadow = False
        self.throttles = _ThrottleCounter()
        self.shadow_throttles = _ThrottleCounter()


class _ThrottleCounter:
    """Non-zero throttles since the sensor was created, and within the metric window (the windowed
    stat is made at the first throttle, so a sensor that never throttles costs none)."""

    __slots__ = ("count", "max_ms", "total_ms", "windowed")

    def __init__(self) -> None:
        self.count = 0
        self.total_ms = 0
        self.max_ms = 0
        self.windowed: SampledAvgMax | None = None

    def add(self, ms: int, now_ms: int, window: RateConfig) -> None:
        self.count += 1
        self.total_ms += ms
        if ms > self.max_ms:
            self.max_ms = ms
        if self.windowed is None:
            self.windowed = SampledAvgMax(window)
        self.windowed.record(ms, now_ms)

    def in_window(self, now_ms: int) -> ThrottleTime:
        if self.windowed is None:
            return ThrottleTime(math.nan, math.nan, 0)
        return ThrottleTime(*self.windowed.measure(now_ms))

    def snapshot(self) -> ThrottleStats:
        return ThrottleStats(self.count, self.total_ms, self.max_ms)


class QuotaManager:
    """Kafka's client quotas for every `QuotaKind`, sans I/O: time comes from `clock`.

    `rate_config` defaults to `config.window`. The clock must not go backwards. Not thread-safe:
    use it from one event loop.
    """

    def __init__(self, config: QuotaConfig, clock: Clock, rate_config: RateConfig | None = None,
                 callback: QuotaCallback | None = None,
                 sensor_idle_expiry_ms: int = DEFAULT_SENSOR_IDLE_EXPIRY_MS,
                 *, sticky_quotas_enabled: bool = True, metric_window: RateConfig = METRIC_WINDOW) -> None:
        if sensor_idle_expiry_ms < 0:
            raise ValueError(f"sensor_idle_expiry_ms must be >= 0, got {sensor_idle_expiry_ms}")
        self._clock = clock
        self._rate_config = config.window if rate_config is None else rate_config
        self._window_ms = self._rate_config.window_ms
        self._expiry_ms = sensor_idle_expiry_ms
        self._metric_window = metric_window
        self._install(DefaultQuotaCallback(sticky_levels=sticky_quotas_enabled)
                      if callback is None else callback)
        self._sensors: dict[SensorKey, _Sensor] = {}
        # Sensors of a replaced callback, adopted when the new one produces the same key (see
        # `set_callback`); dropped at the next sweep.
        self._retired: dict[SensorKey, _Sensor] = {}
        self._bindings: dict[QuotaKind, dict[ClientIdentity, _Sensor]] = {k: {} for k in QuotaKind}
        # bumped whenever `_bindings` are cleared: a cached (kind, identity) -> sensor lookup outside
        # this class (the engine's compiled fast path, `quotas._speedups.QuickCharge`) is valid
        # while the epoch it was read in lasts
        self._bindings_epoch = 0
        self._enabled: dict[QuotaKind, bool] = dict.fromkeys(QuotaKind, self._custom)
        self._last_sweep_ms = clock.now_ms()
        self._scales: dict[QuotaKind, float] = {}  # storage throttle factors (set_limit_scale)
        self._shares: Mapping[SensorKey, float] = {}  # fleet shares (set_shares)
        self._standby_share = 1.0
        self._busy: Collection[SensorKey] = frozenset()  # groups other fleet members use (set_shares)
        self._config = QuotaConfig(window=config.window)
        self._apply(config)

    # -- hot path ----------------------------------------------------------------------------

    def record_and_check(self, kind: QuotaKind, identity: ClientIdentity, value: float) -> ThrottleDecision:
        """Record `value` for `identity`, then check its sharing group's rate against the bound."""
        return self.record_and_check_at(kind, identity, value, self._clock.now_ms())

    def record_and_check_at(self, kind: QuotaKind, identity: ClientIdentity, value: float,
                            now: int) -> ThrottleDecision:
        """`record_and_check` at a clock reading already taken (`now`, ms): the compiled common
        case (`quotas._speedups.QuickCharge`) hands a request it does not decide itself here."""
        if now - self._last_sweep_ms >= SENSOR_SWEEP_INTERVAL_MS:
            self._sweep(now)
        if not self._enabled[kind]:
            return self._unlimited(kind, identity)
        sensor = self._sensor(kind, identity, now)
        self._record_on(sensor, value, now)
        return self._decide(kind, sensor, now)

    def _record_on(self, sensor: _Sensor, value: float, now: int) -> None:
        """Add `value` to the sensor's rate, its total and its bucket, and tell the observer."""
        sensor.last_record_ms = now
        if sensor.touched_sweep_ms != self._last_sweep_ms:
            self._touch(sensor)
        sensor.rate.record(value, now)
        sensor.used_total += value
        if sensor.bucket is not None and sensor.bound is not None:
            sensor.bucket.record(value, sensor.bound, sensor.bound * sensor.burst_s, now)
        if value < 0 and sensor.delivered is not None:  # an emptied fetch was not delivered after all
            sensor.delivered.take_back(-value, now)
        if self._observer is not None:
            self._observer.on_record(sensor.key, value, now)

    def admit_fetch(self, identity: ClientIdentity, response_bytes: float) -> FetchAdmission:
        """Record a Fetch response of `response_bytes` and decide, with one sensor lookup.

        The windowed rate records it and checks (Kafka: a throttled fetch is then answered empty
        and un-recorded by the caller). Under a token bucket a fetch is delivered while the
        credits are not negative and then takes them below zero, as a produce does (Kafka's
        strict token bucket: check, then record); a fetch that arrives in debt is neither
        recorded nor delivered. (Emptying every fetch that does not fit in the credits left would
        never serve a response larger than the burst, and a broker returns a partition's first
        batch whole.)

        And under a token bucket a fetch is delivered only if the last second's deliveries plus
        this one stay within ``bound x 1 s + burst`` (or the last second delivered nothing):
        otherwise it is not recorded, and its throttle is the time until enough of that second
        has passed (`RecentSum`). Without it, responses of about a second's quota (one 1 MiB
        batch at 1 MiB/s) are each admitted at zero credits, arrive every ``S / Q`` < 1 s, and a
        second holding two of them holds twice the quota."""
        return self.admit_fetch_at(identity, response_bytes, self._clock.now_ms())

    def admit_fetch_at(self, identity: ClientIdentity, response_bytes: float, now: int) -> FetchAdmission:
        """`admit_fetch` at a clock reading already taken (`now`, ms): the compiled common case
        (`quotas._speedups.QuickCharge`) hands a fetch it does not decide itself here."""
        kind = QuotaKind.FETCH
        if now - self._last_sweep_ms >= SENSOR_SWEEP_INTERVAL_MS:
            self._sweep(now)
        if not self._enabled[kind]:
            return FetchAdmission(self._unlimited(kind, identity), recorded=True, throttle_is_debt=False)
        sensor = self._sensor(kind, identity, now)
        bound = sensor.bound
        bucket = sensor.bucket is not None and bound is not None
        if bucket:
            before = self._decide(kind, sensor, now, count=False)
            if before.throttle_time_ms > 0:  # in debt already (a shadow decision has no throttle time)
                return FetchAdmission(before, recorded=False, throttle_is_debt=False)
            assert bound is not None
            delivered = sensor.delivered
            if delivered is None:
                delivered = sensor.delivered = RecentSum(PEAK_SECOND_MS)
            if not sensor.shadow:
                most = bound * (PEAK_SECOND_MS / 1000.0 + sensor.burst_s)  # Q x 1 s + B
                wait_ms = delivered.wait_ms(now, max(0.0, most - response_bytes))
                if wait_ms > 0:
                    sensor.throttles.add(wait_ms, now, self._metric_window)
                    return FetchAdmission(
                        ThrottleDecision(kind, sensor.key, wait_ms, before.observed, bound, False,
                                         sensor.entity),
                        recorded=False, throttle_is_debt=False)
            delivered.add(response_bytes, now)
        self._record_on(sensor, response_bytes, now)
        return FetchAdmission(self._decide(kind, sensor, now), recorded=True, throttle_is_debt=bucket)

    def check(self, kind: QuotaKind, identity: ClientIdentity) -> ThrottleDecision:
        """The decision `identity` would get now, without recording anything.

        Like a metrics reporter reading Kafka's rate, this purges old samples and creates the
        sensor if needed (as Kafka's lookups do); reading never refreshes a sensor's idle time.
        """
        now = self._clock.now_ms()
        if now - self._last_sweep_ms >= SENSOR_SWEEP_INTERVAL_MS:
            self._sweep(now)
        if not self._enabled[kind]:
            return self._unlimited(kind, identity)
        return self._decide(kind, self._sensor(kind, identity, now), now, count=False)

    def record(self, kind: QuotaKind, identity: ClientIdentity, value: float) -> None:
        """Record without checking (Kafka's `recordNoThrottle`, e.g. network-thread time)."""
        now = self._clock.now_ms()
        if now - self._last_sweep_ms >= SENSOR_SWEEP_INTERVAL_MS:
            self._sweep(now)
        if not self._enabled[kind]:
            return
        self._record_on(self._sensor(kind, identity, now), value, now)

    def unrecord(self, kind: QuotaKind, identity: ClientIdentity, value: float) -> None:
        """Take back `value` (records ``-value``, no check): Kafka's `unrecordQuotaSensor`, used
        when a fetch is throttled and its response is replaced by an empty one."""
        self.record(kind, identity, -value)

    def max_value_in_quota_window(self, kind: QuotaKind, identity: ClientIdentity) -> float:
        """``bound * (samples - 1) * window_s``: the most one request can carry without being
        certain to be throttled (KAFKA-9677 caps fetch max_bytes with it). `math.inf` if unlimited.

        Under the token bucket it is `BUCKET_REQUEST_CAP_MS` of quota, or half the burst if that is
        less, instead: a response is spent at once, so its size is the most a client can get in
        any one second above the refill and the burst (a tenth of a second keeps the per-second rate
        within about 10 % of the quota), and half the burst leaves the other half for the credits
        that refill during the consumer's round trips."""
        if not self._enabled[kind]:
            return math.inf
        now = self._clock.now_ms()
        sensor = self._sensor(kind, identity, now)
        bound = sensor.bound
        if bound is None:
            return math.inf
        if sensor.bucket is not None:
            return bound * min(BUCKET_REQUEST_CAP_MS / 1000.0, sensor.burst_s / 2)
        return bound * (self._rate_config.samples - 1) * (self._window_ms / 1000.0)

    # -- configuration -----------------------------------------------------------------------

    @property
    def config(self) -> QuotaConfig:
        return self._config

    @property
    def rate_config(self) -> RateConfig:
        return self._rate_config

    def update_config(self, config: QuotaConfig) -> None:
        """Apply a new snapshot live. Sensors keep their history; bounds, matched entities and
        shadow flags are re-read for every sensor. The window cannot change at runtime (as in
        Kafka, where `quota.window.*` are static broker configs)."""
        if config.window != self._config.window:
            raise QuotaConfigError("window", f"cannot change at runtime ({self._config.window} -> "
                                             f"{config.window}); restart to apply")
        self._apply(config)

    def set_limit_scale(self, kind: QuotaKind, factor: float) -> None:
        """Scale every limit of `kind` by `factor` in [0, 1] (storage-driven throttling: Strimzi's
        ``static quota x throttle factor``). Sensors keep their history; unlimited callers stay
        unlimited. While the factor is below 1 a throttle is capped at the full quota window
        (``samples x window``), so a factor of 0 (a bound of 0) pauses a client for one window at a
        time instead of for ever, and lifting it resumes production within one window."""
        if not 0.0 <= factor <= 1.0:
            raise ValueError(f"factor must be in [0, 1], got {factor}")
        if self._scales.get(kind, 1.0) == factor:
            return
        if factor == 1.0:
            self._scales.pop(kind, None)
        else:
            self._scales[kind] = factor
        for sensor in self._sensors.values():
            if sensor.key.kind is kind:
                self._bind_limit(sensor)

    def limit_scale(self, kind: QuotaKind) -> float:
        return self._scales.get(kind, 1.0)

    def set_shares(self, shares: Mapping[SensorKey, float], standby: float,
                   busy: Collection[SensorKey] = frozenset()) -> None:
        """Fleet mode: this process enforces ``bound x share`` (`quotas.fleet`): `shares` for the
        sharing groups it is active on, `standby` for every other (and every new) one. Sensors keep
        their history. While a share is below 1 a byte-rate throttle is capped at the full quota
        window, as for a storage factor, so a client held by a small share checks again within one
        window once the shares move.

        `busy`: groups other members are using. A sensor created here for one of them starts
        *spent*, as if it had run at its bound for the last window (`_start_spent`): the budget's
        recent past was used elsewhere, so a new sensor's credit (Kafka's young-rate padding, or a
        full token bucket) would admit it a second time.

        Under the windowed rate a share that *rises* would let the sensor admit at once what its
        window says it did not use at the new bound, though the fleet used that budget (a member
        that left, or whose demand dropped, had it): the raise is owed for one window instead
        (`_owe_raise`)."""
        for share in (standby, *shares.values()):
            if not 0.0 < share <= 1.0:
                raise ValueError(f"a share must be in (0, 1], got {share}")
        self._shares = dict(shares)
        self._standby_share = standby
        self._busy = busy
        now = self._clock.now_ms()
        for sensor in self._sensors.values():
            share = self._shares.get(sensor.key, standby)
            if share != sensor.share:
                old = sensor.bound
                sensor.share = share
                sensor.bound = None if sensor.base_bound is None else sensor.base_bound * share
                if sensor.bucket is None:
                    self._owe_raise(sensor, old, now)

    def fleet_usage(self) -> Iterator[FleetUsage]:
        """Per live sensor: everything recorded so far, throttles so far (enforced and shadow) and
        the bound before the share; the fleet member turns differences into a usage report."""
        for sensor in list(self._sensors.values()):
            yield FleetUsage(sensor.key, sensor.used_total,
                             sensor.throttles.count + sensor.shadow_throttles.count, sensor.base_bound,
                             sensor.share)

    def close(self) -> None:
        self._callback.close()

    # -- the callback (KIP-257) --------------------------------------------------------------

    @property
    def callback(self) -> QuotaCallback:
        return self._callback

    @property
    def wants_cluster_metadata(self) -> bool:
        return self._wants_metadata

    def set_callback(self, callback: QuotaCallback) -> None:
        """Replace the callback live. The new one is told every configured quota (`update_quota`),
        the old one is closed. What survives: the configuration, and the rate history of every
        sharing group whose key the new callback produces again before the next sweep (30 s of
        clock time); every other sensor of the old callback is dropped then (its limits are not
        re-read meanwhile and it is no longer exported). Throttle counters go with their sensor."""
        old = self._callback
        self._install(callback)
        for entry in self._config:
            for kind, value in entry.values.items():
                callback.update_quota(entry.entity, kind, value)
        self._retired.update(self._sensors)
        self._sensors = {}
        for bindings in self._bindings.values():
            bindings.clear()
        self._bindings_epoch += 1
        self._apply(self._config)  # enabled kinds; nothing differs, so no callback calls
        if old is not callback:
            old.close()

    def update_cluster_metadata(self, cluster: ClusterView) -> bool:
        """KIP-257's ``updateClusterMetadata``: tell a callback that wants it; re-read every limit
        when it says they changed. Returns whether they were re-read."""
        if not self._wants_metadata or not self._callback.update_cluster_metadata(cluster):
            return False
        self._refresh(None)
        return True

    # -- sensors and metrics -----------------------------------------------------------------

    def sensors(self) -> Iterator[SensorSnapshot]:
        """Every live sensor, for metrics export. Measuring a rate purges it, as in Kafka."""
        for sensor in list(self._sensors.values()):
            yield SensorSnapshot(sensor.key, sensor.rate, sensor.last_record_ms)

    @property
    def sensor_count(self) -> int:
        return len(self._sensors)

    @property
    def binding_count(self) -> int:
        """How many (kind, identity) lookups are cached; bounded by the identities seen in one
        sweep interval."""
        return sum(len(b) for b in self._bindings.values())

    def quota_bound(self, key: SensorKey) -> float | None:
        sensor = self._sensors.get(key)
        return None if sensor is None else sensor.bound

    def sensor_limit(self, key: SensorKey) -> SensorLimit | None:
        """The limit in force on a live sensor, as enforcement uses it; None if there is no sensor."""
        sensor = self._sensors.get(key)
        if sensor is None:
            return None
        return SensorLimit(sensor.bound, sensor.base_bound, sensor.share, self._scales.get(key.kind, 1.0),
                           sensor.shadow, sensor.entity)

    def throttle_stats(self, key: SensorKey) -> ThrottleStats | None:
        """Enforced (non-shadow) non-zero throttles of a sensor; `None` if there is no sensor."""
        sensor = self._sensors.get(key)
        return None if sensor is None else sensor.throttles.snapshot()

    def throttle_time(self, key: SensorKey) -> ThrottleTime | None:
        """Enforced non-zero throttles of a sensor within the metric window (Kafka's `throttle-time`
        avg, and max); `None` if there is no sensor."""
        sensor = self._sensors.get(key)
        return None if sensor is None else sensor.throttles.in_window(self._clock.now_ms())

    def shadow_throttle_stats(self, key: SensorKey) -> ThrottleStats | None:
        """Non-zero throttles computed but not enforced because the decision was shadow."""
        sensor = self._sensors.get(key)
        return None if sensor is None else sensor.shadow_throttles.snapshot()

    def expire_idle_sensors(self) -> int:
        """Drop every sensor with no record for more than the expiry (Kafka's `Sensor.hasExpired`
        is strict: idle > 3 600 000 ms). Returns how many were dropped."""
        return self._sweep(self._clock.now_ms())

    # -- internals ---------------------------------------------------------------------------

    def _sensor(self, kind: QuotaKind, identity: ClientIdentity, now: int) -> _Sensor:
        if self._poll_reset and self._callback.quota_reset_required(kind):
            self._refresh(kind)
        bindings = self._bindings[kind]
        sensor = bindings.get(identity)
        if sensor is None:
            key = self._callback.sensor_key(kind, identity)
            sensor = self._sensors.get(key)
            if sensor is None:
                sensor = self._retired.pop(key, None) if self._retired else None
                fresh = sensor is None
                if sensor is None:
                    sensor = _Sensor(key, SampledRateImpl(self._rate_config), now, self._last_sweep_ms)
                else:
                    sensor.touched_sweep_ms = self._last_sweep_ms  # now at the end of the dict
                self._bind_limit(sensor)
                if fresh and self._busy and key in self._busy:
                    self._start_spent(sensor, now)
                self._sensors[key] = sensor
            bindings[identity] = sensor
        return sensor

    def _decide(self, kind: QuotaKind, sensor: _Sensor, now: int, *, count: bool = True) -> ThrottleDecision:
        total, window_ms = sensor.rate.measure_parts(now)
        if sensor.owed:
            total += self._owed(sensor, now)
        observed = total / (window_ms / 1000.0)
        bound = sensor.bound
        bucket = sensor.bucket
        throttle_ms = 0
        if bound is not None and (bucket is not None or observed > bound):
            if bucket is None:
                throttle_ms = throttle_time_ms(observed, bound, window_ms)
            else:  # rate_model token_bucket: the time to refill the credits to zero
                credits = bucket.measure(bound, bound * sensor.burst_s, now)
                throttle_ms = bucket_throttle_time_ms(credits, bound)
            if kind in _CAPPED_KINDS:
                throttle_ms = min(throttle_ms, self._window_ms)
            elif self._scales.get(kind, 1.0) < 1.0 or sensor.share < 1.0:
                # A scaled (storage-throttled) bound, perhaps 0, or a fleet share: cap at the full
                # quota window so a client checks again, and resumes, within one window of the
                # factor or share going back up.
                throttle_ms = min(throttle_ms, self._rate_config.retention_ms)
            if count and throttle_ms > 0:
                (sensor.shadow_throttles if sensor.shadow else sensor.throttles).add(
                    throttle_ms, now, self._metric_window)
        return ThrottleDecision(kind, sensor.key, throttle_ms, observed, bound, sensor.shadow, sensor.entity)

    def _unlimited(self, kind: QuotaKind, identity: ClientIdentity) -> ThrottleDecision:
        return ThrottleDecision(kind, self._callback.sensor_key(kind, identity), 0, 0.0, None,
                                self._config.shadow_all, None)

    def _owe_raise(self, sensor: _Sensor, old: float | None, now: int) -> None:
        """A windowed sensor's bound moved from `old` to `sensor.bound` (a fleet share). On a rise
        above the highest bound in force within the last retention window (W = samples x window),
        the window's room between that bound and the new one was the fleet's, used by the members
        that held it: the sensor owes ``(new - highest) x W`` (in the kind's unit), counted into its
        measured total and repaid linearly over one W, as that usage would have aged out. So the
        raise applies at once to what comes next, but no burst re-admits the past. Only a sensor
        that recorded within the window owes (an idle one has no past to re-admit); the owed
        amount is not recorded (metrics and fleet reports show what was admitted)."""
        new = sensor.bound
        retention = self._rate_config.retention_ms
        if old is None or new is None:
            sensor.peak_bound = None
            return
        peak = sensor.peak_bound
        if peak is not None and now - sensor.peak_ms > retention:
            peak = None
        highest = old if peak is None else max(old, peak)
        if new > highest and now - sensor.last_record_ms <= retention:
            sensor.owed = self._owed(sensor, now) + (new - highest) * retention / 1000.0
            sensor.owed_ms = now
        if peak is None or old >= peak:
            sensor.peak_bound, sensor.peak_ms = old, now  # `old` was in force until now

    def _owed(self, sensor: _Sensor, now: int) -> float:
        """What the sensor still owes (`_owe_raise`): repaid linearly over one retention window."""
        retention = self._rate_config.retention_ms
        left = 1.0 - (now - sensor.owed_ms) / retention
        if left <= 0.0:
            sensor.owed = 0.0
            return 0.0
        return sensor.owed * min(1.0, left)

    def _start_spent(self, sensor: _Sensor, now: int) -> None:
        """No credit for a new sensor of a group the fleet is using: a token bucket starts empty;
        a windowed rate starts with one window's worth of its bound in each of the samples - 1
        windows before now (the rate is then exactly the bound, and those samples expire one per
        window as a steady client's would). Its `used_total` (what the fleet is told) is untouched."""
        bound = sensor.bound
        if bound is None or bound <= 0:
            return
        if sensor.bucket is not None:
            burst = bound * sensor.burst_s
            sensor.bucket.record(burst, bound, burst, now)
            return
        window_ms = self._window_ms
        per_window = bound * window_ms / 1000.0
        for back in range(self._rate_config.samples - 1, 0, -1):
            sensor.rate.record(per_window, now - back * window_ms)

    def _bind_limit(self, sensor: _Sensor) -> None:
        bound = self._callback.quota_limit(sensor.key)
        scale = self._scales.get(sensor.key.kind)
        if scale is not None and bound is not None:
            bound *= scale
        sensor.base_bound = bound
        sensor.share = self._shares.get(sensor.key, self._standby_share)
        sensor.bound = None if bound is None else bound * sensor.share
        entity = self._matcher.matched_entity(sensor.key) if self._matcher is not None else None
        sensor.entity = entity
        entry = None if entity is None else self._config.get(entity)
        sensor.shadow = self._config.shadow_all or (entry is not None and entry.shadow)
        shape = self._config.bucket_of(entry)
        if shape is None:
            sensor.bucket = None
        else:  # a bucket that already exists keeps its credits (clipped to a smaller burst)
            if sensor.bucket is None:
                sensor.bucket = TokenBucketImpl()
            sensor.burst_s = shape.burst_ms / 1000.0

    def _install(self, callback: QuotaCallback) -> None:
        self._custom = not isinstance(callback, DefaultQuotaCallback)
        self._callback = callback
        self._matcher: EntityMatcher | None = callback if isinstance(callback, EntityMatcher) else None
        self._observer: RecordObserver | None = callback if isinstance(callback, RecordObserver) else None
        # DefaultQuotaCallback never asks for a reset: skip polling it on the hot path.
        self._poll_reset = self._custom
        self._wants_metadata = bool(getattr(callback, "wants_cluster_metadata", False))

    def _apply(self, config: QuotaConfig) -> None:
        old = self._config
        callback = self._callback
        for entry in old:
            new_entry = config.get(entry.entity)
            for kind in entry.values:
                if new_entry is None or kind not in new_entry.values:
                    callback.remove_quota(entry.entity, kind)
        for entry in config:
            old_entry = old.get(entry.entity)
            for kind, value in entry.values.items():
                if old_entry is None or old_entry.values.get(kind) != value:
                    callback.update_quota(entry.entity, kind, value)
        self._config = config
        for kind in QuotaKind:
            if self._custom:
                self._enabled[kind] = True
            elif isinstance(callback, DefaultQuotaCallback):
                self._enabled[kind] = callback.quotas_enabled(kind)
        self._refresh(None)

    def _refresh(self, kind: QuotaKind | None) -> None:
        """Re-read limits of every sensor (of `kind`, or all) and forget cached keys."""
        for sensor in self._sensors.values():
            if kind is None or sensor.key.kind is kind:
                self._bind_limit(sensor)
        for k, bindings in self._bindings.items():
            if kind is None or k is kind:
                bindings.clear()
        self._bindings_epoch += 1

    def _touch(self, sensor: _Sensor) -> None:
        """Move a sensor to the end of the dict, at most once per sweep interval, so the dict stays
        ordered by `touched_sweep_ms` and a sweep can stop at the first recently touched sensor."""
        sensors = self._sensors
        del sensors[sensor.key]
        sensors[sensor.key] = sensor
        sensor.touched_sweep_ms = self._last_sweep_ms

    def _sweep(self, now: int) -> int:
        self._last_sweep_ms = now
        expiry = self._expiry_ms
        cutoff = now - expiry  # expired <=> last_record_ms < cutoff (Kafka: now - last > expiry)
        expired = []
        for key, sensor in self._sensors.items():
            if sensor.touched_sweep_ms >= cutoff:
                break  # this one and every later one recorded at or after cutoff
            if now - sensor.last_record_ms > expiry:
                expired.append(key)
        for key in expired:
            del self._sensors[key]
        self._retired.clear()
        # Cached lookups may point at dropped sensors or at callers long gone: start afresh.
        for bindings in self._bindings.values():
            bindings.clear()
        self._bindings_epoch += 1
        return len(expired)
