"""CPU seconds of a process, from /proc: the one way every benchmark measures a proxy's CPU."""

from __future__ import annotations

import os
import time
from pathlib import Path

TICK_S = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int | None, children: bool = True) -> float:
    """CPU seconds a process (and, with `children`, its live child processes: Sluice's access-log
    writer) has used so far, all threads; 0 if unknown or gone.

    From the scheduler's per-thread run time (ns resolution) where the kernel has schedstats,
    else from utime + stime in clock ticks (10 ms resolution).
    """
    if pid is None:
        return 0.0
    own = own_cpu_s(pid)
    if not children:
        return own
    return own + sum(process_cpu_s(child) for child in child_pids(pid))


def wait_quiet(pid: int, busy_share: float = 0.05, window_s: float = 1.5, timeout_s: float = 60.0) -> float:
    """Wait until `pid` and its children use under `busy_share` of a CPU over a whole `window_s`
    (Sluice's access-log writer is a process of its own, which starts up for seconds after the
    proxy listens and reads its first batch up to a second after the first records: a measurement
    that began then would count that start-up); the seconds waited.
    Raises TimeoutError past `timeout_s`."""
    began = time.monotonic()
    while True:
        c0, t0 = process_cpu_s(pid), time.monotonic()
        time.sleep(window_s)  # a benchmark's measuring window, not a test's wait
        if (process_cpu_s(pid) - c0) / (time.monotonic() - t0) < busy_share:
            return time.monotonic() - began
        if time.monotonic() - began > timeout_s:
            raise TimeoutError(f"process {pid} still busy after {timeout_s:g} s")


def own_cpu_s(pid: int) -> float:
    try:
        return sum(int((task / "schedstat").read_text().split()[0])
                   for task in Path(f"/proc/{pid}/task").iterdir()) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK_S  # utime + stime


def child_pids(pid: int) -> list[int]:
    """The live child processes of `pid`."""
    try:
        return [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                for c in (task / "children").read_text().split()]
    except (OSError, ValueError):
        return []


def thread_times(pid: int, tid: int | None = None) -> tuple[float, float, int]:
    """(user s, system s, minor faults) of one thread of `pid` (its first, the event loop's, by
    default), in clock ticks."""
    fields = Path(f"/proc/{pid}/task/{tid or pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK_S, int(fields[12]) / TICK_S, int(fields[7])
