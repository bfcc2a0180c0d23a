"""Headroom of every live quota sensor, from the running managers (issue 14).

`usage_report` reads what enforcement uses, nothing recomputed: each sensor's windowed rate
(Kafka's measure, as `sluice_quota_*_rate`) and its limit in force (`QuotaManager.sensor_limit`:
the callback's limit, the storage factor, the fleet share; cluster entries are their own manager,
``broker="cluster"``). It is served as JSON at ``GET /quotas/usage`` on the metrics port
(`usage_json`) and `HeadroomCollector` exports ``sluice_quota_headroom_ratio`` per sensor with a
limit (``(limit - rate) / limit``: 1 idle, 0 at the limit, below 0 over it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.ops.metrics import SeriesCap
from quotas.clock import Clock
from quotas.engine import QuotaEngine
from quotas.entity import ClientIdentity, SensorKey
from quotas.headroom import KIND_LABEL, KIND_UNIT, EffectiveLimit, UsageEntry, UsageReport
from quotas.manager import QuotaManager

#: The path of the JSON document on the metrics port.
USAGE_PATH = "/quotas/usage"
EFFECTIVE_PATH = "/quotas/effective"
_LABELS = ["kind", "broker", "user", "client_id", "topic", "tags"]


Keep = Callable[[str, SensorKey], bool]  # (broker label, sensor): is it reported?


def _entries(broker: str, manager: QuotaManager, now_ms: int, *, limited_only: bool,
             keep: Keep | None = None) -> Iterator[UsageEntry]:
    for snap in manager.sensors():
        if keep is not None and not keep(broker, snap.key):
            continue
        limit = manager.sensor_limit(snap.key)
        if limit is None or (limited_only and limit.bound is None):
            continue
        yield UsageEntry.of_sensor(
            broker, snap.key, snap.rate.measure(now_ms), limit.bound, limit.base_bound, limit.share,
            limit.scale, limit.shadow, None if limit.entity is None else tuple(limit.entity.to_kafka()))


def usage_report(managers: QuotaEngine, clock: Clock, keep_client: Keep | None = None) -> UsageReport:
    """Every live client sensor (limited or not; those `keep_client` keeps) and every topic sensor a
    topic entry limits (as `sluice_quota_topic_*`), per broker scope."""
    now_ms = clock.now_ms()
    entries: list[UsageEntry] = []
    for broker, manager in managers.labelled():
        entries += _entries(broker, manager, now_ms, limited_only=False, keep=keep_client)
    for broker, manager in managers.topic_labelled():
        entries += _entries(broker, manager, now_ms, limited_only=True)
    return UsageReport(managers.config.window.retention_ms, managers.scope, tuple(entries))


def usage_json(report: UsageReport) -> bytes:
    return json.dumps(report.to_json(), separators=(",", ":")).encode() + b"\n"


class HeadroomCollector(Collector):
    """``sluice_quota_headroom_ratio{kind, broker, user, client_id, topic, tags}`` for every sensor
    with a limit (client sensors with ``topic=""``, topic sensors with ``user="" client_id=""``,
    ``tags`` a callback's own tags).

    With `cap` (the `sluice_quota_*` series cap) a client sensor folded into the overflow there
    has no headroom series (a ratio does not add up over sensors), so client-id churn cannot grow
    this metric past `metrics.max_series_per_metric` either."""

    def __init__(self, managers: QuotaEngine, clock: Clock,
                 cap: SeriesCap[tuple[str, SensorKey]] | None = None) -> None:
        self._managers = managers
        self._clock = clock
        self._keep: Keep | None = None if cap is None else (lambda broker, key: not cap.folds((broker, key)))

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "sluice_quota_headroom_ratio", "(limit in force - windowed rate) / limit in force, per quota "
            "sensor: 1 idle, 0 at the limit, below 0 over it", labels=_LABELS)
        for entry in usage_report(self._managers, self._clock, self._keep).entries:
            ratio = entry.headroom_ratio
            if ratio is not None:
                family.add_metric([KIND_LABEL[entry.kind], entry.broker, entry.user, entry.client_id,
                                   entry.topic, entry.tags], ratio)
        yield family


def effective_json(engine: QuotaEngine, args: Mapping[str, str]) -> bytes:
    """The engine's limits in force for one caller (``user``, ``client_id``, optional ``topic``
    and ``broker``: a broker id, or the bootstrap listener's scope when absent) as JSON: per
    limit its scope, kind, unit, value in force, the configured (or callback) value, the storage
    factor, the fleet share, its source and entity, and the sharing group (the budget key's tags,
    KIP-257's tag map: a callback's own tags too)."""
    identity = ClientIdentity.of(args.get("user") or None, args.get("client_id", ""))
    broker = args.get("broker")
    broker_id = int(broker) if broker is not None and broker.isdigit() else None
    limits = engine.effective(broker_id, identity, args.get("topic") or None)
    return effective_doc({"user": identity.principal, "client_id": identity.client_id},
                         args.get("topic") or None,
                         [EffectiveLimit(x.scope, x.kind.value, KIND_UNIT[x.kind], x.limit, x.configured,
                                         x.storage_factor, x.fleet_share, x.source, x.shadow,
                                         None if x.entity is None else x.entity.describe(),
                                         tags=x.key.tag_map, per=x.per)
                          for x in limits])


def effective_doc(caller: Mapping[str, str], topic: str | None, limits: Sequence[EffectiveLimit],
                  workers: int | None = None) -> bytes:
    """The ``/quotas/effective`` document; `workers` is N when the limits are the merge of N
    workers' (`quotas.headroom.merge_worker_limits`)."""
    doc: dict[str, Any] = {"caller": dict(caller), "topic": topic, "limits": [x.to_json() for x in limits]}
    if workers is not None:
        doc["workers"] = workers
    return json.dumps(doc).encode()
