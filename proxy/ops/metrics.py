"""Prometheus metrics, in Kafka's spirit.

Per-quota metrics (`sluice_quota_*`) are read from the live quota sensors at scrape time by a
custom collector, with the sensor's tags as labels (`user`, `client_id`, empty when the tag is not
used, as Kafka's quota metric tags) plus `broker`. A sensor idle for an hour expires in the quota
manager and its series disappear, so client-id churn cannot grow the label set without bound.
Per-API counters are labelled by API name only.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from protocol.apis import api_name
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext, StageBase
from proxy.ops.access_log import AccessLogWriter
from proxy.stages.quota import DecisionObserver, QuotaManagers
from quotas.clock import Clock
from quotas.entity import QuotaKind
from quotas.manager import ThrottleDecision

_KIND_NAME = {
    QuotaKind.PRODUCE: "produce",
    QuotaKind.FETCH: "fetch",
    QuotaKind.REQUEST_RATE: "request_rate",
    QuotaKind.REQUEST_PERCENTAGE: "request_percentage",
}
_RATE_METRIC = {
    QuotaKind.PRODUCE: ("sluice_quota_produce_byte_rate", "Produce bytes per second, per quota sensor"),
    QuotaKind.FETCH: ("sluice_quota_fetch_byte_rate", "Fetch bytes per second, per quota sensor"),
    QuotaKind.REQUEST_RATE: ("sluice_quota_request_rate", "Requests per second, per quota sensor"),
    QuotaKind.REQUEST_PERCENTAGE: ("sluice_quota_request_percentage",
                                   "Upstream time in percent of one thread, per quota sensor"),
}
_SENSOR_LABELS = ["broker", "user", "client_id"]


class QuotaSensorCollector(Collector):
    def __init__(self, managers: QuotaManagers, clock: Clock) -> None:
        self._managers = managers
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        rates = {kind: GaugeMetricFamily(name, doc, labels=_SENSOR_LABELS)
                 for kind, (name, doc) in _RATE_METRIC.items()}
        kind_labels = ["kind", *_SENSOR_LABELS]
        limit = GaugeMetricFamily("sluice_quota_limit", "The quota bound applying to a sensor "
                                  "(bytes/s, requests/s or percent)", labels=kind_labels)
        t_avg = GaugeMetricFamily("sluice_quota_throttle_time_avg_ms",
                                  "Average of non-zero throttle times (ms)", labels=kind_labels)
        t_max = GaugeMetricFamily("sluice_quota_throttle_time_max_ms",
                                  "Largest throttle time (ms)", labels=kind_labels)
        t_count = GaugeMetricFamily("sluice_quota_throttled_requests",
                                    "Requests throttled so far, per live sensor", labels=kind_labels)
        shadow = GaugeMetricFamily("sluice_quota_shadow_would_throttle",
                                   "Requests that would have been throttled (shadow mode), per live sensor",
                                   labels=kind_labels)
        sensors = GaugeMetricFamily("sluice_quota_sensors", "Live quota sensors", labels=["broker"])
        now_ms = self._clock.now_ms()
        for broker, manager in self._managers.labelled():
            sensors.add_metric([broker], manager.sensor_count)
            for snap in manager.sensors():
                key = snap.key
                labels = [broker, key.user, key.client_id]
                klabels = [_KIND_NAME[key.kind], *labels]
                rates[key.kind].add_metric(labels, snap.rate.measure(now_ms))
                bound = manager.quota_bound(key)
                if bound is not None:
                    limit.add_metric(klabels, bound)
                stats = manager.throttle_stats(key)
                if stats is not None and stats.count:
                    t_avg.add_metric(klabels, stats.avg_ms)
                    t_max.add_metric(klabels, stats.max_ms)
                    t_count.add_metric(klabels, stats.count)
                shadow_stats = manager.shadow_throttle_stats(key)
                if shadow_stats is not None and shadow_stats.count:
                    shadow.add_metric(klabels, shadow_stats.count)
        yield from rates.values()
        yield from (limit, t_avg, t_max, t_count, shadow, sensors)
        yield self._configured()

    def _configured(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily("sluice_quota_configured", "Configured quota entries (value per key)",
                                   labels=["entity", "key", "shadow"])
        config = self._managers.config
        for entry in config:
            for kind, value in entry.values.items():
                shadow = entry.shadow or config.shadow_all
                family.add_metric([entry.entity.describe(), kind.value, str(shadow).lower()],
                                  value if math.isfinite(value) else float("nan"))
        return family


class SluiceMetrics(StageBase, DecisionObserver):
    """Counters by API, connections, and throttle events; also a pipeline stage."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter("sluice_requests", "Requests by API", ["api"], registry=registry)
        self.request_bytes = Counter("sluice_request_bytes", "Request bytes by API", ["api"],
                                     registry=registry)
        self.response_bytes = Counter("sluice_response_bytes", "Response bytes by API", ["api"],
                                      registry=registry)
        self.connections = Gauge("sluice_open_connections", "Open client connections", ["listener"],
                                 registry=registry)
        self.violations = Counter("sluice_quota_violations", "Quota violations by kind and mode",
                                  ["kind", "mode"], registry=registry)
        self._per_api: dict[int, tuple[Counter, Counter, Counter]] = {}
        self.rewrite_failures = Counter("sluice_rewrite_failures",
                                        "Responses forwarded unchanged because they could not be decoded",
                                        registry=registry)

    def on_complete(self, ctx: ConnectionContext, entry: InFlight, sent_ms: int) -> None:
        children = self._per_api.get(entry.api_key)
        if children is None:  # labels() is a lookup with a lock: resolve once per API
            api = api_name(entry.api_key)
            children = (self.requests.labels(api), self.request_bytes.labels(api),
                        self.response_bytes.labels(api))
            self._per_api[entry.api_key] = children
        children[0].inc()
        children[1].inc(entry.request_bytes)
        if entry.response_bytes:
            children[2].inc(entry.response_bytes)

    def on_violation(self, ctx: ConnectionContext, decision: ThrottleDecision) -> None:
        self.violations.labels(_KIND_NAME[decision.kind], "shadow" if decision.shadow else "enforced").inc()

    def connection_opened(self, listener: str) -> None:
        self.connections.labels(listener).inc()

    def connection_closed(self, listener: str) -> None:
        self.connections.labels(listener).dec()


class AccessLogCollector(Collector):
    """The access-log writer's counters, read at scrape time."""

    def __init__(self, writer: AccessLogWriter) -> None:
        self._writer = writer

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily

        w = self._writer
        yield CounterMetricFamily("sluice_access_log_records_written", "Access-log records written",
                                  value=w.written)
        yield CounterMetricFamily("sluice_access_log_records_dropped",
                                  "Access-log records dropped because the queue was full", value=w.dropped)
        yield CounterMetricFamily("sluice_access_log_records_failed",
                                  "Access-log records that could not be built", value=w.failed)
        yield GaugeMetricFamily("sluice_access_log_queue_depth", "Access-log records waiting to be written",
                                value=w.queue_depth)
