"""Quota configuration: immutable snapshots, Kafka's value validation, and a plain-dict parser.

A `QuotaConfig` is what the proxy loads from YAML (or builds from admin requests) and hands to
`QuotaManager.update_config`. Snapshots never change; `with_entry` and friends return new ones.

YAML shape (``quotas:`` section)::

    shadow: false                       # shadow_all: compute throttles, never enforce them
    window: {samples: 11, size_ms: 1000}
    rate_model: windowed                # or token_bucket (`quotas.stats.RateModel`); per entry too
    burst_ms: 11000                     # token bucket: burst = quota x burst_ms (<= samples x size_ms)
    entries:
      - {user: alice, client_id: "<default>", producer_byte_rate: 1048576, shadow: true}
      - {user: "<default>", consumer_byte_rate: 2097152, rate_model: token_bucket, burst_ms: 2000}
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from quotas.entity import DEFAULT, Name, QuotaEntity, QuotaKind
from quotas.errors import QuotaConfigError, join_key
from quotas.stats import BucketShape, RateConfig, RateModel, check_burst_ms

#: Kafka LONG configs must fit a Java long.
_LONG_MAX = 2**63 - 1
_DEFAULT_NAME = "<default>"
_NOT_PER_TOPIC = "a topic entry cannot limit it: broker time is not attributed to topics"


def validate_quota_value(kind: QuotaKind, value: object) -> float:
    """Kafka's rules for a quota value (`ClientQuotaControlManager`): a finite number > 0; byte
    rates are LONG configs, so whole numbers (``|v mod 1| <= 1e-6``) within a Java long.

    Raises `QuotaConfigError(kind.value, reason)`.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise QuotaConfigError(kind.value, f"must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise QuotaConfigError(kind.value, f"must be finite, got {v}")
    if v <= 0:
        raise QuotaConfigError(kind.value, "must be > 0")
    if kind.is_byte_rate:
        if abs(v % 1) > 1e-6:
            raise QuotaConfigError(kind.value, f"must be a whole number of bytes per second, got {v}")
        if v > _LONG_MAX:
            raise QuotaConfigError(kind.value, f"must be <= {_LONG_MAX}")
    return v


class QuotaValues(Mapping[QuotaKind, float]):
    """An immutable, hashable ``{QuotaKind: value}`` mapping."""

    __slots__ = ("_items",)

    def __init__(self, values: Mapping[QuotaKind, float] | Iterable[tuple[QuotaKind, float]] = ()) -> None:
        self._items: dict[QuotaKind, float] = dict(values)

    def __getitem__(self, kind: QuotaKind) -> float:
        return self._items[kind]

    def __iter__(self) -> Iterator[QuotaKind]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return dict(self._items) == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k.value}: {v:g}" for k, v in self._items.items()) + "}"


@dataclass(frozen=True)
class QuotaEntry:
    """The quota values configured for one entity. `shadow` entries are measured and reported but
    never throttle (`ThrottleDecision.throttle_time_ms` is 0, `would_throttle_ms` is not).

    `rate_model` and `burst_ms` choose this entry's `RateModel` and token-bucket burst; `None`
    takes the config's global ones. A `burst_ms` with ``rate_model=WINDOWED`` is refused."""

    entity: QuotaEntity
    values: Mapping[QuotaKind, float]
    shadow: bool = False
    rate_model: RateModel | None = None
    burst_ms: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.entity, QuotaEntity):
            raise QuotaConfigError("entity", f"must be a QuotaEntity, got {self.entity!r}")
        if not self.values:
            raise QuotaConfigError("", "an entry needs at least one of "
                                   + ", ".join(k.value for k in QuotaKind))
        checked = []
        for kind, value in self.values.items():
            if not isinstance(kind, QuotaKind):
                raise QuotaConfigError(str(kind), "unknown quota kind")
            checked.append((kind, validate_quota_value(kind, value)))
            if self.entity.is_topic and not kind.topic_attributable:
                raise QuotaConfigError(kind.value, _NOT_PER_TOPIC)
        object.__setattr__(self, "values", QuotaValues(checked))
        if self.rate_model is not None and not isinstance(self.rate_model, RateModel):
            raise QuotaConfigError("rate_model", f"must be a RateModel, got {self.rate_model!r}")
        if self.burst_ms is not None:
            if self.rate_model is RateModel.WINDOWED:
                raise QuotaConfigError("burst_ms", "applies only to rate_model token_bucket, "
                                                   "and this entry says windowed")
            if isinstance(self.burst_ms, bool) or not isinstance(self.burst_ms, int) or self.burst_ms < 1:
                raise QuotaConfigError("burst_ms", f"must be a whole number of ms >= 1, "
                                                   f"got {self.burst_ms!r}")


@dataclass(frozen=True)
class QuotaConfig:
    """An immutable snapshot of every quota entry, keyed by entity (at most one entry each).

    `shadow_all` turns every decision into a shadow one. `window` is the rate window (Kafka's
    `quota.window.num` / `quota.window.size.seconds`); like Kafka's it is fixed at start-up.
    `rate_model` and `burst_ms` are the defaults of entries that do not set their own; every
    `burst_ms` must fit the window (Kafka's burst, ``samples x size_ms``, is the most).
    """

    entries: tuple[QuotaEntry, ...] = ()
    shadow_all: bool = False
    window: RateConfig = field(default_factory=RateConfig)
    rate_model: RateModel = RateModel.WINDOWED
    burst_ms: int | None = None
    _by_entity: Mapping[QuotaEntity, QuotaEntry] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        entries = tuple(self.entries)
        by_entity: dict[QuotaEntity, QuotaEntry] = {}
        for i, entry in enumerate(entries):
            if not isinstance(entry, QuotaEntry):
                raise QuotaConfigError(f"entries[{i}]", f"must be a QuotaEntry, got {entry!r}")
            if entry.entity in by_entity:
                raise QuotaConfigError(f"entries[{i}]", f"duplicate entity {entry.entity.describe()}")
            by_entity[entry.entity] = entry
            if entry.burst_ms is not None:
                try:
                    check_burst_ms(self.window, entry.burst_ms)
                except QuotaConfigError as e:
                    raise e.under(f"entries[{i}]") from None
        if not isinstance(self.rate_model, RateModel):
            raise QuotaConfigError("rate_model", f"must be a RateModel, got {self.rate_model!r}")
        if self.burst_ms is not None:
            check_burst_ms(self.window, self.burst_ms)
        object.__setattr__(self, "entries", entries)
        object.__setattr__(self, "_by_entity", by_entity)

    def model_of(self, entry: QuotaEntry | None) -> RateModel:
        """The rate model enforcing `entry` (its own, else the global one)."""
        if entry is None or entry.rate_model is None:
            return self.rate_model
        return entry.rate_model

    def bucket_of(self, entry: QuotaEntry | None) -> BucketShape | None:
        """The token bucket's shape for `entry`, or None when its model is windowed."""
        if self.model_of(entry) is not RateModel.TOKEN_BUCKET:
            return None
        burst_ms = entry.burst_ms if entry is not None and entry.burst_ms is not None else self.burst_ms
        return BucketShape.of(self.window, burst_ms)

    def get(self, entity: QuotaEntity) -> QuotaEntry | None:
        return self._by_entity.get(entity)

    def value(self, entity: QuotaEntity, kind: QuotaKind) -> float | None:
        entry = self._by_entity.get(entity)
        return None if entry is None else entry.values.get(kind)

    def __iter__(self) -> Iterator[QuotaEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, entity: object) -> bool:
        return entity in self._by_entity

    def kinds(self) -> frozenset[QuotaKind]:
        """Every kind at least one entry sets."""
        return frozenset(kind for entry in self.entries for kind in entry.values)

    def with_entry(self, entry: QuotaEntry) -> QuotaConfig:
        """A snapshot where `entry` replaces any entry for the same entity (or is appended)."""
        if entry.entity in self._by_entity:
            entries = tuple(entry if e.entity == entry.entity else e for e in self.entries)
        else:
            entries = (*self.entries, entry)
        return replace(self, entries=entries)

    def with_value(self, entity: QuotaEntity, kind: QuotaKind, value: float) -> QuotaConfig:
        """Set one key (kafka-configs ``--add-config``), keeping the entity's other keys."""
        entry = self._by_entity.get(entity)
        values = dict(entry.values) if entry else {}
        values[kind] = value
        if entry is None:
            return self.with_entry(QuotaEntry(entity, values))
        return self.with_entry(replace(entry, values=values))

    def without_key(self, entity: QuotaEntity, kind: QuotaKind) -> QuotaConfig:
        """Remove one key (kafka-configs ``--delete-config``); an entity left with no keys goes.
        Removing an absent key is a no-op, as in Kafka."""
        entry = self._by_entity.get(entity)
        if entry is None or kind not in entry.values:
            return self
        values = {k: v for k, v in entry.values.items() if k is not kind}
        if not values:
            return self.without_entity(entity)
        return self.with_entry(replace(entry, values=values))

    def without_entity(self, entity: QuotaEntity) -> QuotaConfig:
        if entity not in self._by_entity:
            return self
        return replace(self, entries=tuple(e for e in self.entries if e.entity != entity))

    def with_shadow_all(self, shadow_all: bool) -> QuotaConfig:
        return replace(self, shadow_all=shadow_all)

    @classmethod
    def from_dict(cls, data: object, *, path: str = "quotas") -> QuotaConfig:
        """Parse the plain data YAML gives (see the module docstring).

        Raises `QuotaConfigError` listing every problem found, each keyed by its full path, e.g.
        ``quotas.entries[2].producer_byte_rate: must be > 0``.
        """
        try:
            model = _QuotasModel.model_validate(data)
        except pydantic.ValidationError as e:
            raise QuotaConfigError.of(_pydantic_problems(e, path)) from None

        problems: list[tuple[str, str]] = []
        entries: list[QuotaEntry] = []
        seen: dict[QuotaEntity, int] = {}
        window = RateConfig(samples=model.window.samples, window_ms=model.window.size_ms)
        for i, raw in enumerate(model.entries):
            where = join_key(path, f"entries[{i}]")
            problems_before = len(problems)
            try:
                entity = QuotaEntity(user=_name(raw.user), client_id=_name(raw.client_id),
                                     client_id_prefix=raw.client_id_prefix, topic=raw.topic,
                                     topic_prefix=raw.topic_prefix, each_client_id=raw.each_client_id)
            except QuotaConfigError as e:
                problems.extend(e.under(where).problems)
                entity = None
            values: dict[QuotaKind, float] = {}
            for kind in QuotaKind:
                value = getattr(raw, kind.value)
                if value is None:
                    continue
                try:
                    values[kind] = validate_quota_value(kind, value)
                except QuotaConfigError as e:
                    problems.extend(e.under(where).problems)
                if entity is not None and entity.is_topic and not kind.topic_attributable:
                    problems.append((join_key(where, kind.value), _NOT_PER_TOPIC))
            if not values and all(getattr(raw, k.value) is None for k in QuotaKind):
                problems.append((where, "needs at least one of " + ", ".join(k.value for k in QuotaKind)))
            if entity is None:
                continue
            if entity in seen:
                problems.append((where, f"duplicate entity {entity.describe()} "
                                        f"(already at entries[{seen[entity]}])"))
                continue
            seen[entity] = i
            rate_model = None if raw.rate_model is None else RateModel(raw.rate_model)
            if raw.burst_ms is not None:
                if rate_model is RateModel.WINDOWED:
                    problems.append((join_key(where, "burst_ms"),
                                     "applies only to rate_model token_bucket, and this entry says windowed"))
                    continue
                try:
                    check_burst_ms(window, raw.burst_ms)
                except QuotaConfigError as e:
                    problems.extend(e.under(where).problems)
                    continue
            if values and len(problems) == problems_before:
                entries.append(QuotaEntry(entity, values, raw.shadow, rate_model, raw.burst_ms))
        if model.burst_ms is not None:
            try:
                check_burst_ms(window, model.burst_ms)
            except QuotaConfigError as e:
                problems.extend(e.under(path).problems)
        if problems:
            raise QuotaConfigError.of(problems)
        return cls(tuple(entries), model.shadow, window, RateModel(model.rate_model), model.burst_ms)

    def to_dict(self) -> dict[str, Any]:
        """The inverse of `from_dict` (``<default>`` for defaults, absent components omitted)."""
        entries: list[dict[str, Any]] = []
        for entry in self.entries:
            item: dict[str, Any] = {}
            if entry.entity.user is not None:
                item["user"] = str(entry.entity.user)
            if entry.entity.client_id is not None:
                item["client_id"] = str(entry.entity.client_id)
            for key in ("client_id_prefix", "topic", "topic_prefix"):
                if getattr(entry.entity, key) is not None:
                    item[key] = getattr(entry.entity, key)
            if entry.entity.each_client_id:
                item["each_client_id"] = True
            for kind, value in entry.values.items():
                item[kind.value] = int(value) if kind.is_byte_rate else value
            if entry.shadow:
                item["shadow"] = True
            if entry.rate_model is not None:
                item["rate_model"] = entry.rate_model.value
            if entry.burst_ms is not None:
                item["burst_ms"] = entry.burst_ms
            entries.append(item)
        out: dict[str, Any] = {"shadow": self.shadow_all,
                               "window": {"samples": self.window.samples, "size_ms": self.window.window_ms},
                               "rate_model": self.rate_model.value}
        if self.burst_ms is not None:
            out["burst_ms"] = self.burst_ms
        out["entries"] = entries
        return out


# ---- parsing models (structure and types only; values go through validate_quota_value) ----

_Number = Annotated[float, pydantic.Strict()]
_RateModelName = Literal["windowed", "token_bucket"]


class _WindowModel(BaseModel):
    """Kafka's quota window: a rate is measured over `samples` windows of `size_ms`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    samples: Annotated[int, Field(ge=1)] = Field(default=11, description="Kafka's quota.window.num")
    size_ms: Annotated[int, Field(ge=1)] = Field(
        default=1000, description="Kafka's quota.window.size.seconds, in milliseconds")


def _rate(what: str) -> Any:
    return Field(default=None, description=what)


class _EntryModel(BaseModel):
    """One quota entry: an entity (Kafka's user and client-id, or Sluice's prefixes and topics) and
    its limits."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    user: str | None = Field(default=None, description="the principal, or <default>")
    client_id: str | None = Field(default=None, description="the client id, or <default>")
    producer_byte_rate: _Number | None = _rate("produce bytes/s (a whole number)")
    consumer_byte_rate: _Number | None = _rate("fetch bytes/s (a whole number)")
    request_percentage: _Number | None = _rate("percent of one broker thread: the upstream round trip of "
                                               "non-Fetch requests")
    request_rate: _Number | None = _rate("Sluice's: requests/s")
    producer_record_rate: _Number | None = _rate("Sluice's: produced records/s")
    consumer_record_rate: _Number | None = _rate("Sluice's: fetched records/s")
    client_id_prefix: str | None = Field(default=None, description="client ids starting with it share one "
                                                                   "rate (or each its own, each_client_id)")
    each_client_id: bool = Field(default=False, description="with client_id_prefix: a rate per client id")
    topic: str | None = Field(default=None, description="a topic quota: every client of the topic together")
    topic_prefix: str | None = Field(default=None, description="topics starting with it share one rate")
    shadow: bool = Field(default=False, description="measure and report, never throttle")
    rate_model: _RateModelName | None = Field(default=None, description="this entry's rate model "
                                                                        "(default: quotas.rate_model)")
    burst_ms: int | None = Field(default=None, description="token bucket: burst = quota x burst_ms "
                                                           "(at most samples x size_ms)")


class _QuotasModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    shadow: bool = Field(default=False, description="every quota measured and reported, none enforced")
    window: _WindowModel = _WindowModel()
    rate_model: _RateModelName = Field(default="windowed", description="windowed (Kafka's sampled rate) or "
                                                                      "token_bucket, for entries that do "
                                                                      "not say")
    burst_ms: int | None = Field(default=None, description="token bucket: burst = quota x burst_ms "
                                                           "(default and most: samples x size_ms)")
    entries: list[_EntryModel] = Field(default=[], description="the quota entries: the store's seed "
                                                               "(Kafka's 8-level precedence)")


def _name(raw: str | None) -> Name | None:
    if raw is None:
        return None
    return DEFAULT if raw == _DEFAULT_NAME else raw


_MESSAGES = {
    "extra_forbidden": "unknown key",
    "missing": "required",
    "bool_type": "must be true or false",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "model_type": "must be a mapping",
    "dict_type": "must be a mapping",
}


def _pydantic_problems(error: pydantic.ValidationError, path: str) -> list[tuple[str, str]]:
    problems = []
    for detail in error.errors(include_url=False):
        key = path
        for part in detail["loc"]:
            key = f"{key}[{part}]" if isinstance(part, int) else join_key(key, str(part))
        kind = detail["type"]
        ctx = detail.get("ctx") or {}
        if kind == "greater_than_equal":
            reason = f"must be >= {ctx.get('ge')}"
        else:
            reason = _MESSAGES.get(kind, detail["msg"])
        if kind != "extra_forbidden":
            reason = f"{reason}, got {detail.get('input')!r}"
        problems.append((key, reason))
    return problems
