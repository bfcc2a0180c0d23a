"""What one client connection has done lately, for the connection inventory (`GET /connections`).

The hot path only adds to counters (`ConnectionStats.count`, called by
`proxy.stages.connection_stats.ConnectionStatsStage` once per completed request). Rates are worked
out when someone asks: `sample` keeps a few timestamped copies of the counters (the server calls it
about once a second for every connection), and `window` subtracts the copy taken about `window_ms`
ago from the counters now. No I/O and no clock of its own: every time is an argument, so tests
drive it with plain integers.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from protocol.apis import ApiKey
from quotas.entity import QuotaEntity, QuotaKind

_PRODUCE = int(ApiKey.PRODUCE)
_FETCHES = frozenset({int(ApiKey.FETCH), int(ApiKey.SHARE_FETCH)})


@dataclass(frozen=True, slots=True)
class Counters:
    """Totals since the connection opened."""

    requests: int = 0
    produce_requests: int = 0
    produce_bytes: int = 0          # Produce request sizes (header + body), as quotas count them
    fetch_requests: int = 0
    fetch_bytes: int = 0            # Fetch / ShareFetch response sizes sent to the client
    throttle_ms: int = 0            # the throttle time Sluice told the client, summed over requests


@dataclass(frozen=True, slots=True)
class WindowRates:
    """Per second over the last `window_ms` (or since the connection opened, if that is shorter)."""

    window_ms: int
    requests_per_s: float
    produce_requests_per_s: float
    produce_bytes_per_s: float
    fetch_requests_per_s: float
    fetch_bytes_per_s: float
    throttle_ms: int                # throttle time told to the client within the window


class ConnectionStats:
    """Counters of one connection plus the samples its rates are computed from."""

    __slots__ = ("_samples", "client_id", "fetch_bytes", "fetch_requests", "opened_ms", "produce_bytes",
                 "produce_requests", "quota_entities", "requests", "throttle_ms")

    def __init__(self, opened_ms: int = 0) -> None:
        self.opened_ms = opened_ms
        self.requests = self.produce_requests = self.produce_bytes = 0
        self.fetch_requests = self.fetch_bytes = self.throttle_ms = 0
        self.client_id: str | None = None     # the client id of the latest request
        # per quota kind, the configured entity whose value applied to the latest request
        self.quota_entities: dict[QuotaKind, QuotaEntity] = {}
        self._samples: deque[tuple[int, Counters]] = deque([(opened_ms, Counters())])

    def count(self, api_key: int, request_bytes: int, response_bytes: int, throttle_ms: int) -> None:
        """One request done (its response sent, or none expected)."""
        self.requests += 1
        if api_key == _PRODUCE:
            self.produce_requests += 1
            self.produce_bytes += request_bytes
        elif api_key in _FETCHES:
            self.fetch_requests += 1
            self.fetch_bytes += response_bytes
        if throttle_ms > 0:
            self.throttle_ms += throttle_ms

    def counters(self) -> Counters:
        return Counters(self.requests, self.produce_requests, self.produce_bytes, self.fetch_requests,
                        self.fetch_bytes, self.throttle_ms)

    def sample(self, now_ms: int, window_ms: int) -> None:
        """Keep a copy of the counters at `now_ms`; forget copies no window starting now would use."""
        samples = self._samples
        samples.append((now_ms, self.counters()))
        start_ms = now_ms - window_ms
        while len(samples) > 1 and samples[1][0] <= start_ms:
            samples.popleft()  # the newest sample at or before the window start stays as its base

    def window(self, now_ms: int, window_ms: int) -> WindowRates:
        """Rates over the last `window_ms`: from the newest sample at or before its start (else the
        oldest kept, at worst the opening) to the counters now."""
        start_ms = now_ms - window_ms
        base_ms, base = self._samples[0]
        for sample_ms, counters in self._samples:
            if sample_ms > start_ms:
                break
            base_ms, base = sample_ms, counters
        now = self.counters()
        span_ms = now_ms - base_ms
        if span_ms <= 0:
            return WindowRates(0, 0.0, 0.0, 0.0, 0.0, 0.0, now.throttle_ms - base.throttle_ms)
        per_s = 1000.0 / span_ms
        return WindowRates(
            window_ms=span_ms,
            requests_per_s=(now.requests - base.requests) * per_s,
            produce_requests_per_s=(now.produce_requests - base.produce_requests) * per_s,
            produce_bytes_per_s=(now.produce_bytes - base.produce_bytes) * per_s,
            fetch_requests_per_s=(now.fetch_requests - base.fetch_requests) * per_s,
            fetch_bytes_per_s=(now.fetch_bytes - base.fetch_bytes) * per_s,
            throttle_ms=now.throttle_ms - base.throttle_ms)
