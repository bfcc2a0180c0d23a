"""The quota-tuning policy: the knobs of `transforms.recommend`, as a frozen value (no Spark).

How a recommendation is made, per (entity, quota key), in this order:

1. demand    = the policy percentile of the entity's per-second rates (active seconds only) × headroom
2. bounded   = demand clamped to [floor, ceiling]
3. target    = with a total `capacity` for the key: a weighted fair share of it (water-filling:
               entities whose bounded demand is under their share keep it, the others split what
               is left in proportion to their weights), never below the floor
4. stepped   = target moved at most `max_change` (a fraction) away from the current quota;
               with no current quota there is nothing to step from and the target is taken
5. recommended = stepped rounded up to a multiple of `round_to` (and at least `round_to`)
6. action    = create (no current quota), keep (change under `min_change`), increase or decrease

Rates are bytes per second. A quota is one budget per broker for the whole Sluice fleet (Kafka's
meaning; the fleet shares it among its instances and workers), so with `rate_scope="broker"` a rate
is what every instance and worker together sent to or fetched from one broker in one second, and
`capacity` is per broker too; `rate_scope="cluster"` sums the brokers as well (`scope: cluster`
quotas). Nothing is ever per instance: a fleet's access logs are one dataset.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from contracts.access_log import parse_quota_entity

BYTE_RATE_KEYS: tuple[str, ...] = ("producer_byte_rate", "consumer_byte_rate")
RateScope = Literal["broker", "cluster"]
RATE_SCOPES: tuple[str, ...] = ("broker", "cluster")
UnmatchedLevel = Literal["user", "client-id", "user-client-id", "skip"]
_UNMATCHED: tuple[str, ...] = ("user", "client-id", "user-client-id", "skip")


class PolicyError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class QuotaPolicy:
    percentile: float = 0.95
    """Which percentile of the per-second rates is the entity's demand (0 < p <= 1)."""
    headroom: float = 1.5
    """Multiplier on that percentile (>= 1 leaves room for bursts)."""
    floor: float | None = None
    """Never recommend less than this many bytes/s (None: no floor)."""
    ceiling: float | None = None
    """Never recommend more than this many bytes/s (None: no ceiling)."""
    max_change: float | None = 0.5
    """Largest step per run as a fraction of the current quota (0.5: between ×0.5 and ×1.5)."""
    min_change: float = 0.05
    """Relative changes smaller than this keep the current quota (no churn)."""
    round_to: int = 1
    """Round recommendations up to a multiple of this many bytes/s."""
    capacity: Mapping[str, float] = field(default_factory=dict)
    """Total bytes/s per quota key to share fairly (per broker with rate_scope=broker)."""
    weights: Mapping[str, float] = field(default_factory=dict)
    """Weight per entity string for the fair share; others get default_weight."""
    default_weight: float = 1.0
    keys: tuple[str, ...] = BYTE_RATE_KEYS
    """Quota keys to recommend."""
    rate_scope: RateScope = "broker"
    """Per-second rates per broker (summed over every instance and worker), or over the cluster."""
    unmatched: UnmatchedLevel = "user"
    """Entity for traffic no quota matched: a user, client-id or (user, client-id) quota, or skip it."""

    def __post_init__(self) -> None:
        problems = []
        if not 0 < self.percentile <= 1:
            problems.append(f"percentile must be in (0, 1], got {self.percentile}")
        if self.headroom <= 0:
            problems.append(f"headroom must be positive, got {self.headroom}")
        for name in ("floor", "ceiling"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                problems.append(f"{name} must be positive, got {value}")
        if self.floor is not None and self.ceiling is not None and self.floor > self.ceiling:
            problems.append(f"floor {self.floor} is above ceiling {self.ceiling}")
        if self.max_change is not None and self.max_change <= 0:
            problems.append(f"max_change must be positive, got {self.max_change}")
        if self.min_change < 0:
            problems.append(f"min_change must not be negative, got {self.min_change}")
        if self.round_to < 1:
            problems.append(f"round_to must be at least 1, got {self.round_to}")
        for key, cap in self.capacity.items():
            if key not in self.keys:
                problems.append(f"capacity for {key!r}, which is not among keys {self.keys}")
            if cap <= 0:
                problems.append(f"capacity for {key!r} must be positive, got {cap}")
        for entity, weight in self.weights.items():
            try:
                parse_quota_entity(entity)
            except ValueError as exc:
                problems.append(f"weights: {exc}")
            if weight <= 0:
                problems.append(f"weight for {entity!r} must be positive, got {weight}")
        if self.default_weight <= 0:
            problems.append(f"default_weight must be positive, got {self.default_weight}")
        unknown_keys = set(self.keys) - set(BYTE_RATE_KEYS)
        if unknown_keys or not self.keys:
            problems.append(f"keys must be a non-empty subset of {BYTE_RATE_KEYS}, got {self.keys}")
        if str(self.rate_scope) == "instance":  # the former default, in old policy files
            problems.append("rate_scope 'instance' is gone: a fleet holds one budget per broker, so rates "
                            "are summed over every instance and worker; use 'broker' (or 'cluster')")
        elif self.rate_scope not in RATE_SCOPES:
            problems.append(f"rate_scope must be one of {RATE_SCOPES}, got {self.rate_scope!r}")
        if self.unmatched not in _UNMATCHED:
            problems.append(f"unmatched must be one of {_UNMATCHED}, got {self.unmatched!r}")
        if problems:
            raise PolicyError("; ".join(problems))

    @property
    def percentile_label(self) -> str:
        """0.95 -> 'p95', 0.999 -> 'p99.9', 1.0 -> 'max'."""
        if self.percentile == 1:
            return "max"
        return "p" + f"{self.percentile * 100:.4f}".rstrip("0").rstrip(".")

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["capacity"], out["weights"] = dict(self.capacity), dict(self.weights)
        out["keys"] = list(self.keys)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QuotaPolicy:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise PolicyError(f"unknown policy settings {sorted(unknown)}; known: {sorted(known)}")
        values = dict(data)
        if "keys" in values:
            values["keys"] = tuple(values["keys"])
        return cls(**values)

    @classmethod
    def from_file(cls, path: Path) -> QuotaPolicy:
        """A JSON or YAML file with any of the fields above."""
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
        if not isinstance(data, dict):
            raise PolicyError(f"{path}: expected a mapping of policy settings")
        return cls.from_dict(data)


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3}


def parse_byte_rate(text: str) -> float:
    """'1048576', '512KiB', '10MB', '1.5GiB' (per second implied) -> bytes per second."""
    s = text.strip().lower().removesuffix("/s")
    number = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(number):].strip()
    if unit not in _UNITS or not number:
        raise PolicyError(f"bad byte rate {text!r}: use a number with an optional unit {sorted(_UNITS)}")
    try:
        return float(number) * _UNITS[unit]
    except ValueError:
        raise PolicyError(f"bad byte rate {text!r}") from None
