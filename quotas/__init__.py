"""Kafka's client-quota semantics, sans I/O: windowed rates, throttle times, entity precedence.

Time comes from an injected `Clock`; nothing here touches sockets, files or the event loop.
"""

from quotas.callback import DefaultQuotaCallback, EntityMatcher, QuotaCallback
from quotas.clock import Clock, FakeClock, SystemClock
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
)
from quotas.stats import RateConfig, SampledRate
from quotas.throttle import MAX_THROTTLE_TIME_MS, bounded_throttle_time_ms, java_round, throttle_time_ms

__all__ = [
    "DEFAULT",
    "DEFAULT_SENSOR_IDLE_EXPIRY_MS",
    "MAX_THROTTLE_TIME_MS",
    "SENSOR_SWEEP_INTERVAL_MS",
    "UNAUTHENTICATED_PRINCIPAL",
    "ClientIdentity",
    "Clock",
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
    "SampledRate",
    "SensorKey",
    "SensorSnapshot",
    "SystemClock",
    "ThrottleDecision",
    "ThrottleStats",
    "bounded_throttle_time_ms",
    "java_round",
    "sanitize_user",
    "throttle_time_ms",
    "validate_quota_value",
]
