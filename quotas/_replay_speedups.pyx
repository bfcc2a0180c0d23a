# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled twin of `quotas.replay_loop.replay_sensor`: the replay's loop with one sensor's
decisions, over typed columns, in C.

Same arguments, same `LoopResult`, bit for bit (tests/unit/differential/test_replay_loop.py): the
windowed rate is `quotas.stats.SampledRate` (Kafka's ring of N+1 samples, purge, padded window),
the token bucket `quotas.stats.TokenBucket`, the throttles `quotas.throttle` (Java's rounding),
with the same floating-point operations in the same order. The readable module is the reference;
change both together.
"""

from array import array

from libc.limits cimport LLONG_MIN
from libc.math cimport floor
from libc.stdlib cimport free, malloc

from quotas.entity import QuotaKind
from quotas.replay_loop import LoopResult

cdef long long NOT_ADMITTED = LLONG_MIN
cdef long long LONG_AGO = -(1 << 62)
cdef long long MAX_THROTTLE = 2147483647


cdef long long java_round(double x) noexcept:
    cdef double f = floor(x)
    if x - f >= 0.5:
        return <long long>f + 1
    return <long long>f


cdef long long throttle_time(double observed, double bound, long long window_ms) noexcept:
    cdef double x = (observed - bound) / bound * <double>window_ms
    if not x > 0:
        return 0
    if x >= MAX_THROTTLE:
        return MAX_THROTTLE
    return java_round(x)


cdef long long bucket_throttle(double credits, double quota) noexcept:
    if not credits < 0:
        return 0
    cdef double x = -credits / quota * 1000.0
    if x >= MAX_THROTTLE:
        return MAX_THROTTLE
    return java_round(x)


cdef class _Sensor:
    cdef double bound, burst_s, cap, credits
    cdef bint bucket, has_credits, produce_like, request, fetch
    cdef long long window_ms, samples, slots, expire_ms, min_full, cap_ms, last_ms, last_record, max_idle
    cdef int length, current
    cdef double* values
    cdef long long* starts
    cdef long long* lasts

    def __cinit__(self, model):
        window = model.window
        self.bound = model.bound
        self.samples = window.samples
        self.window_ms = window.window_ms
        self.slots = window.samples + 1
        self.expire_ms = window.samples * window.window_ms
        self.min_full = window.samples - 1
        self.bucket = model.burst_ms is not None
        self.burst_s = (model.burst_ms or 0) / 1000.0
        self.cap_ms = window.window_ms if model.kind.caps_throttle else -1
        self.produce_like = model.kind in (QuotaKind.PRODUCE, QuotaKind.PRODUCER_RECORD_RATE)
        self.request = model.kind is QuotaKind.REQUEST_RATE
        self.fetch = model.kind is QuotaKind.FETCH
        self.cap = model.fetch_cap if self.fetch else 0.0
        self.has_credits = False
        self.credits = 0.0
        self.last_ms = 0
        self.last_record = LONG_AGO
        self.max_idle = 0
        self.length = 0
        self.current = 0
        self.values = <double*>malloc(self.slots * sizeof(double))
        self.starts = <long long*>malloc(self.slots * sizeof(long long))
        self.lasts = <long long*>malloc(self.slots * sizeof(long long))
        if self.values == NULL or self.starts == NULL or self.lasts == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.values)
        free(self.starts)
        free(self.lasts)

    cdef inline void _append(self, long long now) noexcept:
        self.values[self.length] = 0.0
        self.starts[self.length] = now
        self.lasts[self.length] = now
        self.length += 1

    cdef void rate_record(self, double value, long long now) noexcept:
        cdef int i
        if self.length == 0:
            self._append(now)
        i = self.current
        if now - self.starts[i] >= self.window_ms:
            i = (i + 1) % self.slots
            self.current = i
            if i >= self.length:
                self._append(now)
            else:
                self.values[i] = 0.0
                self.starts[i] = now
        self.values[i] += value
        self.lasts[i] = now

    cdef double refill(self, long long now) noexcept:
        cdef double burst = self.bound * self.burst_s
        cdef double c
        if not self.has_credits:
            c = burst
            self.has_credits = True
        else:
            c = self.credits + self.bound * ((now - self.last_ms) / 1000.0)
            if not c < burst:  # min(burst, c)
                c = burst
        self.credits = c
        self.last_ms = now
        return c

    cdef void record(self, double value, long long now) noexcept:
        cdef double burst, c
        self.last_record = now
        self.rate_record(value, now)
        if self.bucket:
            burst = self.bound * self.burst_s
            c = self.refill(now) - value
            self.credits = c if c < burst else burst

    cdef long long check(self, long long now) noexcept:
        cdef long long throttle, elapsed, oldest, full, window
        cdef double total, observed
        cdef int i
        if self.bucket:
            throttle = bucket_throttle(self.refill(now), self.bound)
        else:
            if self.length == 0:
                self._append(now)
            total = 0.0
            oldest = now
            for i in range(self.length):
                if now - self.lasts[i] >= self.expire_ms:
                    self.values[i] = 0.0
                    self.starts[i] = now
                    self.lasts[i] = now
                total += self.values[i]
                if i == 0 or self.starts[i] < oldest:
                    oldest = self.starts[i]
            elapsed = now - oldest
            if elapsed >= 0:
                full = elapsed // self.window_ms
            else:
                full = -((-elapsed) // self.window_ms)
            if full < self.min_full:
                elapsed += (self.min_full - full) * self.window_ms
            window = elapsed if elapsed > 1 else 1
            observed = total / (window / 1000.0)
            throttle = throttle_time(observed, self.bound, window) if observed > self.bound else 0
        if self.cap_ms >= 0 and self.cap_ms < throttle:
            return self.cap_ms
        return throttle

    cdef long long decide(self, long long now, double asked, double* delivered) noexcept:
        cdef double piece
        cdef long long size, before, throttle
        if self.last_record == LONG_AGO:
            self.last_record = now
        if now - self.last_record > self.max_idle:
            self.max_idle = now - self.last_record
        if self.produce_like:
            self.record(<double>(<long long>asked), now)
            delivered[0] = asked
            return self.check(now)
        if self.request:
            self.record(1.0, now)
            delivered[0] = asked
            return self.check(now)
        piece = self.cap if self.cap < asked else asked
        size = <long long>piece
        if self.bucket:
            before = self.check(now)
            if before > 0:
                delivered[0] = 0.0
                return before
            self.record(<double>size, now)
            delivered[0] = piece
            return self.check(now)
        self.record(<double>size, now)
        throttle = self.check(now)
        if throttle > 0:
            self.record(<double>(-size), now)
            delivered[0] = 0.0
            return throttle
        delivered[0] = piece
        return 0


cdef inline bint _less(long long* ht, long long* hs, int a, int b) noexcept:
    return ht[a] < ht[b] or (ht[a] == ht[b] and hs[a] < hs[b])


cdef inline void _swap(long long* ht, long long* hs, int* hc, int a, int b) noexcept:
    cdef long long t = ht[a]
    cdef long long s = hs[a]
    cdef int c = hc[a]
    ht[a] = ht[b]; hs[a] = hs[b]; hc[a] = hc[b]
    ht[b] = t; hs[b] = s; hc[b] = c


cdef void _push(long long* ht, long long* hs, int* hc, int* size, long long t, long long s, int c) noexcept:
    cdef int i = size[0]
    cdef int parent
    size[0] += 1
    ht[i] = t; hs[i] = s; hc[i] = c
    while i > 0:
        parent = (i - 1) >> 1
        if _less(ht, hs, i, parent):
            _swap(ht, hs, hc, i, parent)
            i = parent
        else:
            break


cdef void _pop(long long* ht, long long* hs, int* hc, int* size) noexcept:
    cdef int i = 0
    cdef int n, left, right, smallest
    size[0] -= 1
    n = size[0]
    if n == 0:
        return
    ht[0] = ht[n]; hs[0] = hs[n]; hc[0] = hc[n]
    while True:
        left = 2 * i + 1
        right = left + 1
        smallest = i
        if left < n and _less(ht, hs, left, smallest):
            smallest = left
        if right < n and _less(ht, hs, right, smallest):
            smallest = right
        if smallest == i:
            break
        _swap(ht, hs, hc, i, smallest)
        i = smallest


def replay_sensor(const long long[:] ts_ms, const int[:] client, const double[:] value,
                  const long long[:] response_ms, long long end_ms, bint from_response, bint coalesce,
                  model):
    """`quotas.replay_loop.replay_sensor`, compiled (see the module docstring)."""
    cdef Py_ssize_t n = ts_ms.shape[0]
    cdef int m = 0
    cdef Py_ssize_t k
    for k in range(n):
        if client[k] + 1 > m:
            m = client[k] + 1
    admitted_arr = array("q", [NOT_ADMITTED]) * n
    remaining_arr = array("d", [0.0]) * n
    cdef long long[:] admitted = admitted_arr
    cdef double[:] remaining = remaining_arr
    for k in range(n):
        remaining[k] = value[k]
    t_at = []
    t_ms = []
    t_arrival = []
    cdef _Sensor sensor = _Sensor(model)
    cdef long long* after = <long long*>malloc((n + 1) * sizeof(long long))
    cdef long long* head = <long long*>malloc((m + 1) * sizeof(long long))
    cdef long long* tail = <long long*>malloc((m + 1) * sizeof(long long))
    cdef double* queued = <double*>malloc((m + 1) * sizeof(double))
    cdef long long* muted_until = <long long*>malloc((m + 1) * sizeof(long long))
    cdef long long* last_at = <long long*>malloc((m + 1) * sizeof(long long))
    cdef long long* ht = <long long*>malloc((m + 1) * sizeof(long long))
    cdef long long* hs = <long long*>malloc((m + 1) * sizeof(long long))
    cdef int* hc = <int*>malloc((m + 1) * sizeof(int))
    cdef int hsize = 0
    cdef long long seq = 0
    cdef double backlog = 0.0
    cdef double peak = 0.0
    cdef long long backlog_ms = LONG_AGO
    cdef Py_ssize_t i = 0
    cdef long long j, at, throttle, start
    cdef int c
    cdef double delivered, part, asked
    if (after == NULL or head == NULL or tail == NULL or queued == NULL or muted_until == NULL
            or last_at == NULL or ht == NULL or hs == NULL or hc == NULL):
        free(after); free(head); free(tail); free(queued); free(muted_until); free(last_at)
        free(ht); free(hs); free(hc)
        raise MemoryError()
    try:
        for k in range(n):
            after[k] = -1
        for c in range(m):
            head[c] = -1
            tail[c] = -1
            queued[c] = 0.0
            muted_until[c] = LONG_AGO
            last_at[c] = LONG_AGO
        while i < n or hsize > 0:
            if i < n and (hsize == 0 or ts_ms[i] <= ht[0]):
                c = client[i]
                at = ts_ms[i]
                if at != backlog_ms:
                    if backlog > peak:
                        peak = backlog
                    backlog_ms = at
                backlog += value[i]
                queued[c] += value[i]
                if head[c] < 0:
                    head[c] = i
                    tail[c] = i
                    start = at
                    if muted_until[c] > start:
                        start = muted_until[c]
                    if last_at[c] > start:
                        start = last_at[c]
                    _push(ht, hs, hc, &hsize, start, seq, c)
                    seq += 1
                else:
                    after[tail[c]] = i
                    tail[c] = i
                i += 1
                continue
            at = ht[0]
            c = hc[0]
            _pop(ht, hs, hc, &hsize)
            if at >= end_ms:
                continue
            j = head[c]
            asked = remaining[j]  # a fetch: all its client waits for, never less than the head (replay_loop)
            if coalesce and queued[c] > asked:
                asked = queued[c]
            throttle = sensor.decide(at, asked, &delivered)
            last_at[c] = at
            if throttle > 0:
                t_at.append(at)
                t_ms.append(throttle)
                t_arrival.append(j)
                muted_until[c] = at + (response_ms[j] if from_response else 0) + throttle
            if delivered > 0:
                if at != backlog_ms:
                    if backlog > peak:
                        peak = backlog
                    backlog_ms = at
                backlog -= delivered
                queued[c] -= delivered
            while j >= 0 and (delivered > 0 or remaining[j] <= 1e-9):
                part = remaining[j] if remaining[j] < delivered else delivered
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
                start = ts_ms[j]
                if muted_until[c] > start:
                    start = muted_until[c]
                if at > start:
                    start = at
                _push(ht, hs, hc, &hsize, start, seq, c)
                seq += 1
        if backlog > peak:
            peak = backlog
    finally:
        free(after); free(head); free(tail); free(queued); free(muted_until); free(last_at)
        free(ht); free(hs); free(hc)
    return LoopResult(admitted_arr, remaining_arr, t_at, t_ms, t_arrival, peak, sensor.max_idle)
