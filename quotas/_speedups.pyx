# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled twins of the quota stats every request records into and measures (Cython).

The readable reference is `quotas.stats`: `SampledRate` (Kafka's windowed rate) and `TokenBucket`
(KIP-599). These are the same algorithms over C doubles and 64-bit millisecond clocks, with every
floating-point operation in the reference's order (the ring is summed from 0.0 in ring order, the
window is converted to seconds as ``window_ms / 1000.0``, ``min`` keeps its first argument on a
tie), so a decision made on either is the same float, bit for bit (tests/unit/differential).

`quotas.fastpath` picks the implementation. Times are C ``long long``: a clock beyond +-2**63 ms
raises OverflowError here (the reference would carry on with Python ints).

No I/O: this is part of the sans-IO `quotas` package.
"""

from libc.stdlib cimport free, realloc
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from protocol._slots cimport get, put, slot_offset

from quotas.stats import RateConfig


cdef class SampledRate:
    """`quotas.stats.SampledRate` over three C arrays (sum, start, last event) grown lazily to N+1."""

    cdef object _config
    cdef long long _window_ms
    cdef long long _expire_age_ms
    cdef long long _min_full_windows
    cdef Py_ssize_t _max_slots
    cdef Py_ssize_t _len
    cdef Py_ssize_t _cap
    cdef Py_ssize_t _current
    cdef double *_values
    cdef long long *_starts
    cdef long long *_lasts

    def __cinit__(self) -> None:
        self._values = NULL
        self._starts = NULL
        self._lasts = NULL
        self._len = 0
        self._cap = 0
        self._current = 0

    def __init__(self, config: RateConfig = RateConfig()) -> None:
        self._config = config
        self._window_ms = config.window_ms
        self._max_slots = config.samples + 1
        self._expire_age_ms = config.samples * config.window_ms
        self._min_full_windows = config.samples - 1

    def __dealloc__(self) -> None:
        free(self._values)
        free(self._starts)
        free(self._lasts)

    @property
    def config(self) -> RateConfig:
        return self._config

    cdef int _append(self, long long now_ms) except -1:
        cdef Py_ssize_t cap
        cdef void *p
        if self._len == self._cap:
            cap = 2 if self._cap == 0 else self._cap * 2
            if cap > self._max_slots:
                cap = self._max_slots
            p = realloc(self._values, cap * sizeof(double))
            if p == NULL:
                raise MemoryError()
            self._values = <double *> p
            p = realloc(self._starts, cap * sizeof(long long))
            if p == NULL:
                raise MemoryError()
            self._starts = <long long *> p
            p = realloc(self._lasts, cap * sizeof(long long))
            if p == NULL:
                raise MemoryError()
            self._lasts = <long long *> p
            self._cap = cap
        self._values[self._len] = 0.0
        self._starts[self._len] = now_ms
        self._lasts[self._len] = now_ms
        self._len += 1
        return 0

    cpdef record(self, double value, long long now_ms):
        """Add `value` at `now_ms`. Negative values are allowed (Kafka's fetch "un-record")."""
        cdef Py_ssize_t i
        if self._len == 0:
            self._append(now_ms)
        i = self._current
        if now_ms - self._starts[i] >= self._window_ms:
            i = (i + 1) % self._max_slots
            self._current = i
            if i >= self._len:
                self._append(now_ms)
            else:
                self._values[i] = 0.0
                self._starts[i] = now_ms
        self._values[i] += value
        self._lasts[i] = now_ms

    cdef int _purge(self, long long now_ms, double *total, long long *window_ms) except -1:
        cdef Py_ssize_t i
        cdef double acc = 0.0
        cdef long long oldest = now_ms
        cdef long long elapsed, full_windows
        cdef long long size = self._window_ms
        if self._len == 0:
            self._append(now_ms)  # Kafka's oldest(): an empty stat gains a sample starting now
        for i in range(self._len):
            if now_ms - self._lasts[i] >= self._expire_age_ms:
                self._values[i] = 0.0
                self._starts[i] = now_ms
                self._lasts[i] = now_ms
            acc += self._values[i]
            if i == 0 or self._starts[i] < oldest:
                oldest = self._starts[i]
        elapsed = now_ms - oldest
        full_windows = elapsed / size  # C division truncates toward zero, as Java's does
        if full_windows < self._min_full_windows:
            elapsed += (self._min_full_windows - full_windows) * size
        total[0] = acc
        window_ms[0] = elapsed if elapsed > 1 else 1
        return 0

    cpdef double measure(self, long long now_ms) except? -1.0:
        """The rate in units per second at `now_ms` (Kafka's `Rate.measure`)."""
        cdef double total
        cdef long long window_ms
        self._purge(now_ms, &total, &window_ms)
        return total / (<double> window_ms / 1000.0)

    def window_size_ms(self, long long now_ms) -> int:
        """The window the rate is divided by at `now_ms` (Kafka's `Rate.windowSize`)."""
        cdef double total
        cdef long long window_ms
        self._purge(now_ms, &total, &window_ms)
        return window_ms

    def total(self, long long now_ms) -> float:
        """The sum of the retained samples at `now_ms`, after purging."""
        cdef double total
        cdef long long window_ms
        self._purge(now_ms, &total, &window_ms)
        return total

    cpdef tuple measure_parts(self, long long now_ms):
        """Purge, then return ``(total, window_size_ms)`` in one pass over the ring."""
        cdef double total
        cdef long long window_ms
        self._purge(now_ms, &total, &window_ms)
        return (total, window_ms)

    def __repr__(self) -> str:
        samples = ", ".join(f"({self._values[i]:g} @{self._starts[i]}..{self._lasts[i]})"
                            for i in range(self._len))
        return f"SampledRate({self._config}, current={self._current}, samples=[{samples}])"


cdef class TokenBucket:
    """`quotas.stats.TokenBucket` with its credits and last refill time in C."""

    cdef double _credits
    cdef bint _filled  # False until the first call: then full (the reference's credits is None)
    cdef long long _last_ms

    def __cinit__(self) -> None:
        self._credits = 0.0
        self._filled = False
        self._last_ms = 0

    cpdef record(self, double value, double quota, double burst, long long now_ms):
        cdef double credits = self._refill(quota, burst, now_ms)
        credits = credits - value
        # min(burst, x) keeps burst unless x < burst (a NaN too), as Python's min does
        self._credits = credits if credits < burst else burst

    cpdef double measure(self, double quota, double burst, long long now_ms):
        """The credits at `now_ms` after refilling (negative: in violation)."""
        return self._refill(quota, burst, now_ms)

    cdef double _refill(self, double quota, double burst, long long now_ms):
        cdef double credits
        if not self._filled:
            credits = burst
            self._filled = True
        else:
            credits = self._credits + quota * (<double> (now_ms - self._last_ms) / 1000.0)
            if not credits < burst:
                credits = burst
        self._credits = credits
        self._last_ms = now_ms
        return credits

    def __repr__(self) -> str:
        return f"TokenBucket(credits={self._credits if self._filled else None}, last_ms={self._last_ms})"


cdef class SystemClock:
    """`quotas.clock.SystemClock`: ``time.monotonic_ns() // 1_000_000`` read in C. On Linux
    CPython's monotonic clock is ``clock_gettime(CLOCK_MONOTONIC)``, so both give the same integer
    milliseconds from the same origin (`quotas.fastpath` uses this one only on Linux). Every request
    reads the clock several times (the connection, the quota manager, the response): here each read
    is one C call instead of a Python frame and a call of ``time.monotonic_ns``."""

    def now_ms(self):
        return _monotonic_ms()


cdef inline long long _monotonic_ms():
    """`SystemClock.now_ms` in C (`QuickCharge` calls it directly for a manager on this clock)."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <long long>ts.tv_sec * 1000 + <long long>ts.tv_nsec // 1000000


# --- the engine's common case: record and decide in one call (QuotaEngine.produce / request) -----

_INF = float("inf")  # `QuotaManager.max_value_in_quota_window`'s no cap

DEF SWEEP_INTERVAL_MS = 30000  # quotas.manager.SENSOR_SWEEP_INTERVAL_MS (checked in QuickCharge.__init__)
DEF MAX_ENTRIES = 10000


# A cached caller's sensor (`quotas.manager._Sensor`, a `__slots__` class) is read and written at
# its slots' offsets (`protocol/_slots.pxd`), as its member descriptors do, without an attribute
# lookup each; `_entry` caches only sensors of exactly that class. Read once, by the first
# QuickCharge (quotas.manager imports this module, so not at its import).
cdef object _SENSOR = None
cdef Py_ssize_t S_BOUND, S_BUCKET, S_BURST_S, S_ENTITY, S_KEY, S_LAST_RECORD_MS, S_OWED, S_OWED_MS
cdef Py_ssize_t S_RATE, S_SHADOW, S_TOUCHED_SWEEP_MS, S_USED_TOTAL


cdef int _sensor_offsets() except -1:
    global _SENSOR, S_BOUND, S_BUCKET, S_BURST_S, S_ENTITY, S_KEY, S_LAST_RECORD_MS, S_OWED, S_OWED_MS
    global S_RATE, S_SHADOW, S_TOUCHED_SWEEP_MS, S_USED_TOTAL
    if _SENSOR is not None:
        return 0
    from quotas.manager import _Sensor
    S_BOUND, S_BUCKET = slot_offset(_Sensor, "bound"), slot_offset(_Sensor, "bucket")
    S_BURST_S, S_ENTITY = slot_offset(_Sensor, "burst_s"), slot_offset(_Sensor, "entity")
    S_KEY, S_LAST_RECORD_MS = slot_offset(_Sensor, "key"), slot_offset(_Sensor, "last_record_ms")
    S_OWED, S_OWED_MS = slot_offset(_Sensor, "owed"), slot_offset(_Sensor, "owed_ms")
    S_RATE, S_SHADOW = slot_offset(_Sensor, "rate"), slot_offset(_Sensor, "shadow")
    S_TOUCHED_SWEEP_MS = slot_offset(_Sensor, "touched_sweep_ms")
    S_USED_TOTAL = slot_offset(_Sensor, "used_total")
    _SENSOR = _Sensor
    return 0


cdef class _Slot:
    """One budget a caller's request is recorded on: its sensor (`quotas.manager._Sensor`) and the
    not-throttled decision made for it, with the limit it was made under."""

    cdef object kind
    cdef object sensor
    cdef object decision       # ThrottleDecision(kind, key, 0, nan, bound, shadow, entity)
    cdef object bound
    cdef object shadow
    cdef object entity


cdef class _Entry:
    """A caller's cached lookups in one manager: valid while the manager's bindings epoch lasts."""

    cdef object identity
    cdef object manager
    cdef object clock          # the manager's
    cdef bint system_clock     # ... a SystemClock: read in C
    cdef object kinds          # the engine's active_kinds they were read under
    cdef long long epoch
    cdef _Slot first           # request_rate, or the bytes kind when request_rate is not recorded
    cdef _Slot second          # the bytes kind after request_rate, or None
    cdef object verdict        # RequestVerdict of the slots' decisions, throttle 0 ...
    cdef object verdict_first  # ... made of these two
    cdef object verdict_second
    cdef object verdict_cap    # ... and for a fetch, with this fetch_cap_bytes and read_whole_response
    cdef object verdict_whole
    cdef object response       # a fetch's ResponseVerdict, not throttled, of this decision
    cdef object response_decision


cdef inline _Slot _slot_of(_Entry entry, object kind):
    """The entry's slot of `kind`, or None."""
    if entry.first is not None and entry.first.kind is kind:
        return entry.first
    if entry.second is not None and entry.second.kind is kind:
        return entry.second
    return None


cdef double _owed(object manager, object sensor, double owed, long long now_ms) except? -1.0:
    """`manager._owed(sensor, now_ms)`: what a windowed sensor still owes the fleet (repaid linearly
    over one retention window; cleared once repaid), for a sensor whose `owed` is the float `owed`."""
    cdef double retention = <long long>manager._rate_config.retention_ms
    cdef double left = 1.0 - <double>(now_ms - <long long>get(sensor, S_OWED_MS)) / retention
    if left <= 0.0:
        put(sensor, S_OWED, 0.0)
        return 0.0
    return owed * (1.0 if left > 1.0 else left)


cdef inline long long _now_ms(_Entry entry) except? -1:
    """The entry's manager's clock, read in C when it is the system clock."""
    if entry.system_clock:
        return _monotonic_ms()
    return entry.clock.now_ms()


cdef class QuickCharge:
    """`QuotaEngine.produce` (without per-topic usage), `QuotaEngine.request`, and a Fetch's
    `QuotaEngine.fetch_request` (no topics to cap by) and `QuotaEngine.fetch_response` (not read
    whole) in one compiled call each for the common case: the caller's budgets are in one manager
    (no ``cluster_entries`` or ``broker_bps``), already bound, with no callback that polls or
    observes, and nothing throttles.

    Per budget, in the engine's order and with one clock read each (as `record_and_check`): the
    windowed rate (and the token bucket) records in C, and what a windowed sensor owes the fleet
    after its share rose (`QuotaManager._owed`) is counted in C; a decision that is not a throttle
    is the slot's preallocated one (`observed` NaN: the rate is not carried; metrics read the
    sensors); anything else (a sweep due, a cached lookup gone stale, a rate over its bound or a
    bucket in debt) goes to the manager's own Python for that budget, with the
    same clock reading, so every decision, throttle and sensor is the reference's bit for bit
    (tests/unit/differential/test_quick_charge.py). Returns None, having recorded nothing, when the
    request is not the common case; the engine then runs its Python verbs."""

    cdef object _engine
    cdef object _decision_type
    cdef object _verdict_type
    cdef object _empty
    cdef object _request_rate
    cdef object _produce
    cdef bint _cluster_scope
    cdef dict _produce_entries
    cdef dict _request_entries
    cdef object _request_percentage
    cdef object _not_limited_response
    cdef object _response_type
    cdef object _fetch
    cdef object _consumer_record_rate
    cdef dict _fetch_entries
    cdef object _no_fetch_response  # ResponseVerdict((), 0): a fetch response with no byte budget

    def __init__(self, engine, decision_type, verdict_type, empty_verdict, request_rate, produce,
                 cluster_scope, sweep_interval_ms, request_percentage, not_limited_response,
                 response_type, fetch, consumer_record_rate):
        if sweep_interval_ms != SWEEP_INTERVAL_MS:
            raise ValueError(f"QuickCharge assumes a sweep every {SWEEP_INTERVAL_MS} ms, not {sweep_interval_ms}")
        _sensor_offsets()
        self._engine = engine
        self._decision_type = decision_type
        self._verdict_type = verdict_type
        self._empty = empty_verdict
        self._request_rate = request_rate
        self._produce = produce
        self._cluster_scope = cluster_scope
        self._produce_entries = {}
        self._request_entries = {}
        self._request_percentage = request_percentage
        self._not_limited_response = not_limited_response
        self._response_type = response_type
        self._fetch = fetch
        self._consumer_record_rate = consumer_record_rate
        self._fetch_entries = {}
        self._no_fetch_response = response_type((), 0)

    def produce(self, broker_id, identity, size_bytes):
        """`QuotaEngine.produce(broker_id, identity, size_bytes, None)`, or None (nothing done)."""
        return self._charge(self._produce_entries, broker_id, identity, True, self._produce,
                            <double>size_bytes)

    def request(self, broker_id, identity):
        """`QuotaEngine.request(broker_id, identity)` of a rated request, or None (nothing done)."""
        return self._charge(self._request_entries, broker_id, identity, True, None, 0.0)

    # The engine's three verbs whole, for a caller that would otherwise call the engine's Python
    # method only to reach `produce` or `request` above (the quota stage's compiled hooks): the
    # common case here, and everything else by the engine's Python, without trying it twice.

    def produce_verdict(self, broker_id, identity, size_bytes):
        """`QuotaEngine.produce(broker_id, identity, size_bytes, None)`."""
        verdict = self._charge(self._produce_entries, broker_id, identity, True, self._produce,
                               <double>size_bytes)
        if verdict is not None:
            return verdict
        return self._engine._produce_charged(broker_id, identity, size_bytes, None)

    def request_verdict(self, broker_id, identity, bint rated):
        """`QuotaEngine.request(broker_id, identity, rated=rated)`."""
        engine = self._engine
        if not rated or self._request_rate not in engine.active_kinds:
            return self._empty
        verdict = self._charge(self._request_entries, broker_id, identity, True, None, 0.0)
        if verdict is not None:
            return verdict
        return engine._request_charged(broker_id, identity)

    def response_verdict(self, broker_id, identity, elapsed_ms):
        """`QuotaEngine.response(broker_id, identity, elapsed_ms)`."""
        engine = self._engine
        if self._request_percentage not in engine.active_kinds:
            return self._not_limited_response
        return engine.response(broker_id, identity, elapsed_ms)

    def fetch_request(self, broker_id, identity):
        """`QuotaEngine.fetch_request(broker_id, identity)` (not a ShareFetch, no topics to cap by),
        or None (nothing done): ``request_rate`` recorded as `request` records it, and max_bytes
        capped at the client's ``consumer_byte_rate`` for one quota window
        (`QuotaManager.max_value_in_quota_window`, windowed rate: computed here; a bucket's is the
        manager's own). Not the common case: a ``consumer_record_rate`` (its cap needs the
        engine's bytes per record)."""
        engine = self._engine
        if self._consumer_record_rate in engine.active_kinds:
            return None
        cdef _Entry entry = self._valid_entry(self._fetch_entries, broker_id, identity, self._fetch)
        if entry is None:
            return None
        manager = entry.manager
        cdef _Slot rate = _slot_of(entry, self._request_rate)
        cdef _Slot fetch = _slot_of(entry, self._fetch)
        decision = None if rate is None else self._one(manager, entry, rate, identity, 1.0)
        cap = None
        if fetch is not None:
            cap = self._cap(manager, entry, fetch, identity)
        whole = engine.needs_fetch_usage
        if decision is None or decision is rate.decision:
            if (entry.verdict is None or entry.verdict_first is not decision or entry.verdict_cap != cap
                    or entry.verdict_whole is not whole):
                entry.verdict = self._verdict_type(() if decision is None else (decision,), 0, cap, whole)
                entry.verdict_first = decision
                entry.verdict_cap = cap
                entry.verdict_whole = whole
            return entry.verdict
        return self._verdict_type((decision,), 0 if decision.shadow else decision.would_throttle_ms, cap, whole)

    def fetch_request_verdict(self, broker_id, identity):
        """`QuotaEngine.fetch_request(broker_id, identity)`."""
        verdict = self.fetch_request(broker_id, identity)
        if verdict is not None:
            return verdict
        return self._engine._fetch_request_charged(broker_id, identity, share=False, topics=())

    def fetch_response(self, broker_id, identity, size_bytes, request_throttle_ms):
        """`QuotaEngine.fetch_response(broker_id, identity, size_bytes, None, request_throttle_ms)`
        (a response not read whole), or None (nothing done): the bytes admitted on the client's
        ``consumer_byte_rate`` as `QuotaManager.admit_fetch` admits them on a windowed rate
        (recorded, then decided), a bucket's by the manager's own `admit_fetch_at` at the same clock
        reading; throttled by its bytes or by the request, the response is to be emptied and
        its bytes are taken back (`QuotaManager.unrecord`), as the engine does."""
        cdef _Entry entry = self._valid_entry(self._fetch_entries, broker_id, identity, self._fetch)
        if entry is None:
            return None
        manager = entry.manager
        cdef _Slot fetch = _slot_of(entry, self._fetch)
        if fetch is None:  # no byte budget: nothing recorded; the request's throttle still empties it
            if request_throttle_ms == 0:
                return self._no_fetch_response
            return self._response_type((), 0, True, 0)
        cdef long long now_ms = _now_ms(entry)
        now = now_ms
        cdef bint recorded = True
        cdef bint debt = False
        sensor = fetch.sensor
        if (now_ms - <long long>manager._last_sweep_ms >= SWEEP_INTERVAL_MS
                or entry.epoch != <long long>manager._bindings_epoch or get(sensor, S_BUCKET) is not None):
            admission = manager.admit_fetch_at(identity, size_bytes, now)
            decision = admission.decision
            recorded = admission.recorded
            debt = admission.throttle_is_debt
        else:
            decision = self._one_at(manager, fetch, identity, <double>size_bytes, now, now_ms)
        cdef long long throttle = 0 if decision.shadow else decision.would_throttle_ms
        cdef long long new_ms = 0 if debt else throttle
        cdef long long debt_ms = throttle if debt else 0
        if new_ms == 0 and request_throttle_ms == 0:
            if decision is fetch.decision and debt_ms == 0:
                if entry.response is None or entry.response_decision is not decision:
                    entry.response = self._response_type((decision,), 0)
                    entry.response_decision = decision
                return entry.response
            return self._response_type((decision,), new_ms, False, debt_ms)
        if recorded:  # Kafka empties it: what it carried was not delivered
            manager.unrecord(self._fetch, identity, size_bytes)
        return self._response_type((decision,), new_ms, True, debt_ms)

    def fetch_response_verdict(self, broker_id, identity, size_bytes, request_throttle_ms):
        """`QuotaEngine.fetch_response(broker_id, identity, size_bytes, None, request_throttle_ms)`."""
        verdict = self.fetch_response(broker_id, identity, size_bytes, request_throttle_ms)
        if verdict is not None:
            return verdict
        return self._engine._fetch_response_charged(broker_id, identity, size_bytes, None, request_throttle_ms)

    cdef object _cap(self, object manager, _Entry entry, _Slot fetch, object identity):
        """`int(manager.max_value_in_quota_window(FETCH, identity))`, or None for no cap (`math.inf`)."""
        if entry.epoch != <long long>manager._bindings_epoch:  # the request's record swept: look up again
            cap = manager.max_value_in_quota_window(self._fetch, identity)
        else:
            sensor = fetch.sensor
            bound = get(sensor, S_BOUND)
            if bound is None:
                return None
            if get(sensor, S_BUCKET) is not None or type(bound) is not float:
                cap = manager.max_value_in_quota_window(self._fetch, identity)
            else:  # bound x (samples - 1) x window_s, as the manager multiplies it
                cap = (<double>bound * <double>(<long long>manager._rate_config.samples - 1)
                       * (<double>(<long long>manager._window_ms) / 1000.0))
        if cap == _INF:
            return None
        return int(cap)

    cdef _Entry _valid_entry(self, dict entries, object broker_id, object identity, object bytes_kind):
        """The caller's cached lookups in the one manager of its request (`_charge`'s), read afresh
        when stale; None when the request is not the common case."""
        engine = self._engine
        if engine.cluster_wide is not None or engine._broker_bps is not None:
            return None
        manager = engine._managers.get(None if self._cluster_scope else broker_id)
        if manager is None:
            return None
        kinds = engine.active_kinds
        cdef _Entry entry = entries.get(id(identity))
        if (entry is None or entry.identity is not identity or entry.manager is not manager
                or entry.kinds is not kinds or entry.epoch != <long long>manager._bindings_epoch):
            entry = self._entry(entries, manager, kinds, identity, True, bytes_kind)
        return entry

    cdef object _charge(self, dict entries, object broker_id, object identity, bint count_request,
                        object bytes_kind, double value):
        cdef _Entry entry = self._valid_entry(entries, broker_id, identity, bytes_kind)
        if entry is None:
            return None
        manager = entry.manager
        if entry.first is None:
            return self._empty
        cdef _Slot a = entry.first
        cdef _Slot b = entry.second
        cdef object first, second = None
        first = self._one(manager, entry, a, identity, 1.0 if a.kind is self._request_rate else value)
        if b is not None:
            second = self._one(manager, entry, b, identity, value)
        if first is a.decision and (b is None or second is b.decision):
            if entry.verdict is None or entry.verdict_first is not first or entry.verdict_second is not second:
                entry.verdict = self._verdict_type((first,) if b is None else (first, second), 0)
                entry.verdict_first = first
                entry.verdict_second = second
            return entry.verdict
        decisions = (first,) if b is None else (first, second)
        cdef long long throttle = 0, ms
        for d in decisions:
            ms = 0 if d.shadow else d.would_throttle_ms
            if ms > throttle:
                throttle = ms
        return self._verdict_type(decisions, throttle)

    cdef _Entry _entry(self, dict entries, object manager, object kinds, object identity,
                       bint count_request, object bytes_kind):
        """The caller's lookups read afresh from the manager; None while one is not bound yet (the
        engine's Python path binds it) or is not the common case."""
        if manager._poll_reset or manager._observer is not None:
            return None
        wanted = []
        if count_request and self._request_rate in kinds:
            wanted.append(self._request_rate)
        if bytes_kind is not None and bytes_kind in kinds:
            wanted.append(bytes_kind)
        cdef _Entry entry = _Entry()
        entry.identity = identity
        entry.manager = manager
        entry.kinds = kinds
        entry.epoch = manager._bindings_epoch
        entry.clock = manager._clock
        entry.system_clock = type(entry.clock) is SystemClock
        cdef _Slot slot
        slots = []
        for kind in wanted:
            sensor = manager._bindings[kind].get(identity)
            if type(sensor) is not _SENSOR or type(get(sensor, S_RATE)) is not SampledRate:
                return None  # none yet (None), or not the sensor whose slots are read here
            slot = _Slot()
            slot.kind = kind
            slot.sensor = sensor
            slots.append(slot)
        if len(slots) > 0:
            entry.first = slots[0]
        if len(slots) > 1:
            entry.second = slots[1]
        if len(entries) >= MAX_ENTRIES:
            entries.clear()
        entries[id(identity)] = entry
        return entry

    cdef object _one(self, object manager, _Entry entry, _Slot slot, object identity, double value):
        """`manager.record_and_check(slot.kind, identity, value)`."""
        cdef long long now_ms = _now_ms(entry)
        now = now_ms
        if (now_ms - <long long>manager._last_sweep_ms >= SWEEP_INTERVAL_MS
                or entry.epoch != <long long>manager._bindings_epoch):
            return self._slow(manager, slot.kind, identity, value, now)  # a sweep, or one just ran
        return self._one_at(manager, slot, identity, value, now, now_ms)

    cdef object _one_at(self, object manager, _Slot slot, object identity, double value, object now,
                        long long now_ms):
        """`_one` once it is known that no sweep is due and the slot's sensor is still bound: the
        manager's `_record_on` and `_decide` at the clock reading `now` (`now_ms` in C)."""
        kind = slot.kind
        sensor = slot.sensor
        last_sweep = manager._last_sweep_ms
        bucket = get(sensor, S_BUCKET)
        bound = get(sensor, S_BOUND)
        owed = get(sensor, S_OWED)
        if (get(sensor, S_TOUCHED_SWEEP_MS) != last_sweep
                or (bound is not None and type(bound) is not float)
                or (bucket is not None and type(bucket) is not TokenBucket)
                or (owed and (bucket is not None or type(owed) is not float))):
            manager._record_on(sensor, value, now)
            return manager._decide(kind, sensor, now)
        # manager._record_on
        put(sensor, S_LAST_RECORD_MS, now)
        cdef SampledRate rate = <SampledRate>get(sensor, S_RATE)
        rate.record(value, now_ms)
        put(sensor, S_USED_TOTAL, get(sensor, S_USED_TOTAL) + value)
        cdef double b = 0.0
        if bucket is not None and bound is not None:
            b = <double>bound
            (<TokenBucket>bucket).record(value, b, b * <double>get(sensor, S_BURST_S), now_ms)
        # manager._decide, up to its throttle
        cdef double total
        cdef long long window_ms
        rate._purge(now_ms, &total, &window_ms)
        if owed:  # a fleet share that rose, still owed (manager._owed)
            total += _owed(manager, sensor, <double>owed, now_ms)
        cdef double observed = total / (<double>window_ms / 1000.0)
        if bound is not None:
            b = <double>bound
            if bucket is None:
                if observed > b:
                    return manager._decide(kind, sensor, now)
            elif (<TokenBucket>bucket).measure(b, b * <double>get(sensor, S_BURST_S), now_ms) < 0:
                return manager._decide(kind, sensor, now)
        shadow = get(sensor, S_SHADOW)
        entity = get(sensor, S_ENTITY)
        if slot.decision is None or slot.bound is not bound or slot.shadow is not shadow or slot.entity is not entity:
            slot.decision = self._decision_type(kind, get(sensor, S_KEY), 0, float("nan"), bound, shadow, entity)
            slot.bound = bound
            slot.shadow = shadow
            slot.entity = entity
        return slot.decision

    cdef object _slow(self, object manager, object kind, object identity, double value, object now):
        """`record_and_check` at the clock reading already taken."""
        return manager.record_and_check_at(kind, identity, value, now)
