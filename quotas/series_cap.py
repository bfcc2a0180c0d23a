"""How many series one metric may have: a cap on label sets (`metrics.max_series_per_metric`).

Pure bookkeeping, no metrics library: the collectors (`proxy.ops.metrics`, `proxy.fleet.member`)
ask it which members get a series of their own and fold the rest into one overflow series.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

#: The label value that stands for every member beyond `metrics.max_series_per_metric`.
OVERFLOW = "__overflow__"
#: `metrics.max_series_per_metric`'s default.
DEFAULT_MAX_SERIES_PER_METRIC = 2000

M = TypeVar("M", bound=Hashable)


class SeriesCap(Generic[M]):
    """Which members get series of their own: at most `limit`. A member is a series' identity: for
    the quota metrics a broker label and a sensor key, for the fleet's shares a scope and a key.

    A sensor that comes while `limit` have their own series is *folded*: its values go into the
    ``user="__overflow__", client_id="__overflow__"`` series of its broker and kind, and it is
    counted once in `folded_total`. A sensor keeps its own series until it expires (an hour
    without a record); a freed place goes to a folded sensor first (the most recently active one:
    `live` lists the least recently active first), then to a newcomer. Nothing ever moves from its
    own series into the overflow, so series do not flap and counters stay monotonic; client-id
    churn within the hour only grows the overflow, never the number of series.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_series_per_metric must be >= 1, got {limit}")
        self.limit = limit
        self.folded_total = 0
        self._own: set[M] = set()
        self._folded: set[M] = set()

    def folds(self, member: M) -> bool:
        """Whether `member` was folded into the overflow at the last `split`."""
        return member in self._folded

    def split(self, live: list[M]) -> set[M]:
        """Forget the sensors no longer `live`, place the others; returns the folded ones."""
        present = set(live)
        self._own &= present
        self._folded &= present
        own, folded = self._own, self._folded
        if len(own) < self.limit:
            for member in [m for m in reversed(live) if m in folded]:
                if len(own) >= self.limit:
                    break
                folded.discard(member)
                own.add(member)
        for member in live:
            if member in own or member in folded:
                continue
            if len(own) < self.limit:
                own.add(member)
            else:
                folded.add(member)
                self.folded_total += 1
        return folded
