"""The per-request counters are plain integers, exposed in Prometheus' format at scrape time."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from protocol.apis import ApiKey
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext
from proxy.ops.metrics import SluiceMetrics
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
        metrics.on_complete(CTX, entry, 0)
    metrics.on_complete(CTX, InFlight(2, ApiKey.METADATA, 12, "app", 50, 0), 0)
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
