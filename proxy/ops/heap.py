"""Giving the heap's free pages back to the kernel: glibc's `malloc_trim`, on a timer.

CPython hands buffers of more than 512 bytes (frames, responses, access-log batches) to the C
allocator. When many connections are busy at once (a thousand idle clients refreshing metadata
together, consumers' fetches landing together) the heap grows to that peak; once those buffers are
freed, glibc keeps the free pages unless they are at the very top of the heap, so the resident size
stays at the highest peak seen and creeps up as rarer peaks come. It is not a leak: in the soak of
2026-11-25 (`docs/benchmarks.md`), one `malloc_trim(0)` took a Sluice process from 104 to 88 MiB,
all of the rise since the warm-up.

`HeapTrimmer` calls `malloc_trim(0)` every `heap_trim_interval_ms` in the loop's default executor,
so the event loop does not wait on it (ctypes releases the GIL), and counts the trims and the bytes
the resident size fell by (`sluice_heap_trims_total`, `sluice_heap_trimmed_bytes_total`). Without
glibc (musl) there is nothing to call: logged once.

It is off by default (0). The memory glibc keeps is reused by the next burst, so it bounds itself
at the load's peak: the 20-minute soak stayed within 5.7 % of its median after warm-up without
trimming. With a trim every 60 s the resident size follows the load down and up again instead
(a 10-minute soak: 85.9-103.1 MiB, 10.5 % from the median), lower on average but less flat. Turn
it on where the memory between bursts matters more than a steady resident size.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger("sluice.heap")

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def glibc_malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim(pad)`, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def resident_bytes() -> int:
    """This process's resident set size (`/proc/self/statm`), 0 where there is no procfs."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


class HeapTrimmer:
    """Trims the heap every `interval_s`; `trim` and `rss` are injectable for tests."""

    def __init__(self, interval_s: float, trim: Callable[[int], int] | None,
                 rss: Callable[[], int] = resident_bytes) -> None:
        self.interval_s = interval_s
        self._trim = trim
        self._rss = rss
        self.trims = 0
        self.trimmed_bytes = 0

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0 and self._trim is not None

    def trim_once(self) -> int:
        """Trim now; the bytes the resident size fell by (0 if it did not)."""
        if self._trim is None:
            return 0
        before = self._rss()
        self._trim(0)
        released = max(0, before - self._rss())
        self.trims += 1
        self.trimmed_bytes += released
        return released

    async def run(self) -> None:
        """Trim every `interval_s` until cancelled."""
        if self.interval_s <= 0:
            return
        if self._trim is None:
            log.info("heap trimming is off: the C library has no malloc_trim (not glibc)")
            return
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.interval_s)
            released = await loop.run_in_executor(None, self.trim_once)
            if released:
                log.debug("heap trimmed: %d bytes back to the kernel", released)


class HeapTrimCollector(Collector):
    def __init__(self, trimmer: HeapTrimmer) -> None:
        self._trimmer = trimmer

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("sluice_heap_trims", "malloc_trim calls (heap_trim_interval_ms)",
                                  value=self._trimmer.trims)
        yield CounterMetricFamily("sluice_heap_trimmed_bytes", "Bytes the resident size fell by when the "
                                  "heap's free pages were given back to the kernel",
                                  value=self._trimmer.trimmed_bytes)


__all__ = ["HeapTrimCollector", "HeapTrimmer", "glibc_malloc_trim", "resident_bytes"]
