"""Built-in KIP-257 callbacks: quota groups, partition-proportional quotas and fair shares.

Each is loaded by class path like any other callback (``quotas.builtin:GroupQuotaCallback``) and
called as ``cls(broker_id=..., **config)``; configuration errors raise `QuotaConfigError` with key
paths relative to ``quotas.callback.config``.

* `GroupQuotaCallback`: named groups of users and/or client ids; all members of a group share one
  sensor (key ``("<group:NAME>", "")``) and the group's limit. Everyone else, and a member for a
  kind the group sets no limit for, gets Kafka's default precedence over the configured entries.
* `PartitionProportionalCallback`: the limit from Kafka's precedence is a *total*; on broker b a
  client gets ``total x (partitions of its topics led by b) / (led partitions of its topics)``,
  recomputed whenever Sluice sees leaders move (`update_cluster_metadata`).
* `FairShareCallback`: a declared capacity per kind is divided among the *active* entities in
  proportion to their shares (weighted max-min fairness, see the class).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from quotas.callback import DefaultQuotaCallback
from quotas.cluster import ClusterView
from quotas.config import _pydantic_problems, validate_quota_value
from quotas.entity import ClientIdentity, QuotaEntity, QuotaKind, SensorKey
from quotas.errors import QuotaConfigError

_Number = Annotated[float, pydantic.Strict()]
_Strict = ConfigDict(extra="forbid", strict=True, frozen=True)


class _Limits(BaseModel):
    model_config = _Strict

    producer_byte_rate: _Number | None = None
    consumer_byte_rate: _Number | None = None
    request_percentage: _Number | None = None
    request_rate: _Number | None = None
    producer_record_rate: _Number | None = None
    consumer_record_rate: _Number | None = None

    def values(self, where: str) -> dict[QuotaKind, float]:
        out: dict[QuotaKind, float] = {}
        problems: list[tuple[str, str]] = []
        for kind in QuotaKind:
            raw = getattr(self, kind.value)
            if raw is None:
                continue
            try:
                out[kind] = validate_quota_value(kind, raw)
            except QuotaConfigError as exc:
                problems.extend(exc.under(where).problems)
        if problems:
            raise QuotaConfigError.of(problems)
        return out


def _parse(model: type[BaseModel], data: Mapping[str, Any], path: str = "quotas.callback.config") -> Any:
    try:
        return model.model_validate(dict(data))
    except pydantic.ValidationError as exc:
        raise QuotaConfigError.of(_pydantic_problems(exc, path)) from None


class _Base:
    """Kafka's precedence over the configured entries (non-sticky levels, as the proxy uses)."""

    wants_cluster_metadata: ClassVar[bool] = False

    def __init__(self, broker_id: int | None) -> None:
        self.broker_id = broker_id
        self._default = DefaultQuotaCallback(sticky_levels=False)

    def update_quota(self, entity: QuotaEntity, kind: QuotaKind, value: float) -> None:
        self._default.update_quota(entity, kind, value)

    def remove_quota(self, entity: QuotaEntity, kind: QuotaKind) -> None:
        self._default.remove_quota(entity, kind)

    def quota_reset_required(self, kind: QuotaKind) -> bool:
        return False

    def update_cluster_metadata(self, cluster: ClusterView) -> bool:
        return False

    def close(self) -> None:
        self._default.close()


# ------------------------------------------------------------------------------------ groups


class _GroupModel(_Limits):
    name: Annotated[str, Field(min_length=1, pattern=r"^[^<>]+$")]
    users: list[str] = []
    client_ids: list[str] = []


class _GroupsModel(BaseModel):
    model_config = _Strict

    groups: list[_GroupModel] = []


class Group:
    __slots__ = ("client_ids", "limits", "name", "users")

    def __init__(self, name: str, users: Sequence[str], client_ids: Sequence[str],
                 limits: Mapping[QuotaKind, float]) -> None:
        self.name = name
        self.users = frozenset(users)
        self.client_ids = frozenset(client_ids)
        self.limits = dict(limits)

    def key_user(self) -> str:
        return f"<group:{self.name}>"


class GroupQuotaCallback(_Base):
    """Named groups of users and/or client ids sharing one quota.

    Config::

        groups:
          - {name: payments, users: [alice, bob], client_ids: [billing], producer_byte_rate: 1048576}

    A caller is a member when its principal is in `users` or its client id in `client_ids`; the
    first group (in order) that has a limit for the kind wins. Members share the sensor
    ``SensorKey(kind, "<group:payments>", "")``, so `/metrics` shows ``user="<group:payments>"``.
    """

    def __init__(self, broker_id: int | None = None, **config: Any) -> None:
        super().__init__(broker_id)
        model: _GroupsModel = _parse(_GroupsModel, config)
        groups: list[Group] = []
        problems: list[tuple[str, str]] = []
        seen: set[str] = set()
        for i, raw in enumerate(model.groups):
            where = f"quotas.callback.config.groups[{i}]"
            try:
                limits = raw.values(where)
            except QuotaConfigError as exc:
                problems.extend(exc.problems)
                continue
            if not limits:
                problems.append((where, "needs at least one of " + ", ".join(k.value for k in QuotaKind)))
            if not raw.users and not raw.client_ids:
                problems.append((where, "needs users or client_ids"))
            if raw.name in seen:
                problems.append((where, f"duplicate group name {raw.name!r}"))
            seen.add(raw.name)
            groups.append(Group(raw.name, raw.users, raw.client_ids, limits))
        if problems:
            raise QuotaConfigError.of(problems)
        self.groups = tuple(groups)
        self._by_key = {g.key_user(): g for g in groups}
        self.quota_kinds = frozenset(k for g in groups for k in g.limits)

    def group_of(self, kind: QuotaKind, identity: ClientIdentity) -> Group | None:
        for group in self.groups:
            if kind in group.limits and (identity.principal in group.users
                                         or identity.client_id in group.client_ids):
                return group
        return None

    def sensor_key(self, kind: QuotaKind, identity: ClientIdentity) -> SensorKey:
        group = self.group_of(kind, identity)
        if group is not None:
            return SensorKey(kind, group.key_user(), "")
        return self._default.sensor_key(kind, identity)

    def quota_limit(self, key: SensorKey) -> float | None:
        group = self._by_key.get(key.user) if not key.client_id else None
        if group is not None:
            return group.limits.get(key.kind)
        return self._default.quota_limit(key)

    def matched_entity(self, key: SensorKey) -> QuotaEntity | None:
        if not key.client_id and key.user in self._by_key:
            return None
        return self._default.matched_entity(key)


# --------------------------------------------------------------------- partition-proportional


class _TopicRuleModel(BaseModel):
    model_config = _Strict

    user: str | None = None
    client_id: str | None = None
    topics: list[str]


class _ProportionalModel(BaseModel):
    model_config = _Strict

    topics: list[_TopicRuleModel] = []
    min_share: Annotated[float, Field(ge=0.0, le=1.0)] = 0.01


class PartitionProportionalCallback(_Base):
    """A client's quota on a broker is its total scaled by that broker's share of the leaders of
    its topics.

    The total is what Kafka's precedence gives for the caller's configured entities. The topics
    are given by rules (first match wins; fnmatch patterns; no match or no rules: every topic)::

        topics:
          - {client_id: orders-writer, topics: ["orders*"]}
          - {user: alice, topics: [payments]}
        min_share: 0.01      # floor, so a broker that leads none of the topics still answers

    On broker b: ``limit = total x max(min_share, led_b / led_all)`` where ``led_b`` counts the
    partitions of the matched topics led by b. Until Sluice has seen those topics in a Metadata
    response, and for the bootstrap listener (broker id None), the limit is the total.
    Per broker scope only: with ``quotas.scope: cluster`` there is no broker to scale for.
    """

    wants_cluster_metadata: ClassVar[bool] = True

    def __init__(self, broker_id: int | None = None, **config: Any) -> None:
        super().__init__(broker_id)
        model: _ProportionalModel = _parse(_ProportionalModel, config)
        self._rules = tuple((r.user, r.client_id, tuple(r.topics)) for r in model.topics)
        self._min_share = model.min_share
        self._cluster = ClusterView()
        self._shares: dict[tuple[str, ...] | None, float | None] = {}
        self.quota_kinds: frozenset[QuotaKind] = frozenset()  # the configured entries say which

    def sensor_key(self, kind: QuotaKind, identity: ClientIdentity) -> SensorKey:
        return self._default.sensor_key(kind, identity)

    def quota_limit(self, key: SensorKey) -> float | None:
        total = self._default.quota_limit(key)
        if total is None or self.broker_id is None:
            return total
        share = self.share(key.user, key.client_id)
        return total if share is None else total * max(self._min_share, share)

    def matched_entity(self, key: SensorKey) -> QuotaEntity | None:
        return self._default.matched_entity(key)

    def share(self, user: str, client_id: str) -> float | None:
        """This broker's share of the leaders of the caller's topics (None: not known yet)."""
        return self.share_for(self._patterns(user, client_id))

    def update_cluster_metadata(self, cluster: ClusterView) -> bool:
        if cluster == self._cluster:
            return False
        before = dict(self._shares)
        self._cluster = cluster
        self._shares = {}
        if self.broker_id is None:
            return False
        return any(self.share_for(patterns) != share for patterns, share in before.items()) or not before

    def share_for(self, patterns: tuple[str, ...] | None) -> float | None:
        if patterns in self._shares:
            return self._shares[patterns]
        if self.broker_id is None:
            return None
        names = list(self._cluster.topics) if patterns is None else [
            t for t in self._cluster.topics if any(fnmatch.fnmatchcase(t, p) for p in patterns)]
        share = self._cluster.leader_share(self.broker_id, names)
        self._shares[patterns] = share
        return share

    def _patterns(self, user: str, client_id: str) -> tuple[str, ...] | None:
        for rule_user, rule_client, topics in self._rules:
            if rule_user is not None and rule_user != user:
                continue
            if rule_client is not None and rule_client != client_id:
                continue
            return topics
        return None


# -------------------------------------------------------------------------------- fair shares


class _ShareModel(BaseModel):
    model_config = _Strict

    user: str | None = None
    client_id: str | None = None
    shares: Annotated[float, pydantic.Strict(), Field(gt=0)]


class _FairModel(BaseModel):
    model_config = _Strict

    capacity: _Limits
    shares: list[_ShareModel] = []
    default_shares: Annotated[float, Field(gt=0)] = 1.0
    active_ms: Annotated[int, Field(ge=1)] = 11_000


class FairShareCallback(_Base):
    """A declared capacity shared by the entities that use it, in proportion to their shares.

    Config::

        capacity: {producer_byte_rate: 2097152}
        shares:
          - {user: alice, shares: 1}
          - {client_id: batch-loader, shares: 3}
        default_shares: 1        # anyone else: one share, keyed by client id
        active_ms: 11000         # "active" = recorded within this long (default: 11 x 1 s window)

    Sharing groups: a caller matching a `shares` entry (first match) is keyed by that entry's user
    (``(user, "")``) or client id (``("", client_id)``); anyone else by client id with
    `default_shares`. Kinds without a capacity are left to Kafka's precedence.

    The algorithm is weighted max-min fairness (water-filling) with every active entity treated as
    backlogged: a throttled entity's measured rate is its limit, so the proxy cannot see demand
    above it. With weights ``w_i`` over the active set A, the water level is ``C / sum(w_A)`` and
    ``limit_i = C x w_i / sum(w_A)``: contending entities split C in proportion to their shares, an
    entity alone gets all of C, and an entity that goes quiet for `active_ms` leaves A, so the
    others' limits grow. An entity being looked up counts as active. The active set is kept in
    `on_record` (O(1) per record: an insertion-ordered dict, expired from the front), and
    `quota_reset_required` makes the manager re-read limits only when A changed. Not redistributed:
    the unused part of the share of an entity that is active but under its share (making it
    exact would need demand estimates from below the limit; a known, documented gap).
    """

    def __init__(self, broker_id: int | None = None, **config: Any) -> None:
        super().__init__(broker_id)
        model: _FairModel = _parse(_FairModel, config)
        self.capacity = model.capacity.values("quotas.callback.config.capacity")
        if not self.capacity:
            raise QuotaConfigError("quotas.callback.config.capacity",
                                   "needs at least one of " + ", ".join(k.value for k in QuotaKind))
        problems = [(f"quotas.callback.config.shares[{i}]", "needs a user or a client_id")
                    for i, s in enumerate(model.shares) if s.user is None and s.client_id is None]
        if problems:
            raise QuotaConfigError.of(problems)
        self._configured = tuple((s.user, s.client_id, s.shares) for s in model.shares)
        self._entries = self._configured
        self._default_shares = model.default_shares
        self._active_ms = model.active_ms
        self.quota_kinds = frozenset(self.capacity)
        # per kind: key -> last record time, ordered by it (oldest first)
        self._seen: dict[QuotaKind, dict[SensorKey, int]] = {k: {} for k in self.capacity}
        self._total: dict[QuotaKind, float] = dict.fromkeys(self.capacity, 0.0)
        self._changed: dict[QuotaKind, bool] = dict.fromkeys(QuotaKind, False)

    def sensor_key(self, kind: QuotaKind, identity: ClientIdentity) -> SensorKey:
        if kind not in self.capacity:
            return self._default.sensor_key(kind, identity)
        return self._match(kind, identity)[0]

    def _match(self, kind: QuotaKind, identity: ClientIdentity) -> tuple[SensorKey, float]:
        for user, client_id, shares in self._entries:
            if user is not None and user == identity.principal and (
                    client_id is None or client_id == identity.client_id):
                return SensorKey(kind, user, client_id or ""), shares
            if user is None and client_id == identity.client_id:
                return SensorKey(kind, "", identity.client_id), shares
        return SensorKey(kind, "", identity.client_id), self._default_shares

    def _weight(self, key: SensorKey) -> float:
        """The shares of a sharing group, from its key alone (no per-key state to grow)."""
        for user, client_id, shares in self._entries:
            if user is not None:
                if key.user == user and key.client_id == (client_id or ""):
                    return shares
            elif not key.user and key.client_id == client_id:
                return shares
        return self._default_shares

    def quota_limit(self, key: SensorKey) -> float | None:
        capacity = self.capacity.get(key.kind)
        if capacity is None:
            return self._default.quota_limit(key)
        weight = self._weight(key)
        seen = self._seen[key.kind]
        total = self._total[key.kind] + (0.0 if key in seen else weight)
        return capacity * weight / total

    def matched_entity(self, key: SensorKey) -> QuotaEntity | None:
        return None if key.kind in self.capacity else self._default.matched_entity(key)

    def on_record(self, key: SensorKey, value: float, now_ms: int) -> None:
        seen = self._seen.get(key.kind)
        if seen is None:
            return
        if key in seen:
            del seen[key]  # re-insert at the end: the dict stays ordered by last record
        else:
            self._total[key.kind] += self._weight(key)
            self._changed[key.kind] = True
        seen[key] = now_ms
        cutoff = now_ms - self._active_ms
        while True:
            oldest, at = next(iter(seen.items()))
            if at >= cutoff:
                break
            del seen[oldest]
            self._total[key.kind] -= self._weight(oldest)
            self._changed[key.kind] = True
        if not seen or math.isclose(self._total[key.kind], 0.0, abs_tol=1e-9):
            self._total[key.kind] = 0.0

    def quota_reset_required(self, kind: QuotaKind) -> bool:
        changed = self._changed[kind]
        if changed:
            self._changed[kind] = False
        return changed

    def update_shares(self, shares: Mapping[QuotaEntity, float]) -> None:
        """The store's ``sluice.shares`` (the quota-native draft's `shares` unit, set through the
        admin API): each entity's shares, first, before the configured `shares` entries (which it
        overrides for the same user and client id). Every active total is recounted and every
        limit re-read."""
        stored = tuple((None if e.user is None else str(e.user),
                        None if e.client_id is None else str(e.client_id), float(v))
                       for e, v in sorted(shares.items(), key=lambda item: item[0].describe()))
        mine = {(u, c) for u, c, _ in stored}
        self._entries = stored + tuple(x for x in self._configured if (x[0], x[1]) not in mine)
        for kind, seen in self._seen.items():
            self._total[kind] = math.fsum(self._weight(k) for k in seen)
            self._changed[kind] = True

    def active(self, kind: QuotaKind) -> frozenset[SensorKey]:
        return frozenset(self._seen.get(kind, ()))
