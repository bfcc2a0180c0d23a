"""Requests, request bytes and response bytes per API key: the per-request counters of /metrics.

`RequestCounters.on_complete(ctx, entry, sent_ms)` has the shape of a pipeline stage's hook (the
proxy registers the object as one, `proxy.ops.metrics`): it reads the completed request's
``api_key``, ``request_bytes`` and ``response_bytes`` and adds them up; `snapshot` is read when
/metrics is scraped. This is the readable reference; `protocol._speedups.RequestCounters` is its
compiled twin (C integers, no Python frame per request), picked by `protocol.fastpath`, and
tests/unit/differential/test_request_counters.py holds the two equal.

No I/O: part of the sans-IO `protocol` package (it knows the entry only by those three names).
"""

from __future__ import annotations

from typing import Protocol


class Completed(Protocol):
    """What the counters read of a completed request (`proxy.flow.inflight.InFlight`)."""

    @property
    def api_key(self) -> int: ...

    @property
    def request_bytes(self) -> int: ...

    @property
    def response_bytes(self) -> int: ...


class RequestCounters:
    """Per API key: requests, request bytes, response bytes (see the module docstring)."""

    __slots__ = ("_per_api",)

    def __init__(self) -> None:
        self._per_api: dict[int, list[int]] = {}  # api key -> [requests, request bytes, response bytes]

    def on_complete(self, ctx: object, entry: Completed, sent_ms: int) -> None:
        counts = self._per_api.get(entry.api_key)
        if counts is None:
            counts = self._per_api[entry.api_key] = [0, 0, 0]
        counts[0] += 1
        counts[1] += entry.request_bytes
        counts[2] += entry.response_bytes

    def snapshot(self) -> dict[int, tuple[int, int, int]]:
        """(requests, request bytes, response bytes) of every API key counted so far."""
        return {key: (c[0], c[1], c[2]) for key, c in self._per_api.items()}
