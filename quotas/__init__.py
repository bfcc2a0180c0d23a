"""Kafka's client-quota semantics, sans I/O: windowed rates, throttle times, entity precedence.

Time comes from an injected `Clock`; nothing here touches sockets, files or the event loop.

Typical wiring::

    config = QuotaConfig.from_dict(yaml_doc["quotas"])          # QuotaConfigError names key paths
    quotas = QuotaManager(config, SystemClock())
    who = ClientIdentity.of(principal_name, header.client_id)    # None -> "ANONYMOUS" / ""

    # Produce: after forwarding, with the request size (header + body, no length prefix).
    produce = quotas.record_and_check(QuotaKind.PRODUCE, who, request_size)
    # Fetch: with the response size; when the final throttle is > 0, take it back and send an
    # empty response instead (Kafka's un-record).
    fetch = quotas.record_and_check(QuotaKind.FETCH, who, response_size)
    if max(fetch.throttle_time_ms, request.throttle_time_ms) > 0:
        quotas.unrecord(QuotaKind.FETCH, who, response_size)
    throttle_ms = max(broker_throttle_ms, fetch.throttle_time_ms, ...)   # combine with max

    quotas.update_config(new_config)                             # live reload keeps history
"""

from quotas.callback import DefaultQuotaCallback, EntityMatcher, QuotaCallback, RecordObserver
from quotas.clock import Clock, FakeClock, SystemClock
from quotas.cluster import NO_LEADER, ClusterView
from quotas.config import QuotaConfig, QuotaEntry, QuotaValues, validate_quota_value
from quotas.entity import (
    DEFAULT,
    UNAUTHENTICATED_PRINCIPAL,
    ClientIdentity,
    Default,
    QuotaEntity,
    QuotaKind,
    SensorKey,
    sanitize_user,
)
from quotas.errors import QuotaConfigError, QuotaError
from quotas.manager import (
    DEFAULT_SENSOR_IDLE_EXPIRY_MS,
    SENSOR_SWEEP_INTERVAL_MS,
    QuotaManager,
    SensorSnapshot,
    ThrottleDecision,
    ThrottleStats,
    ThrottleTime,
)
from quotas.stats import (
    METRIC_WINDOW,
    BucketShape,
    RateConfig,
    RateModel,
    SampledAvgMax,
    SampledRate,
    TokenBucket,
)
from quotas.throttle import (
    MAX_THROTTLE_TIME_MS,
    bounded_throttle_time_ms,
    bucket_throttle_time_ms,
    java_round,
    throttle_time_ms,
)

__all__ = [
    "DEFAULT",
    "DEFAULT_SENSOR_IDLE_EXPIRY_MS",
    "MAX_THROTTLE_TIME_MS",
    "METRIC_WINDOW",
    "NO_LEADER",
    "SENSOR_SWEEP_INTERVAL_MS",
    "UNAUTHENTICATED_PRINCIPAL",
    "BucketShape",
    "ClientIdentity",
    "Clock",
    "ClusterView",
    "Default",
    "DefaultQuotaCallback",
    "EntityMatcher",
    "FakeClock",
    "QuotaCallback",
    "QuotaConfig",
    "QuotaConfigError",
    "QuotaEntity",
    "QuotaEntry",
    "QuotaError",
    "QuotaKind",
    "QuotaManager",
    "QuotaValues",
    "RateConfig",
    "RateModel",
    "RecordObserver",
    "SampledAvgMax",
    "SampledRate",
    "SensorKey",
    "SensorSnapshot",
    "SystemClock",
    "ThrottleDecision",
    "ThrottleStats",
    "ThrottleTime",
    "TokenBucket",
    "bounded_throttle_time_ms",
    "bucket_throttle_time_ms",
    "java_round",
    "sanitize_user",
    "throttle_time_ms",
    "validate_quota_value",
]
