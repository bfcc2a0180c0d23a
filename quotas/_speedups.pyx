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
        cdef timespec ts
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return <long long>ts.tv_sec * 1000 + <long long>ts.tv_nsec // 1000000
