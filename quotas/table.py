"""What a quota store holds: per entity, Kafka's raw quota keys and their values, and changes.

Kafka keeps client quotas as ``entity -> {key: float}`` (`ClientQuotaControlManager`) and changes
them one key at a time (`AlterClientQuotas` ops, `ClientQuotaRecord`). A `QuotaTable` is that
map, immutable; a `QuotaChange` is one op. The enforcement view, `QuotaConfig`, is derived from it
with `QuotaTable.to_config`.

Keys are Kafka's (`producer_byte_rate`, `consumer_byte_rate`, `request_percentage`) and Sluice's
own: `request_rate` (requests per second), `sluice.shadow` (value 1: the entity's quotas are
measured and reported, never enforced), `sluice.token_bucket` (1: this entity's quotas use the
token bucket, 0: the windowed rate, absent: the global `rate_model`) and `sluice.burst_ms` (the
token bucket's burst as a duration of quota, at most the window). An entity whose only keys are
`sluice.*` flags is kept (as Kafka keeps any key) and has no quota to enforce.

`validate_key_value` applies Kafka's value rules with Kafka's messages (the broker's
`ClientQuotaControlManager.validateQuotaKeyValue`), so an admin request gets the answer a broker
would give.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from quotas.config import QuotaConfig, QuotaEntry
from quotas.entity import DEFAULT, Name, QuotaEntity, QuotaKind
from quotas.errors import QuotaConfigError
from quotas.stats import RateConfig, RateModel, check_burst_ms

SHADOW_KEY = "sluice.shadow"
"""Sluice's per-entity shadow flag as a quota key: 1 = measure and report, never throttle."""

TOKEN_BUCKET_KEY = "sluice.token_bucket"
"""1 = this entity's quotas use the token bucket, 0 = the windowed rate; absent = the global model."""

BURST_MS_KEY = "sluice.burst_ms"
"""The token bucket's burst in ms of quota (at most samples x size_ms; needs the token bucket)."""

EACH_CLIENT_ID_KEY = "sluice.each_client_id"
"""1 = every client id of a client-id-prefix entity gets its own sensor (default: one shared)."""

#: The quota-native admin draft's units, as Sluice keys (a plain key is Kafka's: per broker, or
#: across every broker under ``quotas.scope: cluster``). `bps`: one budget of the entity across
#: every broker behind this Sluice; `broker_bps`: a budget per broker, whatever the scope. Set
#: beside the plain key on one entity, each is its own budget: the limit hit first throttles.
BPS_KEYS: Mapping[str, QuotaKind] = MappingProxyType({
    f"sluice.bps.{k.value}": k for k in (QuotaKind.PRODUCE, QuotaKind.FETCH)})
BROKER_BPS_KEYS: Mapping[str, QuotaKind] = MappingProxyType({
    f"sluice.broker_bps.{k.value}": k for k in (QuotaKind.PRODUCE, QuotaKind.FETCH)})

SHARES_KEY = "sluice.shares"
"""The draft's `shares` unit: the entity's shares of contested bandwidth, read by the
`FairShareCallback` (which declares the capacity); for user and client-id entities."""

KNOWN_KEYS: frozenset[str] = frozenset({*(k.value for k in QuotaKind), SHADOW_KEY, TOKEN_BUCKET_KEY,
                                        BURST_MS_KEY, EACH_CLIENT_ID_KEY, *BPS_KEYS, *BROKER_BPS_KEYS,
                                        SHARES_KEY})

_KINDS_BY_KEY = {k.value: k for k in QuotaKind}
_STORE_KEYS = {"burst_ms": BURST_MS_KEY, "each_client_id": EACH_CLIENT_ID_KEY}
_LONG_LIMIT = float(2**63)  # a double >= this is not a Java long


@dataclass(frozen=True, slots=True)
class QuotaChange:
    """Set `key` of `entity` to `value`, or remove the key when `value` is None."""

    entity: QuotaEntity
    key: str
    value: float | None

    def __str__(self) -> str:
        what = "remove" if self.value is None else f"{format_value(self.value)}"
        return f"{self.entity.describe()}: {self.key} -> {what}"


def validate_key_value(key: str, value: float) -> str | None:
    """Kafka's checks of one quota value, in Kafka's order and words; None when it is valid.

    Unknown key, then ``<= 0``, then (for the LONG byte rates) too large and fractional. Sluice
    adds: a value must be finite (Kafka lets NaN through), `sluice.shadow` must be 1,
    `sluice.token_bucket` 0 or 1, `sluice.burst_ms` a whole number of ms (whether it fits the
    window is checked with the window: `QuotaTable.to_config`).
    """
    if key not in KNOWN_KEYS:
        return f"Invalid configuration key {key}"
    if key == TOKEN_BUCKET_KEY:
        if value not in (0.0, 1.0):
            return f"Quota {key} must be 1 (token bucket) or 0 (windowed rate), got {format_value(value)}"
        return None
    if not value > 0.0:
        if math.isnan(value):
            return f"Quota {key} must be a number"
        return f"Quota {key} must be greater than 0"
    if math.isinf(value):
        return f"Quota {key} must be finite"
    kind = _KINDS_BY_KEY.get(key) or BPS_KEYS.get(key) or BROKER_BPS_KEYS.get(key)
    if kind is not None and kind.is_byte_rate:
        if value >= _LONG_LIMIT:
            return f"Proposed value for {key} is too large for a LONG."
        if abs(value % 1.0) > 1e-6:
            return f"{key} cannot be a fractional value."
    if key in (SHADOW_KEY, EACH_CLIENT_ID_KEY) and value != 1.0:
        return f"Quota {key} must be 1 (remove the key to turn it off)" if key != SHADOW_KEY else \
            f"Quota {key} must be 1 (remove the key to turn shadow mode off)"
    if key == BURST_MS_KEY and (abs(value % 1.0) > 1e-6 or value >= _LONG_LIMIT):
        return f"{key} must be a whole number of milliseconds"
    return None


class QuotaTable(Mapping[QuotaEntity, Mapping[str, float]]):
    """An immutable ``{QuotaEntity: {key: value}}``. Every entity has at least one key."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[QuotaEntity, Mapping[str, float]]
                 | Iterable[tuple[QuotaEntity, Mapping[str, float]]] = ()) -> None:
        pairs = items.items() if isinstance(items, Mapping) else items
        self._items: dict[QuotaEntity, Mapping[str, float]] = {
            entity: _frozen(values) for entity, values in pairs if values}

    def __getitem__(self, entity: QuotaEntity) -> Mapping[str, float]:
        return self._items[entity]

    def __iter__(self) -> Iterator[QuotaEntity]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return {e: dict(v) for e, v in self._items.items()} == {e: dict(v) for e, v in other.items()}
        return NotImplemented

    def __hash__(self) -> int:
        return hash(frozenset((e, frozenset(v.items())) for e, v in self._items.items()))

    def __repr__(self) -> str:
        inner = "; ".join(f"{e.describe()}: " + ", ".join(f"{k}={format_value(v)}" for k, v in vals.items())
                          for e, vals in self.sorted_items())
        return f"QuotaTable({inner})"

    def sorted_items(self) -> list[tuple[QuotaEntity, Mapping[str, float]]]:
        """Entries in a stable order: by user, then client id (defaults after names)."""
        return sorted(self._items.items(), key=lambda item: entity_sort_key(item[0]))

    def apply(self, changes: Iterable[QuotaChange]) -> QuotaTable:
        """The table after `changes`, in order. Removing an absent key is a no-op (as in Kafka);
        an entity left with no key goes."""
        items = {e: dict(v) for e, v in self._items.items()}
        for change in changes:
            values = items.setdefault(change.entity, {})
            if change.value is None:
                values.pop(change.key, None)
            else:
                values[change.key] = float(change.value)
            if not values:
                del items[change.entity]
        return QuotaTable(items)

    def changes_to(self, other: Mapping[QuotaEntity, Mapping[str, float]]) -> list[QuotaChange]:
        """The changes that turn this table into `other` (removals first, then sets)."""
        removed = [QuotaChange(e, k, None) for e, vals in self.sorted_items() for k in sorted(vals)
                   if k not in other.get(e, {})]
        target = other if isinstance(other, QuotaTable) else QuotaTable(other)
        changed = [QuotaChange(e, k, v) for e, vals in target.sorted_items() for k, v in sorted(vals.items())
                   if self._items.get(e, {}).get(k) != v]
        return removed + changed

    def to_config(self, *, shadow_all: bool = False, window: RateConfig | None = None,
                  rate_model: RateModel = RateModel.WINDOWED, burst_ms: int | None = None) -> QuotaConfig:
        """The enforcement view: one `QuotaEntry` per entity with at least one quota value;
        `shadow_all`, `window`, `rate_model` and `burst_ms` are the global settings (the YAML's).

        Raises `QuotaConfigError` if a value breaks the quota rules (a store validates what it
        loads with `validate_key_value` first), or an entity's `sluice.burst_ms` does not fit the
        window or comes with ``sluice.token_bucket=0``; the key names the entity and the key."""
        window = window or RateConfig()
        entries = []
        for entity, values in self.sorted_items():
            kinds = {_KINDS_BY_KEY[k]: v for k, v in values.items() if k in _KINDS_BY_KEY}
            if not kinds:
                continue
            model = values.get(TOKEN_BUCKET_KEY)
            burst = values.get(BURST_MS_KEY)
            try:
                if values.get(EACH_CLIENT_ID_KEY) == 1.0:
                    entity = replace(entity, each_client_id=True)
                entry = QuotaEntry(entity, kinds, shadow=values.get(SHADOW_KEY) == 1.0,
                                   rate_model=None if model is None else
                                   (RateModel.TOKEN_BUCKET if model == 1.0 else RateModel.WINDOWED),
                                   burst_ms=None if burst is None else int(burst))
                if entry.burst_ms is not None:
                    check_burst_ms(window, entry.burst_ms)
            except QuotaConfigError as e:
                raise QuotaConfigError.of(
                    (f"{entity.describe()}: " + _STORE_KEYS.get(k, k), r) for k, r in e.problems) from None
            entries.append(entry)
        return QuotaConfig(tuple(entries), shadow_all, window, rate_model, burst_ms)

    def unit_configs(self, *, shadow_all: bool = False, window: RateConfig | None = None,
                     rate_model: RateModel = RateModel.WINDOWED,
                     burst_ms: int | None = None) -> tuple[QuotaConfig, QuotaConfig]:
        """The draft's units as enforcement views: ``(bps, broker_bps)``, an entry per entity that
        sets ``sluice.bps.*`` (one budget across every broker) or ``sluice.broker_bps.*`` (one per
        broker), each with the entity's shadow flag and rate model. Raises `QuotaConfigError`
        naming the entity and key for a topic entity (its budgets are the topic's already)."""
        window = window or RateConfig()
        out: list[list[QuotaEntry]] = [[], []]
        problems: list[tuple[str, str]] = []
        for entity, values in self.sorted_items():
            for i, keys in enumerate((BPS_KEYS, BROKER_BPS_KEYS)):
                kinds = {keys[k]: v for k, v in values.items() if k in keys}
                if not kinds:
                    continue
                if entity.is_topic:
                    problems.extend((f"{entity.describe()}: {k}", "is for client entities (a topic's "
                                     "budgets are the topic's own)") for k in values if k in keys)
                    continue
                model = values.get(TOKEN_BUCKET_KEY)
                burst = values.get(BURST_MS_KEY)
                try:
                    out[i].append(QuotaEntry(
                        replace(entity, each_client_id=values.get(EACH_CLIENT_ID_KEY) == 1.0), kinds,
                        shadow=values.get(SHADOW_KEY) == 1.0,
                        rate_model=None if model is None else
                        (RateModel.TOKEN_BUCKET if model == 1.0 else RateModel.WINDOWED),
                        burst_ms=None if burst is None else int(burst)))
                except QuotaConfigError as e:
                    problems.extend((f"{entity.describe()}: " + _STORE_KEYS.get(k, k), r)
                                    for k, r in e.problems)
        if problems:
            raise QuotaConfigError.of(problems)
        return (QuotaConfig(tuple(out[0]), shadow_all, window, rate_model, burst_ms),
                QuotaConfig(tuple(out[1]), shadow_all, window, rate_model, burst_ms))

    def shares(self) -> dict[QuotaEntity, float]:
        """``sluice.shares`` by entity (`SHARES_KEY`). Raises `QuotaConfigError` naming the entity
        for one that is not a named user, client id or both (the fair share matches callers by
        those)."""
        out: dict[QuotaEntity, float] = {}
        problems: list[tuple[str, str]] = []
        for entity, values in self.sorted_items():
            value = values.get(SHARES_KEY)
            if value is None:
                continue
            if (entity.is_topic or entity.client_id_prefix is not None or entity.user is DEFAULT
                    or entity.client_id is DEFAULT):
                problems.append((f"{entity.describe()}: {SHARES_KEY}", "is for a named user, client id or "
                                 "both (the fair share's callers)"))
                continue
            out[entity] = value
        if problems:
            raise QuotaConfigError.of(problems)
        return out

    @classmethod
    def from_config(cls, config: QuotaConfig) -> QuotaTable:
        """The table holding `config`'s entries (shadow entries get `sluice.shadow` = 1)."""
        items: dict[QuotaEntity, dict[str, float]] = {}
        for entry in config:
            values = {kind.value: float(v) for kind, v in entry.values.items()}
            if entry.shadow:
                values[SHADOW_KEY] = 1.0
            if entry.rate_model is not None:
                values[TOKEN_BUCKET_KEY] = 1.0 if entry.rate_model is RateModel.TOKEN_BUCKET else 0.0
            if entry.burst_ms is not None:
                values[BURST_MS_KEY] = float(entry.burst_ms)
            if entry.entity.each_client_id:
                values[EACH_CLIENT_ID_KEY] = 1.0
            items[entry.entity] = values
        return cls(items)


def entity_sort_key(entity: QuotaEntity) -> tuple[tuple[int, str], ...]:
    return (_name_key(entity.user), _name_key(entity.client_id), _name_key(entity.client_id_prefix),
            _name_key(entity.topic), _name_key(entity.topic_prefix))


def _name_key(name: Name | None) -> tuple[int, str]:
    if name is None:
        return (0, "")
    if name is DEFAULT:
        return (2, "")
    return (1, str(name))


def format_value(value: float) -> str:
    """``1048576`` for whole numbers, ``1.5`` otherwise (as the CLI prints values)."""
    if value.is_integer() and abs(value) < 1e18:
        return str(int(value))
    return repr(value)


def _frozen(values: Mapping[str, float]) -> Mapping[str, float]:
    return MappingProxyType(dict(sorted((str(k), float(v)) for k, v in values.items())))
