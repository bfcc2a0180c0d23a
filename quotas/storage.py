"""Storage-driven throttling, after Strimzi's quotas plugin (proposal 003): the pure policy.

Volumes are observations ``(broker_id, log_dir, total_bytes, usable_bytes)``. Limits apply to
every volume alike (``availableBytesBelow`` / ``availableRatioBelow``), each with a soft and a
hard threshold; there is at most one soft and exactly one hard limit, possibly of different types,
and a missing soft limit is the hard one. A volume is *breached* at a threshold when its available
bytes (or ratio) is less than or equal to it.

The throttle factor of one volume is 1 while it is above the soft threshold, 0 at or below the
hard threshold and linear in available bytes in between (a ratio threshold is turned into bytes
with the volume's total, so soft and hard of different types interpolate too). The cluster's factor
is the minimum over every volume, and the volume that gives it is the *throttling volume*.

When the view is incomplete (an expected broker sent no log-dir sizes, or the poll failed) the
last factor computed from a complete view is *held* for a validity window (Strimzi's
``throttle-factor.validity-duration``); only once it has expired does the configured fallback
factor apply (Strimzi's default 1.0: optimistic). A hard stop is not lifted by the fallback: when
the last complete view stopped production (factor 0), the factor stays 0 until a complete view
shows space again, unless ``fallback_lifts_hard_stop`` is set (`hold_or_fallback`).

An *offline* log dir (the broker reports KAFKA_STORAGE_ERROR for it, KIP-112: the broker takes a
dir offline when it runs out of space or fails) counts as full: its factor is 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from quotas.config import QuotaConfig
from quotas.entity import DEFAULT, QuotaEntity, QuotaKind
from quotas.errors import QuotaConfigError


class LimitType(Enum):
    AVAILABLE_BYTES_BELOW = "available_bytes_below"
    AVAILABLE_RATIO_BELOW = "available_ratio_below"


@dataclass(frozen=True, slots=True)
class VolumeUsage:
    """One log dir of one broker (KIP-827 sizes: `total_bytes`, `usable_bytes`)."""

    broker_id: int
    log_dir: str
    total_bytes: int
    usable_bytes: int
    offline: bool = False  # the broker reported the dir offline (KAFKA_STORAGE_ERROR): counts as full

    @property
    def available_ratio(self) -> float:
        if self.offline:
            return 0.0
        return self.usable_bytes / self.total_bytes if self.total_bytes > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Threshold:
    type: LimitType
    value: float

    def as_bytes(self, volume: VolumeUsage) -> float:
        if self.type is LimitType.AVAILABLE_BYTES_BELOW:
            return self.value
        return self.value * volume.total_bytes

    def describe(self) -> str:
        if self.type is LimitType.AVAILABLE_BYTES_BELOW:
            return f"{self.type.value} {int(self.value)}"
        return f"{self.type.value} {self.value:g}"


@dataclass(frozen=True, slots=True)
class StorageLimits:
    """The validated limits: `soft` (throttling starts) and `hard` (production stops)."""

    soft: Threshold
    hard: Threshold

    @classmethod
    def parse(cls, limits: Sequence[Mapping[str, object]], key: str = "storage.limits") -> StorageLimits:
        """``[{type: available_bytes_below|available_ratio_below, soft: x, hard: y}, ...]``.

        Raises `QuotaConfigError` naming the key path of every problem found.
        """
        problems: list[tuple[str, str]] = []
        softs: list[tuple[str, Threshold]] = []
        hards: list[tuple[str, Threshold]] = []
        if not limits:
            raise QuotaConfigError(key, "needs one hard limit "
                                        "(available_bytes_below or available_ratio_below)")
        for i, item in enumerate(limits):
            at = f"{key}[{i}]"
            unknown = set(item) - {"type", "soft", "hard"}
            if unknown:
                problems.append((at, f"unknown key(s) {sorted(unknown)}; expected type, soft, hard"))
            raw_type = item.get("type")
            try:
                kind = LimitType(raw_type)
            except ValueError:
                problems.append((f"{at}.type", f"must be available_bytes_below or available_ratio_below, "
                                               f"got {raw_type!r}"))
                continue
            if item.get("soft") is None and item.get("hard") is None:
                problems.append((at, "needs soft, hard or both"))
            for which, bucket in (("soft", softs), ("hard", hards)):
                raw = item.get(which)
                if raw is None:
                    continue
                reason = _invalid_value(kind, raw)
                if reason is not None:
                    problems.append((f"{at}.{which}", reason))
                    continue
                assert isinstance(raw, int | float)
                bucket.append((f"{at}.{which}", Threshold(kind, float(raw))))
        if len(softs) > 1:
            problems.append((softs[1][0], f"a second soft limit (one is already set at {softs[0][0]}); "
                                          "at most one soft limit"))
        if len(hards) > 1:
            problems.append((hards[1][0], f"a second hard limit (one is already set at {hards[0][0]}); "
                                          "at most one hard limit"))
        if not hards and not any(k.endswith(".hard") for k, _ in problems):
            problems.append((key, "needs one hard limit (a soft limit alone is not enough)"))
        if problems:
            raise QuotaConfigError.of(problems)
        hard = hards[0][1]
        soft = softs[0][1] if softs else hard
        if soft.type is hard.type and soft.value < hard.value:
            raise QuotaConfigError(softs[0][0], f"soft ({soft.value:g}) must be >= hard ({hard.value:g}):"
                                                " throttling starts at soft, production stops at hard")
        return cls(soft, hard)


def _invalid_value(kind: LimitType, raw: object) -> str | None:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        return f"must be a number, got {raw!r}"
    if kind is LimitType.AVAILABLE_BYTES_BELOW:
        if raw <= 0 or (isinstance(raw, float) and not raw.is_integer()):
            return f"must be a whole number of bytes > 0, got {raw!r}"
    elif not 0 < raw < 1:
        return f"must be a ratio between 0 and 1 (exclusive), got {raw!r}"
    return None


def validate_fallback_factor(value: float, key: str = "storage.fallback_factor") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise QuotaConfigError(key, f"must be between 0.0 and 1.0, got {value!r}")
    return float(value)


def volume_factor(volume: VolumeUsage, limits: StorageLimits) -> float:
    """1 above soft, 0 at or below hard (or offline), linear in available bytes in between."""
    if volume.offline:
        return 0.0
    available = volume.usable_bytes
    hard = limits.hard.as_bytes(volume)
    if available <= hard:
        return 0.0
    soft = limits.soft.as_bytes(volume)
    if available > soft or soft <= hard:
        return 1.0
    return (available - hard) / (soft - hard)


class FallbackReason(Enum):
    POLL_FAILED = "poll_failed"
    BROKER_WITHOUT_LOG_DIRS = "broker_without_log_dirs"
    NO_BROKERS = "no_brokers"


@dataclass(frozen=True, slots=True)
class FactorDecision:
    factor: float
    fallback_applied: bool = False
    reason: FallbackReason | None = None
    throttling_volume: VolumeUsage | None = None
    detail: str = ""
    #: the view was incomplete (`reason`) but the last complete factor is still valid and applies
    held: bool = False


def throttle_factor(volumes: Iterable[VolumeUsage], limits: StorageLimits, expected_brokers: Iterable[int],
                    fallback_factor: float, *, poll_error: str | None = None) -> FactorDecision:
    """The factor for produce quotas given the polled volumes of `expected_brokers`.

    A failed poll, no brokers at all or an expected broker with no volume gives the fallback.
    Otherwise the minimum over the volumes; `throttling_volume` is the volume that gives it when
    it is below 1.
    """
    if poll_error is not None:
        return FactorDecision(fallback_factor, True, FallbackReason.POLL_FAILED, detail=poll_error)
    vols = list(volumes)
    expected = set(expected_brokers)
    if not expected and not vols:
        return FactorDecision(fallback_factor, True, FallbackReason.NO_BROKERS, detail="no active broker")
    missing = expected - {v.broker_id for v in vols}
    if missing:
        return FactorDecision(fallback_factor, True, FallbackReason.BROKER_WITHOUT_LOG_DIRS,
                              detail=f"no log-dir sizes from broker(s) {sorted(missing)}")
    best = 1.0
    throttling: VolumeUsage | None = None
    for v in vols:
        f = volume_factor(v, limits)
        if f < best or (throttling is None and f < 1.0):
            best, throttling = f, v
    return FactorDecision(best, throttling_volume=throttling)


@dataclass(frozen=True, slots=True)
class CompleteView:
    """The last factor computed from a complete view, and when (a monotonic clock, ms)."""

    decision: FactorDecision
    at_ms: int


def hold_or_fallback(fresh: FactorDecision, last_complete: CompleteView | None, now_ms: int,
                     validity_ms: int, *, fallback_lifts_hard_stop: bool = False) -> FactorDecision:
    """The decision to apply given this poll's `fresh` one (`throttle_factor`).

    A complete view applies as it is. An incomplete one keeps the last complete factor while it is
    younger than `validity_ms` (``held``); after that the fallback applies, except that a last
    complete factor of 0 (a hard stop) is kept unless `fallback_lifts_hard_stop`: losing sight of
    a full disk does not free it.
    """
    if not fresh.fallback_applied or last_complete is None:
        return fresh
    last = last_complete.decision
    age_ms = now_ms - last_complete.at_ms
    if age_ms < validity_ms:
        return FactorDecision(last.factor, False, fresh.reason, last.throttling_volume,
                              detail=f"{fresh.detail}; holding the factor of {age_ms} ms ago "
                                     f"(valid for {validity_ms} ms)", held=True)
    if last.factor == 0.0 and not fallback_lifts_hard_stop and fresh.factor > 0.0:
        return FactorDecision(0.0, True, fresh.reason, last.throttling_volume,
                              detail=f"{fresh.detail}; the last complete view ({age_ms} ms ago) stopped "
                                     "production: the hard stop stays until a complete view")
    return fresh


#: The entity `with_base_rate` gives a produce quota to (the lowest of Kafka's 8 levels).
BASE_RATE_ENTITY = QuotaEntity(client_id=DEFAULT)


def with_base_rate(config: QuotaConfig, base_rate: float) -> QuotaConfig:
    """``applies_to: all``: clients with no produce quota get `base_rate` (then scaled by the
    factor like every produce quota). It is a ``/clients/<default>`` produce quota, the last of
    Kafka's 8 precedence levels, so it reaches exactly the clients no other produce quota matches;
    a configured ``/clients/<default>`` produce quota is kept as it is."""
    if config.value(BASE_RATE_ENTITY, QuotaKind.PRODUCE) is not None:
        return config
    return config.with_value(BASE_RATE_ENTITY, QuotaKind.PRODUCE, base_rate)
