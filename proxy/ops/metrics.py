"""Prometheus metrics, in Kafka's spirit.

Per-quota metrics (`sluice_quota_*`) are read from the live quota sensors at scrape time by a
custom collector, with the sensor's tags as labels (`user`, `client_id`, empty when the tag is not
used, as Kafka's quota metric tags) plus `broker`. A sensor idle for an hour expires in the quota
manager and its series disappear; within the hour `SeriesCap` (`metrics.max_series_per_metric`)
folds sensors beyond the cap into one ``__overflow__`` series per broker and kind, so client-id
churn cannot grow the label set without bound. Throttle time avg/max cover Kafka's metric window
(2 x 30 s), counts are counters. Per-API counters are labelled by API name only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from protocol.apis import api_name
from protocol.fastpath import RequestCounters
from proxy.flow.pipeline import ConnectionContext
from proxy.ops.access_log import DROP_CAUSES, AccessLogWriter
from proxy.pumps.limits import (
    HANDSHAKE_TIMEOUT,
    IDLE_TIMEOUT,
    MAX_BUFFERED_PER_CONNECTION,
    MAX_BUFFERED_TOTAL,
    MAX_IN_FLIGHT,
    ConnectionLimits,
)
from proxy.stages.quota import DecisionObserver
from quotas.clock import Clock
from quotas.connection_limits import (
    CONNECTION_CREATION_RATE,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_IP,
    IpConnectionRates,
)
from quotas.engine import QuotaEngine
from quotas.entity import QuotaKind, SensorKey
from quotas.headroom import KIND_LABEL
from quotas.manager import QuotaManager, SensorSnapshot, ThrottleDecision
from quotas.series_cap import DEFAULT_MAX_SERIES_PER_METRIC as DEFAULT_MAX_SERIES_PER_METRIC
from quotas.series_cap import OVERFLOW as OVERFLOW
from quotas.series_cap import SeriesCap as SeriesCap

_KIND_NAME = KIND_LABEL  # the `kind` label, one spelling for the metrics and /quotas/usage
_RATE_METRIC = {
    QuotaKind.PRODUCE: ("sluice_quota_produce_byte_rate", "Produce bytes per second, per quota sensor"),
    QuotaKind.FETCH: ("sluice_quota_fetch_byte_rate", "Fetch bytes per second, per quota sensor"),
    QuotaKind.REQUEST_RATE: ("sluice_quota_request_rate", "Requests per second, per quota sensor"),
    QuotaKind.REQUEST_PERCENTAGE: ("sluice_quota_request_percentage",
                                   "Upstream time in percent of one thread, per quota sensor"),
    QuotaKind.PRODUCER_RECORD_RATE: ("sluice_quota_producer_record_rate",
                                     "Produced records per second, per quota sensor"),
    QuotaKind.CONSUMER_RECORD_RATE: ("sluice_quota_consumer_record_rate",
                                     "Fetched records per second, per quota sensor"),
}
#: a callback's own tags (KIP-257's tag map beyond user and client id) as one label, "" when none
_SENSOR_LABELS = ["broker", "user", "client_id", "tags"]
_TOPIC_LABELS = ["kind", "broker", "topic"]


def _last_record(entry: tuple[str, QuotaManager, SensorSnapshot]) -> int:
    return entry[2].last_record_ms


def _group_order(item: tuple[tuple[str, QuotaKind], object]) -> tuple[str, str]:
    return item[0][0], item[0][1].value


def _client_label(key: SensorKey) -> str:
    """The client_id label: the client id, or ``PREFIX*`` for a client-id prefix shared by its members."""
    return key.client_id_prefix + "*" if key.client_id_prefix else key.client_id


def _topic_label(key: SensorKey) -> str:
    """The topic label: the topic, or ``PREFIX*`` for a topic prefix shared by its topics."""
    return key.topic_prefix + "*" if key.topic_prefix else key.topic


_Member = tuple[str, SensorKey]  # (broker label, sensor)


class _Overflow:
    """The folded sensors' sums per (broker, kind), and their throttle counters kept monotonic
    (each folded sensor's increase since the last scrape is added; an expired one's total stays)."""

    def __init__(self) -> None:
        self.throttled: dict[tuple[str, QuotaKind], int] = {}
        self.shadow: dict[tuple[str, QuotaKind], int] = {}
        self._seen: dict[_Member, tuple[int, int]] = {}

    def count(self, member: _Member, throttled: int, shadow: int) -> None:
        before_throttled, before_shadow = self._seen.get(member, (0, 0))
        group = (member[0], member[1].kind)
        if throttled > before_throttled:
            self.throttled[group] = self.throttled.get(group, 0) + throttled - before_throttled
        if shadow > before_shadow:
            self.shadow[group] = self.shadow.get(group, 0) + shadow - before_shadow
        self._seen[member] = (throttled, shadow)

    def forget_except(self, folded: set[_Member]) -> None:
        if len(self._seen) > len(folded):
            self._seen = {m: c for m, c in self._seen.items() if m in folded}


class QuotaSensorCollector(Collector):
    """The `sluice_quota_*` series, read from the live sensors at scrape time.

    Throttle time avg and max are Kafka's `throttle-time` over its metric window (2 x 30 s), not
    over the sensor's life; counts of throttled requests are counters. Sensors beyond
    `max_series_per_metric` are folded (`SeriesCap`).
    """

    def __init__(self, managers: QuotaEngine, clock: Clock,
                 max_series_per_metric: int = DEFAULT_MAX_SERIES_PER_METRIC) -> None:
        self._managers = managers
        self._clock = clock
        self.cap: SeriesCap[_Member] = SeriesCap(max_series_per_metric)
        self._overflow = _Overflow()

    def collect(self) -> Iterator[Metric]:
        rates = {kind: GaugeMetricFamily(name, doc, labels=_SENSOR_LABELS)
                 for kind, (name, doc) in _RATE_METRIC.items()}
        kind_labels = ["kind", *_SENSOR_LABELS]
        limit = GaugeMetricFamily("sluice_quota_limit", "The quota bound applying to a sensor "
                                  "(bytes/s, requests/s or percent)", labels=kind_labels)
        t_avg = GaugeMetricFamily("sluice_quota_throttle_time_avg_ms",
                                  "Average of the non-zero throttle times within Kafka's metric window "
                                  "(2 x 30 s, as the broker's throttle-time), ms", labels=kind_labels)
        t_max = GaugeMetricFamily("sluice_quota_throttle_time_max_ms",
                                  "Largest throttle time within Kafka's metric window (2 x 30 s), ms",
                                  labels=kind_labels)
        t_count = CounterMetricFamily("sluice_quota_throttled_requests",
                                      "Requests throttled, per sensor (since it was created)",
                                      labels=kind_labels)
        shadow = CounterMetricFamily("sluice_quota_shadow_would_throttle",
                                     "Requests that would have been throttled (shadow mode), per sensor",
                                     labels=kind_labels)
        sensors = GaugeMetricFamily("sluice_quota_sensors", "Live quota sensors", labels=["broker"])
        now_ms = self._clock.now_ms()
        live: list[tuple[str, QuotaManager, SensorSnapshot]] = []
        for broker, manager in self._managers.labelled():
            sensors.add_metric([broker], manager.sensor_count)
            live.extend((broker, manager, snap) for snap in manager.sensors())
        live.sort(key=_last_record)  # least recently active first, as `SeriesCap.split` wants
        folded = self.cap.split([(broker, snap.key) for broker, _, snap in live])
        overflow = self._overflow
        folded_rates: dict[tuple[str, QuotaKind], float] = {}
        folded_times: dict[tuple[str, QuotaKind], tuple[float, float, int]] = {}  # sum, max, count
        for broker, manager, snap in live:
            key = snap.key
            rate = snap.rate.measure(now_ms)
            stats = manager.throttle_stats(key)
            window = manager.throttle_time(key)
            shadow_stats = manager.shadow_throttle_stats(key)
            if (broker, key) in folded:
                group = (broker, key.kind)
                folded_rates[group] = folded_rates.get(group, 0.0) + rate
                if window is not None and window.count:
                    total, largest, count = folded_times.get(group, (0.0, -math.inf, 0))
                    folded_times[group] = (total + window.avg_ms * window.count, max(largest, window.max_ms),
                                           count + window.count)
                overflow.count((broker, key), stats.count if stats else 0,
                               shadow_stats.count if shadow_stats else 0)
                continue
            labels = [broker, key.user, _client_label(key), key.tags_label]
            klabels = [_KIND_NAME[key.kind], *labels]
            rates[key.kind].add_metric(labels, rate)
            bound = manager.quota_bound(key)
            if bound is not None:
                limit.add_metric(klabels, bound)
            if window is not None and window.count:
                t_avg.add_metric(klabels, window.avg_ms)
                t_max.add_metric(klabels, window.max_ms)
            if stats is not None and stats.count:
                t_count.add_metric(klabels, stats.count)
            if shadow_stats is not None and shadow_stats.count:
                shadow.add_metric(klabels, shadow_stats.count)
        overflow.forget_except(folded)
        for (broker, kind), rate in sorted(folded_rates.items(), key=_group_order):
            rates[kind].add_metric([broker, OVERFLOW, OVERFLOW, OVERFLOW], rate)
        for (broker, kind), (total, largest, count) in sorted(folded_times.items(), key=_group_order):
            t_avg.add_metric([_KIND_NAME[kind], broker, OVERFLOW, OVERFLOW, OVERFLOW], total / count)
            t_max.add_metric([_KIND_NAME[kind], broker, OVERFLOW, OVERFLOW, OVERFLOW], largest)
        for family, counts in ((t_count, overflow.throttled), (shadow, overflow.shadow)):
            for (broker, kind), n in sorted(counts.items(), key=_group_order):
                family.add_metric([_KIND_NAME[kind], broker, OVERFLOW, OVERFLOW, OVERFLOW], n)
        yield from rates.values()
        yield from (limit, t_avg, t_max, t_count, shadow, sensors)
        yield CounterMetricFamily("sluice_metrics_series_folded",
                                  "Quota sensors folded into the __overflow__ series because "
                                  "metrics.max_series_per_metric were live", value=self.cap.folded_total)
        yield GaugeMetricFamily("sluice_metrics_folded_sensors",
                                "Live quota sensors currently folded into the __overflow__ series",
                                value=len(folded))
        yield from self._topics(now_ms)
        yield self._configured()

    def _topics(self, now_ms: int) -> Iterator[Metric]:
        """Topic and topic-prefix quotas (issue 13): a `topic` label, only for sensors a topic entry
        limits, so the label's values are bounded by the configured entries."""
        rate = GaugeMetricFamily("sluice_quota_topic_rate", "Bytes, records or requests per second to or "
                                 "from a topic (or a topic prefix, PREFIX*), per topic quota sensor",
                                 labels=_TOPIC_LABELS)
        limit = GaugeMetricFamily("sluice_quota_topic_limit", "The topic quota bound applying to a topic "
                                  "sensor", labels=_TOPIC_LABELS)
        throttled = CounterMetricFamily("sluice_quota_topic_throttled_requests",
                                        "Requests throttled by a topic quota, per topic sensor",
                                        labels=_TOPIC_LABELS)
        shadow = CounterMetricFamily("sluice_quota_topic_shadow_would_throttle",
                                   "Requests a shadow topic quota would have throttled, per live topic "
                                   "sensor",
                                   labels=_TOPIC_LABELS)
        for broker, manager in self._managers.topic_labelled():
            for snap in manager.sensors():
                key = snap.key
                bound = manager.quota_bound(key)
                if bound is None:
                    continue
                labels = [_KIND_NAME[key.kind], broker, _topic_label(key)]
                rate.add_metric(labels, snap.rate.measure(now_ms))
                limit.add_metric(labels, bound)
                stats = manager.throttle_stats(key)
                if stats is not None and stats.count:
                    throttled.add_metric(labels, stats.count)
                shadow_stats = manager.shadow_throttle_stats(key)
                if shadow_stats is not None and shadow_stats.count:
                    shadow.add_metric(labels, shadow_stats.count)
        yield from (rate, limit, throttled, shadow)

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


class IntCounter:
    """A counter that is a plain integer: `inc` is an addition, read at scrape time."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        self.value += amount


class SluiceMetrics(DecisionObserver):
    """Counters by API, connections, and throttle events.

    Per request: `requests` (`protocol.counters.RequestCounters`, compiled to three C integer
    additions per request when `protocol._speedups` is built) is the pipeline's stage for it (no
    metrics-library call, no lock, no allocation); `collect` turns the counts into Prometheus
    families when /metrics is scraped.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = RequestCounters()  # api key -> requests, request bytes, response bytes
        self._connections: dict[str, int] = {}        # listener -> open connections
        self._violations: dict[tuple[str, str], int] = {}  # (kind, mode) -> count
        self.rewrite_failures = IntCounter()
        registry.register(self)

    def on_violation(self, ctx: ConnectionContext, decision: ThrottleDecision) -> None:
        key = (_KIND_NAME[decision.kind], "shadow" if decision.shadow else "enforced")
        self._violations[key] = self._violations.get(key, 0) + 1

    def connection_opened(self, listener: str) -> None:
        self._connections[listener] = self._connections.get(listener, 0) + 1

    def connection_closed(self, listener: str) -> None:
        self._connections[listener] = self._connections.get(listener, 0) - 1

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily("sluice_requests", "Requests by API", labels=["api"])
        request_bytes = CounterMetricFamily("sluice_request_bytes", "Request bytes by API", labels=["api"])
        response_bytes = CounterMetricFamily("sluice_response_bytes", "Response bytes by API", labels=["api"])
        for api_key, counts in sorted(self.requests.snapshot().items()):
            api = [api_name(api_key)]
            requests.add_metric(api, counts[0])
            request_bytes.add_metric(api, counts[1])
            response_bytes.add_metric(api, counts[2])
        yield from (requests, request_bytes, response_bytes)
        connections = GaugeMetricFamily("sluice_open_connections", "Open client connections",
                                        labels=["listener"])
        for listener, n in sorted(self._connections.items()):
            connections.add_metric([listener], n)
        yield connections
        violations = CounterMetricFamily("sluice_quota_violations", "Quota violations by kind and mode",
                                         labels=["kind", "mode"])
        for (kind, mode), n in sorted(self._violations.items()):
            violations.add_metric([kind, mode], n)
        yield violations
        yield CounterMetricFamily("sluice_rewrite_failures",
                                  "Responses forwarded unchanged because they could not be decoded",
                                  value=self.rewrite_failures.value)


class AccessLogCollector(Collector):
    """The access-log writer's counters, read at scrape time."""

    def __init__(self, writer: AccessLogWriter) -> None:
        self._writer = writer

    def collect(self) -> Iterator[Metric]:
        w = self._writer
        drops = w.drops
        yield CounterMetricFamily("sluice_access_log_records_written", "Access-log records written to files",
                                  value=w.written)
        yield CounterMetricFamily("sluice_access_log_records_dropped",
                                  "Access-log records dropped, every cause (see ..._drops_total)",
                                  value=sum(drops.values()))
        by_cause = CounterMetricFamily("sluice_access_log_drops", "Access-log records dropped, by cause: "
                                       "queue_full (the handoff was full), writer_died (sent to a writer "
                                       "process that died), topic (the Kafka topic sink could not deliver "
                                       "them; the files have them)", labels=["cause"])
        for cause in DROP_CAUSES:
            by_cause.add_metric([cause], drops[cause])
        yield by_cause
        yield CounterMetricFamily("sluice_access_log_records_failed",
                                  "Access-log records that could not be built", value=w.failed)
        yield CounterMetricFamily("sluice_access_log_topic_records_delivered",
                                  "Access-log records the Kafka topic sink delivered",
                                  value=w.topic_delivered)
        yield CounterMetricFamily("sluice_access_log_writer_restarts",
                                  "Access-log writer processes started again after one died",
                                  value=w.restarts)
        yield GaugeMetricFamily("sluice_access_log_degraded", "1 while /healthz reports the access log "
                                "degraded (writer down, or records dropped in the last 10 s)",
                                value=1 if w.problems() else 0)
        yield GaugeMetricFamily("sluice_access_log_queue_depth", "Access-log records waiting to be written",
                                value=w.queue_depth)


class QuotaStoreCollector(Collector):
    """Records the quota store holds and cannot read (each named in the log and on /healthz)."""

    def __init__(self, unreadable: Callable[[], Mapping[str, str]]) -> None:
        self._unreadable = unreadable

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("sluice_quota_store_unreadable_records", "Quota store records (or rows) "
                                "Sluice cannot read: their quotas are not applied",
                                value=len(self._unreadable()))


#: Every cause `sluice_limit_hits_total` counts (the config key of the limit hit), shown from 0.
LIMIT_CAUSES = (MAX_CONNECTIONS, MAX_CONNECTIONS_PER_IP, CONNECTION_CREATION_RATE, HANDSHAKE_TIMEOUT,
                IDLE_TIMEOUT, MAX_BUFFERED_PER_CONNECTION, MAX_BUFFERED_TOTAL, MAX_IN_FLIGHT)


class LimitsCollector(Collector):
    """Bounded resources (`proxy.pumps.limits`): hits by cause, bytes buffered for clients,
    admitted connections, and the limits in force."""

    def __init__(self, limits: ConnectionLimits, ip_rates: IpConnectionRates | None = None) -> None:
        self._limits = limits
        self._ip_rates = ip_rates  # the engine's KIP-612 per-IP rates

    def collect(self) -> Iterator[Metric]:
        limits = self._limits
        hits = CounterMetricFamily("sluice_limit_hits", "Limit hits by cause (the limit's config key); each "
                                   "cause is logged once", labels=["cause"])
        for cause in LIMIT_CAUSES:
            hits.add_metric([cause], limits.log.hits.get(cause, 0))
        yield hits
        yield GaugeMetricFamily("sluice_limit_buffered_bytes", "Bytes buffered for clients that have not "
                                "read them, over every connection (bounded by max_buffered_bytes_total)",
                                value=limits.budget.total_bytes)
        yield GaugeMetricFamily("sluice_limit_buffered_connections",
                                "Connections holding bytes for their client",
                                value=len(limits.budget.holders()))
        yield GaugeMetricFamily("sluice_limit_admitted_connections", "Client connections admitted and open "
                                "(limits.max_connections bounds it)", value=limits.limiter.total)
        yield GaugeMetricFamily("sluice_limit_ip_rate_sensors",
                                "Client IPs with a live connection_creation_rate sensor",
                                value=0 if self._ip_rates is None else self._ip_rates.sensor_count)
        configured = GaugeMetricFamily("sluice_limit", "The limits in force", labels=["limit"])
        s = limits.settings
        for name, value in (("max_connections", limits.limiter.max_connections),
                            ("max_connections_per_ip", limits.limiter.max_connections_per_ip),
                            ("handshake_timeout_ms", s.handshake_timeout_ms),
                            ("idle_timeout_ms", s.idle_timeout_ms),
                            ("max_buffered_bytes_per_connection", s.max_buffered_bytes_per_connection),
                            ("max_buffered_bytes_total", limits.budget.max_total_bytes),
                            ("max_in_flight_requests_per_connection",
                             s.max_in_flight_requests_per_connection)):
            configured.add_metric([name], value)
        yield configured
