"""The per-request counters are plain integers, exposed in Prometheus' format at scrape time; the
quota sensors' series: throttle time over Kafka's window, counters as counters, a cardinality cap."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from protocol.apis import ApiKey
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext
from proxy.ops.metrics import OVERFLOW, QuotaSensorCollector, SeriesCap, SluiceMetrics
from quotas import DEFAULT, ClientIdentity, FakeClock, QuotaConfig, QuotaEntity, QuotaEntry
from quotas.engine import QuotaEngine
from quotas.entity import QuotaKind, SensorKey
from quotas.manager import ThrottleDecision

CTX = ConnectionContext(1, "127.0.0.1:5000", "broker 1", 1)


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_requests_and_bytes_by_api_connections_and_violations() -> None:
    registry = CollectorRegistry()
    metrics = SluiceMetrics(registry)
    for response_bytes in (100, 300):
        entry = InFlight(1, ApiKey.PRODUCE, 9, "app", 1000, 0)
        entry.response_bytes = response_bytes
        metrics.requests.on_complete(CTX, entry, 0)
    metrics.requests.on_complete(CTX, InFlight(2, ApiKey.METADATA, 12, "app", 50, 0), 0)
    metrics.connection_opened("broker 1")
    metrics.connection_opened("broker 1")
    metrics.connection_closed("broker 1")
    key = SensorKey(QuotaKind.PRODUCE, "", "app")
    metrics.on_violation(CTX, ThrottleDecision(QuotaKind.PRODUCE, key, 120, 2000.0, 1000.0, shadow=True))
    metrics.rewrite_failures.inc()
    got = samples(registry)
    assert got[("sluice_requests_total", (("api", "Produce"),))] == 2
    assert got[("sluice_request_bytes_total", (("api", "Produce"),))] == 2000
    assert got[("sluice_response_bytes_total", (("api", "Produce"),))] == 400
    assert got[("sluice_requests_total", (("api", "Metadata"),))] == 1
    assert got[("sluice_open_connections", (("listener", "broker 1"),))] == 1
    assert got[("sluice_quota_violations_total", (("kind", "produce"), ("mode", "shadow")))] == 1
    assert got[("sluice_rewrite_failures_total", ())] == 1


# ---- the quota sensor collector: windowed throttle time, counters, the cardinality cap ----

P = QuotaKind.PRODUCE


def quota_collector(max_series: int = 2000) -> tuple[CollectorRegistry, QuotaEngine, FakeClock]:
    clock = FakeClock()
    config = QuotaConfig((QuotaEntry(QuotaEntity(client_id=DEFAULT), {P: 100}),))
    managers = QuotaEngine(config, clock)
    registry = CollectorRegistry()
    registry.register(QuotaSensorCollector(managers, clock, max_series))
    return registry, managers, clock


def series(registry: CollectorRegistry, name: str) -> dict[str, float]:
    """client_id -> value of one metric's samples."""
    return {dict(labels)["client_id"]: value for (n, labels), value in samples(registry).items() if n == name}


def test_throttle_time_is_windowed_and_counts_are_counters() -> None:
    registry, managers, clock = quota_collector()
    manager = managers.for_broker(1)
    app = ClientIdentity("", "app")
    for value in (700, 500, 300):            # 70, 120, 150 B/s against 100: 2000 and 5000 ms
        manager.record_and_check(P, app, value)
    text = generate_latest(registry).decode()
    assert "# TYPE sluice_quota_throttled_requests_total counter" in text
    assert "# TYPE sluice_quota_throttle_time_avg_ms gauge" in text
    assert series(registry, "sluice_quota_throttled_requests_total") == {"app": 2}
    assert series(registry, "sluice_quota_throttle_time_avg_ms") == {"app": 3500.0}
    assert series(registry, "sluice_quota_throttle_time_max_ms") == {"app": 5000.0}
    clock.advance(60_000)                    # Kafka's metric window (2 x 30 s) has passed
    assert series(registry, "sluice_quota_throttle_time_avg_ms") == {}
    assert series(registry, "sluice_quota_throttle_time_max_ms") == {}
    assert series(registry, "sluice_quota_throttled_requests_total") == {"app": 2}  # a counter stays
    clock.advance(10_000)
    manager.record_and_check(P, app, 1100)   # 110 B/s over 10 s: 1000 ms
    assert series(registry, "sluice_quota_throttle_time_max_ms") == {"app": 1000.0}  # not the old 5000
    assert series(registry, "sluice_quota_throttled_requests_total") == {"app": 3}


def test_series_beyond_the_cap_are_folded_and_counted() -> None:
    registry, managers, clock = quota_collector(max_series=3)
    manager = managers.for_broker(1)
    for i in range(10):                      # each over its quota at once: one throttle each
        manager.record_and_check(P, ClientIdentity("", f"c{i}"), 2000)
    rates = series(registry, "sluice_quota_produce_byte_rate")
    assert len(rates) == 4 and OVERFLOW in rates   # three clients of their own and the overflow
    own = sorted(c for c in rates if c != OVERFLOW)
    assert rates[OVERFLOW] == 7 * 200.0            # the folded seven's rates add up
    assert series(registry, "sluice_quota_throttled_requests_total")[OVERFLOW] == 7
    assert series(registry, "sluice_quota_throttle_time_max_ms")[OVERFLOW] == 10_000.0
    assert OVERFLOW not in series(registry, "sluice_quota_limit")
    assert len(series(registry, "sluice_quota_limit")) == 3
    assert samples(registry)[("sluice_metrics_series_folded_total", ())] == 7
    assert samples(registry)[("sluice_metrics_folded_sensors", ())] == 7
    # Scraping again places nobody anew: same series, same count (no flapping).
    assert sorted(c for c in series(registry, "sluice_quota_produce_byte_rate") if c != OVERFLOW) == own
    assert samples(registry)[("sluice_metrics_series_folded_total", ())] == 7

    # Churn within the hour: 20 more client ids never add a series, only the overflow grows.
    clock.advance(1000)
    for i in range(10, 30):
        manager.record_and_check(P, ClientIdentity("", f"c{i}"), 2000)
    assert len(series(registry, "sluice_quota_produce_byte_rate")) == 4
    assert samples(registry)[("sluice_metrics_series_folded_total", ())] == 27
    overflow_throttles = series(registry, "sluice_quota_throttled_requests_total")[OVERFLOW]
    assert overflow_throttles == 27

    # An hour later the idle sensors expire: their places go to the newcomers, and the overflow
    # counter keeps its total (monotonic, as a counter must be).
    clock.advance(3_600_001 + 30_000)
    for i in range(30, 35):
        manager.record_and_check(P, ClientIdentity("", f"c{i}"), 2000)
    rates = series(registry, "sluice_quota_produce_byte_rate")
    assert sorted(c for c in rates if c != OVERFLOW) == ["c30", "c31", "c32"]
    assert series(registry, "sluice_quota_throttled_requests_total")[OVERFLOW] == 27 + 2
    assert samples(registry)[("sluice_metrics_series_folded_total", ())] == 29
    assert samples(registry)[("sluice_metrics_folded_sensors", ())] == 2


def test_series_cap_first_come_first_served_and_freed_places_go_to_the_folded() -> None:
    cap = SeriesCap(2)
    a, b, c, d, e = (("1", SensorKey(P, "", name)) for name in "abcde")
    assert cap.split([a, b, c]) == {c}
    assert cap.split([c, d, a, b]) == {c, d}      # a and b keep their places: no flapping
    assert cap.folded_total == 2
    # a expired: its place goes to the most recently active folded sensor (live lists the least
    # recently active first), not to the newcomer e
    assert cap.split([c, d, b, e]) == {c, e}
    assert cap.folded_total == 3
    assert cap.split([e]) == set()
    with pytest.raises(ValueError, match="max_series_per_metric"):
        SeriesCap(0)
