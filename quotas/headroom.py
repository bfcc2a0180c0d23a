"""Headroom: how far a sharing group runs below the limit in force, sans I/O.

One `UsageEntry` per live quota sensor of a running Sluice: its windowed rate (Kafka's measure,
what enforcement compares), the limit in force (after the callback, the storage factor and the
fleet share), the headroom ``limit - rate`` and the ratio ``headroom / limit`` (1 idle, 0 at the
limit, below 0 over it; 0 for a limit of 0, which leaves no room at all). An unlimited sensor has
no limit, headroom or ratio (`None`, JSON null).

The proxy builds the entries from its managers (`proxy.ops.headroom`) and serves them as a JSON
`UsageReport` on the metrics port; `sluice quotas describe --usage` reads that document. With
``--workers N`` the supervisor merges the workers' reports with `merge_worker_reports`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from quotas.entity import QuotaKind, SensorKey

#: Format version of the JSON document (`"version"`); a reader refuses another one.
USAGE_VERSION = 1

#: The `kind` label of the metrics (`sluice_quota_limit{kind=...}`), per quota kind.
KIND_LABEL: Mapping[QuotaKind, str] = {
    QuotaKind.PRODUCE: "produce",
    QuotaKind.FETCH: "fetch",
    QuotaKind.REQUEST_RATE: "request_rate",
    QuotaKind.REQUEST_PERCENTAGE: "request_percentage",
    QuotaKind.PRODUCER_RECORD_RATE: "producer_record_rate",
    QuotaKind.CONSUMER_RECORD_RATE: "consumer_record_rate",
}
#: The unit of a kind's rate and limit.
KIND_UNIT: Mapping[QuotaKind, str] = {
    QuotaKind.PRODUCE: "bytes/s",
    QuotaKind.FETCH: "bytes/s",
    QuotaKind.REQUEST_RATE: "requests/s",
    QuotaKind.REQUEST_PERCENTAGE: "percent",
    QuotaKind.PRODUCER_RECORD_RATE: "records/s",
    QuotaKind.CONSUMER_RECORD_RATE: "records/s",
}
_BY_LABEL = {label: kind for kind, label in KIND_LABEL.items()}

#: A configured entity as Kafka's components, e.g. ``(("user", "alice"), ("client-id", None))``
#: (None: the default); in JSON an object, as `sluice quotas describe --output json` prints one.
Entity = tuple[tuple[str, str | None], ...]


class UsageFormatError(ValueError):
    """A document that is not a usage report of this format."""


def headroom(rate: float, limit: float | None) -> float | None:
    """``limit - rate``; None when unlimited."""
    return None if limit is None else limit - rate


def headroom_ratio(rate: float, limit: float | None) -> float | None:
    """``(limit - rate) / limit``; 0 for a limit of 0 (a paused entity has no room); None when
    unlimited."""
    if limit is None:
        return None
    if limit <= 0.0:
        return 0.0
    return (limit - rate) / limit


def client_label(key: SensorKey) -> str:
    """The client_id label: the client id, or ``PREFIX*`` for a shared client-id prefix."""
    return key.client_id_prefix + "*" if key.client_id_prefix else key.client_id


def topic_label(key: SensorKey) -> str:
    """The topic label: the topic, or ``PREFIX*`` for a shared topic prefix."""
    return key.topic_prefix + "*" if key.topic_prefix else key.topic


@dataclass(frozen=True, slots=True)
class WorkerUsage:
    """One worker's part of a merged entry (``--workers N``)."""

    worker: int
    rate: float
    limit: float | None
    share: float


@dataclass(frozen=True, slots=True)
class UsageEntry:
    """One sensor: `broker` is the metrics label (a broker id, ``bootstrap``, ``all`` or
    ``cluster``); `user`, `client_id` and `topic` are the sensor's tags as the metrics show them
    (empty when unused, ``PREFIX*`` for a shared prefix). `entity` is the configured entry whose
    value applied, when the callback can tell. `base_limit` is the limit before the
    fleet share (after the callback and the storage factor); `limit` = `base_limit` x `share`."""

    broker: str
    kind: QuotaKind
    user: str
    client_id: str
    topic: str
    rate: float
    limit: float | None
    base_limit: float | None = None
    share: float = 1.0
    storage_factor: float = 1.0
    shadow: bool = False
    entity: Entity | None = None
    workers: tuple[WorkerUsage, ...] = field(default=())
    tags: str = ""  # a callback's own tags (`SensorKey.tags_label`), "" when none

    @classmethod
    def of_sensor(cls, broker: str, key: SensorKey, rate: float, limit: float | None,
                  base_limit: float | None = None, share: float = 1.0, storage_factor: float = 1.0,
                  shadow: bool = False, entity: Entity | None = None) -> UsageEntry:
        return cls(broker, key.kind, key.user, client_label(key), topic_label(key), rate, limit,
                   limit if base_limit is None else base_limit, share, storage_factor, shadow, entity,
                   tags=key.tags_label)

    @property
    def headroom(self) -> float | None:
        return headroom(self.rate, self.limit)

    @property
    def headroom_ratio(self) -> float | None:
        return headroom_ratio(self.rate, self.limit)

    @property
    def group(self) -> tuple[str, QuotaKind, str, str, str, str]:
        """What identifies the sharing group across workers."""
        return (self.broker, self.kind, self.user, self.client_id, self.topic, self.tags)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "broker": self.broker, "kind": KIND_LABEL[self.kind], "key": self.kind.value,
            "user": self.user, "client_id": self.client_id, "topic": self.topic, "tags": self.tags,
            "unit": KIND_UNIT[self.kind], "rate": self.rate, "limit": self.limit,
            "headroom": self.headroom, "headroom_ratio": self.headroom_ratio,
            "base_limit": self.base_limit, "share": self.share, "storage_factor": self.storage_factor,
            "shadow": self.shadow, "entity": None if self.entity is None else dict(self.entity)}
        if self.workers:
            out["workers"] = [{"worker": w.worker, "rate": w.rate, "limit": w.limit, "share": w.share}
                              for w in self.workers]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UsageEntry:
        try:
            kind = _BY_LABEL[str(data["kind"])]
            workers = tuple(WorkerUsage(int(w["worker"]), float(w["rate"]), _opt(w["limit"]),
                                        float(w["share"])) for w in data.get("workers", ()))
            return cls(str(data["broker"]), kind, str(data["user"]), str(data["client_id"]),
                       str(data["topic"]), float(data["rate"]), _opt(data["limit"]),
                       _opt(data["base_limit"]), float(data["share"]), float(data["storage_factor"]),
                       bool(data["shadow"]), _entity(data["entity"]), workers, str(data.get("tags", "")))
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageFormatError(f"not a usage entry: {exc!r}") from None


def _entity(value: Any) -> Entity | None:
    if value is None:
        return None
    return tuple((str(t), None if n is None else str(n)) for t, n in dict(value).items())


def _opt(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True, slots=True)
class UsageReport:
    """What `GET /quotas/usage` answers. `window_ms` is the rate's whole window (samples x sample
    window); `scope` is ``quotas.scope``; `workers` is N under ``--workers N`` (then the entries
    are merged, see `merge_worker_reports`), else None."""

    window_ms: int
    scope: str
    entries: tuple[UsageEntry, ...]
    workers: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"version": USAGE_VERSION, "window_ms": self.window_ms, "scope": self.scope,
                "workers": self.workers, "entries": [e.to_json() for e in self.entries]}

    @classmethod
    def from_json(cls, data: Any) -> UsageReport:
        if not isinstance(data, dict) or data.get("version") != USAGE_VERSION:
            raise UsageFormatError(f"not a usage report of version {USAGE_VERSION}")
        try:
            workers = data.get("workers")
            return cls(int(data["window_ms"]), str(data["scope"]),
                       tuple(UsageEntry.from_json(e) for e in data["entries"]),
                       None if workers is None else int(workers))
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageFormatError(f"not a usage report: {exc!r}") from None


def merge_worker_reports(reports: Mapping[int, UsageReport], workers: int) -> UsageReport:
    """``--workers N``: one entry per sharing group of the instance.

    The workers of one instance share one budget per group (the local fleet: each enforces
    ``base_limit x share``, the shares of the active workers sum to 1, an idle worker holds a
    standby share). So the merged rate is the sum of the workers' rates, and the limit the most
    the instance admits: the sum of the workers' limits in force, but never more than the
    budget (`base_limit`; standby shares make the sum exceed it). Each worker's part is kept
    in `workers`. The merged `share` is the instance's part of the budget (limit / base_limit)."""
    groups: dict[tuple[str, QuotaKind, str, str, str, str], list[tuple[int, UsageEntry]]] = {}
    for index in sorted(reports):
        for entry in reports[index].entries:
            groups.setdefault(entry.group, []).append((index, entry))
    merged = [_merge(parts) for parts in groups.values()]
    first = next(iter(reports.values()), None)
    return UsageReport(0 if first is None else first.window_ms, "broker" if first is None else first.scope,
                       tuple(merged), workers)


def _merge(parts: Sequence[tuple[int, UsageEntry]]) -> UsageEntry:
    entries = [e for _, e in parts]
    first = entries[0]
    rate = math.fsum(e.rate for e in entries)
    limits = [e.limit for e in entries if e.limit is not None]
    bases = [e.base_limit for e in entries if e.base_limit is not None]
    limit: float | None = None
    base: float | None = None
    share = 1.0
    if limits:
        base = max(bases) if bases else None
        total = math.fsum(limits)
        limit = total if base is None else min(total, base)
        share = 1.0 if not base else limit / base
    return replace(first, rate=rate, limit=limit, base_limit=base, share=share,
                   shadow=any(e.shadow for e in entries),
                   workers=tuple(WorkerUsage(i, e.rate, e.limit, e.share) for i, e in parts))


def select(entries: Iterable[UsageEntry], user: str | None = None, client_id: str | None = None,
           topic: str | None = None) -> list[UsageEntry]:
    """The sensors a caller and/or topic is counted in.

    Given a user and a client id: the caller's sensors, whose user tag is that user or unused and
    whose client tag is that client id, a ``PREFIX*`` it starts with, or unused. Given one of the
    two: the sensors tagged with it. Given a topic: that topic's sensors (the topic or a
    ``PREFIX*`` it starts with), beside the caller's. Nothing given: every entry."""
    def named(tag: str, name: str) -> bool:
        return tag == name or (tag.endswith("*") and name.startswith(tag[:-1]))

    def caller(e: UsageEntry) -> bool:
        if e.topic or (user is None and client_id is None):
            return False
        if user is not None and client_id is not None:
            return e.user in ("", user) and (e.client_id == "" or named(e.client_id, client_id))
        if user is not None:
            return e.user == user
        assert client_id is not None
        return named(e.client_id, client_id)

    def of_topic(e: UsageEntry) -> bool:
        return topic is not None and bool(e.topic) and named(e.topic, topic)

    if user is None and client_id is None and topic is None:
        return list(entries)
    return [e for e in entries if caller(e) or of_topic(e)]


# ------------------------------------------------------------------ /quotas/effective


@dataclass(frozen=True, slots=True)
class WorkerLimit:
    """One worker's part of a merged limit in force (``--workers N``)."""

    worker: int
    limit: float
    fleet_share: float


@dataclass(frozen=True, slots=True)
class EffectiveLimit:
    """One limit in force for a caller, as ``GET /quotas/effective`` carries it (the engine's
    `LimitInForce`): ``limit = configured x storage_factor x fleet_share``. `kind` is the quota
    key (``producer_byte_rate``); `entity` the matched entry's description."""

    scope: str
    kind: str
    unit: str
    limit: float
    configured: float
    storage_factor: float
    fleet_share: float
    source: str
    shadow: bool
    entity: str | None
    workers: tuple[WorkerLimit, ...] = field(default=())
    #: the sharing group's tag map (KIP-257's ``quotaMetricTags``, a callback's own tags too)
    tags: Mapping[str, str] = field(default_factory=dict)
    #: ``broker``: the budget is per broker; ``cluster``: one across the cluster (the draft's ``bps``)
    per: str = "broker"

    @property
    def group(self) -> tuple[str, str, str, str | None, tuple[tuple[str, str], ...], str]:
        """What identifies one budget across the workers of an instance."""
        return (self.scope, self.kind, self.source, self.entity, tuple(sorted(self.tags.items())), self.per)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "scope": self.scope, "kind": self.kind, "unit": self.unit, "limit": self.limit,
            "configured": self.configured, "storage_factor": self.storage_factor,
            "fleet_share": self.fleet_share, "source": self.source, "shadow": self.shadow,
            "entity": self.entity, "group": dict(self.tags), "per": self.per}
        if self.workers:
            out["workers"] = [{"worker": w.worker, "limit": w.limit, "fleet_share": w.fleet_share}
                              for w in self.workers]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EffectiveLimit:
        try:
            workers = tuple(WorkerLimit(int(w["worker"]), float(w["limit"]), float(w["fleet_share"]))
                            for w in data.get("workers", ()))
            entity = data["entity"]
            return cls(str(data["scope"]), str(data["kind"]), str(data["unit"]), float(data["limit"]),
                       float(data["configured"]), float(data["storage_factor"]), float(data["fleet_share"]),
                       str(data["source"]), bool(data["shadow"]), None if entity is None else str(entity),
                       workers, {str(k): str(v) for k, v in (data.get("group") or {}).items()},
                       str(data.get("per", "broker")))
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageFormatError(f"not a limit in force: {exc!r}") from None


def merge_worker_limits(answers: Mapping[int, Sequence[EffectiveLimit]]) -> list[EffectiveLimit]:
    """``--workers N``: one limit per budget of the instance, from each worker's limits in force.

    As for usage (`merge_worker_reports`): the workers of one instance hold shares of one budget
    (``configured x storage_factor``), so the instance's limit is the sum of the workers' limits,
    never more than the budget (an idle worker's standby share makes the sum exceed it), and its
    `fleet_share` is that limit over the budget. Each worker's part is kept in `workers`."""
    groups: dict[tuple[str, str, str, str | None, tuple[tuple[str, str], ...], str],
                 list[tuple[int, EffectiveLimit]]] = {}
    for index in sorted(answers):
        for part in answers[index]:
            groups.setdefault(part.group, []).append((index, part))
    out = []
    for parts in groups.values():
        first = parts[0][1]
        budget = first.configured * first.storage_factor
        total = math.fsum(x.limit for _, x in parts)
        limit = min(total, budget)
        out.append(replace(first, limit=limit, fleet_share=limit / budget if budget > 0 else 1.0,
                           shadow=any(x.shadow for _, x in parts),
                           workers=tuple(WorkerLimit(i, x.limit, x.fleet_share) for i, x in parts)))
    return out
