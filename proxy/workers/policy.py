"""Pure decisions of the supervisor: how long to wait before restarting a worker, and its command line."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartBackoff:
    """A worker that dies soon after it started waits longer before each restart (doubling from
    `initial_ms` up to `max_ms`); one that ran for `stable_after_ms` or more starts from
    `initial_ms` again, so a crash loop cannot spin the CPU and a rare crash is repaired at once."""

    initial_ms: int = 100
    max_ms: int = 5_000
    stable_after_ms: int = 10_000

    def delay_ms(self, previous_delay_ms: int | None, ran_ms: int) -> int:
        """The wait before the next start, given the wait before the last one (None: first restart)
        and how long the worker then ran."""
        if previous_delay_ms is None or ran_ms >= self.stable_after_ms:
            return self.initial_ms
        return min(self.max_ms, max(self.initial_ms, previous_delay_ms * 2))


ONCE_FLAGS = ("--reseed",)
"""Flags that act on shared state once per instance start: only worker 0's first start keeps them
(a restarted worker must not replace the quota store's contents with the YAML again)."""


def worker_argv(argv: Sequence[str], index: int, first_start: bool) -> list[str]:
    """The supervisor's own `sluice` arguments (`proxy --config ...`) as a worker runs them."""
    keep_once = index == 0 and first_start
    return [a for a in argv if keep_once or a not in ONCE_FLAGS]
