"""`HeapTrimmer`: trims on its interval off the event loop, counts what it gave back; the real
glibc `malloc_trim` gives back a freed peak."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from proxy.config import ConfigError, load_config
from proxy.ops.heap import HeapTrimCollector, HeapTrimmer, glibc_malloc_trim, resident_bytes


def test_a_trim_counts_the_bytes_the_resident_size_fell_by() -> None:
    sizes = iter([100_000_000, 84_000_000, 84_000_000, 84_500_000])
    calls: list[int] = []
    trimmer = HeapTrimmer(60, lambda pad: calls.append(pad) or 1, lambda: next(sizes))
    assert trimmer.trim_once() == 16_000_000
    assert trimmer.trim_once() == 0          # it grew meanwhile: nothing given back, never negative
    assert calls == [0, 0] and trimmer.trims == 2 and trimmer.trimmed_bytes == 16_000_000
    registry = CollectorRegistry()
    registry.register(HeapTrimCollector(trimmer))
    assert registry.get_sample_value("sluice_heap_trims_total") == 2
    assert registry.get_sample_value("sluice_heap_trimmed_bytes_total") == 16_000_000


async def test_run_trims_every_interval_until_cancelled() -> None:
    loop = asyncio.get_running_loop()
    three = asyncio.Event()
    calls: list[int] = []

    def trim(pad: int) -> int:  # runs in the executor: tell the loop when the third trim came
        calls.append(pad)
        if len(calls) == 3:
            loop.call_soon_threadsafe(three.set)
        return 1

    trimmer = HeapTrimmer(0.01, trim, lambda: 0)
    task = loop.create_task(trimmer.run())
    await asyncio.wait_for(three.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_interval_zero_or_no_malloc_trim_means_never() -> None:
    for trimmer in (HeapTrimmer(0, lambda pad: 1), HeapTrimmer(0.01, None)):
        await trimmer.run()              # returns at once instead of looping
        assert not trimmer.enabled and trimmer.trims == 0


def test_glibc_gives_back_a_freed_peak() -> None:
    trim = glibc_malloc_trim()
    assert trim is not None              # this machine's Python runs on glibc
    # 64,000 buffers of 600 B (above CPython's small-object limit: the C allocator's), one in 16
    # kept, so that what is freed lies between live memory (about 9 KB, whole pages, per gap)
    # rather than at the heap's top, where glibc would give it back by itself
    buffers = [bytearray(600) for _ in range(64_000)]
    kept = buffers[::16]
    del buffers
    before = resident_bytes()
    trim(0)
    after = resident_bytes()
    assert before - after >= 8 * 1024 * 1024, (before, after)   # about 36 MB freed: most comes back
    assert len(kept) == 4_000


def test_the_interval_is_validated_with_its_key(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "sluice.yaml"
    path.write_text("upstream: {bootstrap: '127.0.0.1:9092'}\nheap_trim_interval_ms: -1\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "heap_trim_interval_ms" in str(err.value)
