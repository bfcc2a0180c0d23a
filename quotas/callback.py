"""The KIP-257 seam (`ClientQuotaCallback`), Python-flavoured, and Kafka's default policy.

A callback decides two things: who shares a rate (`sensor_key`, Kafka's ``quotaMetricTags``) and
what the limit of a sharing group is (`quota_limit`, Kafka's ``quotaLimit``). The manager
tells it about configuration changes through `update_quota` / `remove_quota`, and polls
`quota_reset_required` on every sensor lookup so a callback whose limits change by themselves
(Strimzi's storage-based quotas, say) can make the manager re-read every limit.

A callback that sets the class attribute ``wants_cluster_metadata = True`` is told of every change
of the cluster as Sluice sees it (`update_cluster_metadata`, KIP-257's ``updateClusterMetadata``);
when it returns True every limit is re-read. The proxy decodes Metadata responses only while the
active callback wants them.

Loading by class path (the proxy's ``quotas.callback.class``): the class is called as
``cls(broker_id=<int or None>, **config)``, once per quota manager (one per broker, or one for all
brokers with ``quotas.scope: cluster``, where `broker_id` is None).

Optional extras the proxy looks for: ``quota_kinds`` (the kinds the callback may limit beyond the
configured entries; without it every kind is recorded), `EntityMatcher` (which entry applied, for
shadow entries and reporting) and `RecordObserver` (told of every record, for demand-driven
limits).
"""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

from quotas.cluster import ClusterView
from quotas.entity import DEFAULT, ClientIdentity, Name, QuotaEntity, QuotaKind, SensorKey


@runtime_checkable
class QuotaCallback(Protocol):
    def sensor_key(self, kind: QuotaKind, identity: ClientIdentity) -> SensorKey:
        """The sharing group of `identity` for `kind`; equal keys share one rate and one limit."""
        ...

    def quota_limit(self, key: SensorKey) -> float | None:
        """The bound of a sharing group, or `None` for unlimited."""
        ...

    def update_quota(self, entity: QuotaEntity, kind: QuotaKind, value: float) -> None:
        """A quota was set (or changed) for `entity`."""
        ...

    def remove_quota(self, entity: QuotaEntity, kind: QuotaKind) -> None:
        """The quota of `kind` for `entity` was removed."""
        ...

    def quota_reset_required(self, kind: QuotaKind) -> bool:
        """True when every limit of `kind` must be re-read (and every key recomputed).

        Polled before every sensor lookup: keep it O(1)."""
        ...

    def update_cluster_metadata(self, cluster: ClusterView) -> bool:
        """The cluster changed (topics, partitions, leaders). True if limits may have changed.

        Called only when the class sets ``wants_cluster_metadata = True``."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class RecordObserver(Protocol):
    """Optional extra for a callback that limits by demand (fair shares): told of every record.

    Called after the value is recorded, with the sharing group and the clock's time."""

    def on_record(self, key: SensorKey, value: float, now_ms: int) -> None: ...


@runtime_checkable
class EntityMatcher(Protocol):
    """Optional extra for a callback: which configured entity gave a sharing group its limit.

    The manager uses it to report `ThrottleDecision.entity` and to honour per-entry `shadow`.
    """

    def matched_entity(self, key: SensorKey) -> QuotaEntity | None: ...


# Kafka's quota-level bits (`ClientQuotaManager.QuotaTypes`), and Sluice's prefix levels (any
# prefix entity forces the full walk).
_CLIENT_ID_LEVEL = 1
_USER_LEVEL = 2
_USER_CLIENT_ID_LEVEL = 4
_PREFIX_LEVEL = 8

_Pair = tuple[Name | None, Name | None]


class DefaultQuotaCallback:
    """Kafka's built-in policy (`ClientQuotaManager.DefaultQuotaCallback`) and its precedence:

    ====  ==================================  ===========  ==================================
    #     configured entity                   sensor key   who shares one rate
    ====  ==================================  ===========  ==================================
    1     /users/<u>/clients/<c>              (u, c)       user u with client id c
    1p    /users/<u>/client-prefix/<p>        (u, p*)      u's client ids starting with p
    2     /users/<u>/clients/<default>        (u, c)       each client id of u separately
    3     /users/<u>                          (u, "")      every client id of u together
    4     /users/<default>/clients/<c>        (u, c)       per (user, client id)
    4p    /users/<default>/client-prefix/<p>  (u, p*)      per user, its client ids starting with p
    5     /users/<default>/clients/<default>  (u, c)       per (user, client id)
    6     /users/<default>                    (u, "")      per user
    7     /clients/<c>                        ("", c)      every user with client id c
    7p    /client-prefix/<p>                  ("", p*)     every client id starting with p
    8     /clients/<default>                  ("", c)      per client id
    ====  ==================================  ===========  ==================================

    The ``p`` levels are Sluice's (Redpanda's ``client_id_prefix``): at each, the longest matching
    prefix wins; ``p*`` is a key with `SensorKey.client_id_prefix` set, shared by every matching
    client id, or with `QuotaEntity.each_client_id` the plain (u, c) / ("", c) key, one sensor per
    client id. An exact client id (levels 1, 4, 7) beats any prefix at the same user level; a
    prefix beats ``<default>`` client ids. Topic entities are not client quotas: this callback
    ignores them (`TopicQuotaCallback` enforces them beside it).

    `sensor_key` walks levels 1 to 6 by *existence* of an entity with a quota of that kind, and
    falls back to ("", c). `quota_limit` maps the key back: both tags set tries (u,c), (u,default),
    (default,c), (default,default); user only tries (u), (default user); client only tries (c),
    (default client); neither is unlimited. So an empty client id escapes client-id quotas, and a
    (u, <default>) quota does not apply to it: it gets key (u, "") and the user-level limit.

    Like Kafka it short-cuts the walk while only one level of entities has been configured for a
    kind: client-id level gives ("", c), user level (u, ""), user+client-id level (u, c). With
    `sticky_levels` (Kafka up to 4.0) a level once configured stays "in use" until restart; without
    (Kafka 4.1+, KAFKA-19282) a level is in use while an entity of that level has a quota. The
    limits are the same either way; only the keys of unlimited callers differ.
    """

    __slots__ = ("_level_counts", "_levels", "_levels_ever", "_prefixes", "_quotas", "_sticky")

    wants_cluster_metadata: ClassVar[bool] = False

    def __init__(self, *, sticky_levels: bool = True, broker_id: int | None = None) -> None:
        self._sticky = sticky_levels
        self._quotas: dict[QuotaKind, dict[_Pair, tuple[float, QuotaEntity]]] = {k: {} for k in QuotaKind}
        # prefix entities per kind: user component (a name, DEFAULT or None) -> [(prefix, value,
        # entity)], longest prefix first
        self._prefixes: dict[QuotaKind, dict[Name | None, list[tuple[str, float, QuotaEntity]]]] = {
            k: {} for k in QuotaKind}
        self._levels_ever: dict[QuotaKind, int] = dict.fromkeys(QuotaKind, 0)
        self._levels: dict[QuotaKind, int] = dict.fromkeys(QuotaKind, 0)
        self._level_counts: dict[tuple[QuotaKind, int], int] = {}

    # -- KIP-257 -------------------------------------------------------------------------------

    def sensor_key(self, kind: QuotaKind, identity: ClientIdentity) -> SensorKey:
        user = identity.principal
        client_id = identity.client_id
        levels = self._levels[kind]
        if levels == 0 or levels == _CLIENT_ID_LEVEL:
            return SensorKey(kind, "", client_id)
        if levels == _USER_LEVEL:
            return SensorKey(kind, user, "")
        if levels == _USER_CLIENT_ID_LEVEL:
            return SensorKey(kind, user, client_id)
        quotas = self._quotas[kind]
        prefixes = self._prefixes[kind]
        if (user, client_id) in quotas:  # level 1
            return SensorKey(kind, user, client_id)
        if prefixes and (found := _longest(prefixes.get(user), client_id)) is not None:  # level 1p
            return _prefix_key(kind, user, client_id, found)
        if (user, DEFAULT) in quotas:  # level 2
            return SensorKey(kind, user, client_id)
        if (user, None) in quotas:  # level 3
            return SensorKey(kind, user, "")
        if (DEFAULT, client_id) in quotas:  # level 4
            return SensorKey(kind, user, client_id)
        if prefixes and (found := _longest(prefixes.get(DEFAULT), client_id)) is not None:  # level 4p
            return _prefix_key(kind, user, client_id, found)
        if (DEFAULT, DEFAULT) in quotas:  # level 5
            return SensorKey(kind, user, client_id)
        if (DEFAULT, None) in quotas:  # level 6
            return SensorKey(kind, user, "")
        if (prefixes and (found := _longest(prefixes.get(None), client_id)) is not None
                and (None, client_id) not in quotas):  # level 7p (level 7 beats it)
            return _prefix_key(kind, "", client_id, found)
        return SensorKey(kind, "", client_id)  # levels 7, 8 (or nothing)

    def quota_limit(self, key: SensorKey) -> float | None:
        found = self._find(key)
        return None if found is None else found[0]

    def update_quota(self, entity: QuotaEntity, kind: QuotaKind, value: float) -> None:
        if entity.is_topic:
            return
        if entity.client_id_prefix is not None:
            listed = self._prefixes[kind].setdefault(entity.user, [])
            kept = [item for item in listed if item[0] != entity.client_id_prefix]
            if len(kept) == len(listed):
                self._count_level(kind, entity, +1)
            kept.append((entity.client_id_prefix, value, entity))
            kept.sort(key=lambda item: -len(item[0]))
            self._prefixes[kind][entity.user] = kept
            return
        quotas = self._quotas[kind]
        pair = (entity.user, entity.client_id)
        if pair not in quotas:
            self._count_level(kind, entity, +1)
        quotas[pair] = (value, entity)

    def remove_quota(self, entity: QuotaEntity, kind: QuotaKind) -> None:
        if entity.is_topic:
            return
        if entity.client_id_prefix is not None:
            prefixes = self._prefixes[kind]
            listed = prefixes.get(entity.user, [])
            kept = [item for item in listed if item[0] != entity.client_id_prefix]
            if len(kept) != len(listed):
                self._count_level(kind, entity, -1)
                if kept:
                    prefixes[entity.user] = kept
                else:
                    del prefixes[entity.user]
            return
        if self._quotas[kind].pop((entity.user, entity.client_id), None) is not None:
            self._count_level(kind, entity, -1)

    def quota_reset_required(self, kind: QuotaKind) -> bool:
        return False

    def update_cluster_metadata(self, cluster: ClusterView) -> bool:
        return False

    def close(self) -> None:
        pass

    # -- extras ------------------------------------------------------------------------------

    def matched_entity(self, key: SensorKey) -> QuotaEntity | None:
        """The configured entity whose value `quota_limit(key)` returns, or `None`."""
        found = self._find(key)
        return None if found is None else found[1]

    def quotas_enabled(self, kind: QuotaKind) -> bool:
        """Kafka's ``quotasEnabled``: nothing is recorded for a kind until this is true."""
        return self._levels[kind] != 0

    def _find(self, key: SensorKey) -> tuple[float, QuotaEntity] | None:
        quotas = self._quotas[key.kind]
        prefixes = self._prefixes[key.kind]
        if not quotas and not prefixes:
            return None
        user = key.user
        client_id = key.client_id
        if key.client_id_prefix:  # a shared prefix: (u, p) then (<default>, p), or (p)
            owners: tuple[Name | None, ...] = (user, DEFAULT) if user else (None,)
            for owner in owners:
                for prefix, value, entity in prefixes.get(owner, ()):
                    if prefix == key.client_id_prefix:
                        return value, entity
            return None
        if user and client_id:
            candidates: tuple[_Pair | tuple[Name | None, None, str], ...] = (
                (user, client_id), (user, None, client_id), (user, DEFAULT),
                (DEFAULT, client_id), (DEFAULT, None, client_id), (DEFAULT, DEFAULT))
        elif user:
            candidates = ((user, None), (DEFAULT, None))
        elif client_id:
            candidates = ((None, client_id), (None, None, client_id), (None, DEFAULT))
        else:
            return None
        for candidate in candidates:
            if len(candidate) == 3:  # a prefix level: the longest prefix of this owner
                if prefixes:
                    found_prefix = _longest(prefixes.get(candidate[0]), client_id)
                    if found_prefix is not None:
                        return found_prefix[1], found_prefix[2]
                continue
            found = quotas.get((candidate[0], candidate[1]))
            if found is not None:
                return found
        return None

    def _count_level(self, kind: QuotaKind, entity: QuotaEntity, delta: int) -> None:
        if entity.client_id_prefix is not None:
            level = _PREFIX_LEVEL
        elif entity.user is not None and entity.client_id is not None:
            level = _USER_CLIENT_ID_LEVEL
        elif entity.user is not None:
            level = _USER_LEVEL
        else:
            level = _CLIENT_ID_LEVEL
        count = self._level_counts.get((kind, level), 0) + delta
        self._level_counts[(kind, level)] = count
        current = 0
        for bit in (_CLIENT_ID_LEVEL, _USER_LEVEL, _USER_CLIENT_ID_LEVEL, _PREFIX_LEVEL):
            if self._level_counts.get((kind, bit), 0) > 0:
                current |= bit
        self._levels_ever[kind] |= current
        self._levels[kind] = self._levels_ever[kind] if self._sticky else current


def _longest(listed: list[tuple[str, float, QuotaEntity]] | None,
             client_id: str) -> tuple[str, float, QuotaEntity] | None:
    """The longest prefix of `client_id` among `listed` (kept longest first)."""
    if listed:
        for item in listed:
            if client_id.startswith(item[0]):
                return item
    return None


def _prefix_key(kind: QuotaKind, user: str, client_id: str,
                found: tuple[str, float, QuotaEntity]) -> SensorKey:
    if found[2].each_client_id:
        return SensorKey(kind, user, client_id)
    return SensorKey(kind, user, "", client_id_prefix=found[0])


class TopicQuotaCallback:
    """Topic and topic-prefix entries: what every client together may move to or from a topic.

    A topic manager is a `QuotaManager` with this callback, asked per topic of a request with
    `topic_identity(topic)` (the topic rides in the identity's client id). An exact topic entry
    beats a topic prefix; among prefixes the longest wins. An exact topic gets its own sensor
    (``SensorKey.topic``); all topics of a prefix share one (``SensorKey.topic_prefix``). Client
    entities are ignored: the default callback enforces them, beside this one, and a request is
    throttled by the larger of the two.
    """

    wants_cluster_metadata: ClassVar[bool] = False

    def __init__(self, *, broker_id: int | None = None) -> None:
        self._topics: dict[QuotaKind, dict[str, tuple[float, QuotaEntity]]] = {k: {} for k in QuotaKind}
        self._prefixes: dict[QuotaKind, list[tuple[str, float, QuotaEntity]]] = {k: [] for k in QuotaKind}

    @property
    def quota_kinds(self) -> frozenset[QuotaKind]:
        return frozenset(k for k in QuotaKind if self._topics[k] or self._prefixes[k])

    def sensor_key(self, kind: QuotaKind, identity: ClientIdentity) -> SensorKey:
        topic = identity.client_id
        if topic in self._topics[kind]:
            return SensorKey(kind, "", "", topic=topic)
        found = _longest(self._prefixes[kind], topic)
        if found is not None:
            return SensorKey(kind, "", "", topic_prefix=found[0])
        return SensorKey(kind, "", "", topic=topic)

    def quota_limit(self, key: SensorKey) -> float | None:
        found = self._find(key)
        return None if found is None else found[0]

    def matched_entity(self, key: SensorKey) -> QuotaEntity | None:
        found = self._find(key)
        return None if found is None else found[1]

    def update_quota(self, entity: QuotaEntity, kind: QuotaKind, value: float) -> None:
        if entity.topic is not None:
            self._topics[kind][entity.topic] = (value, entity)
        elif entity.topic_prefix is not None:
            kept = [item for item in self._prefixes[kind] if item[0] != entity.topic_prefix]
            kept.append((entity.topic_prefix, value, entity))
            kept.sort(key=lambda item: -len(item[0]))
            self._prefixes[kind] = kept

    def remove_quota(self, entity: QuotaEntity, kind: QuotaKind) -> None:
        if entity.topic is not None:
            self._topics[kind].pop(entity.topic, None)
        elif entity.topic_prefix is not None:
            self._prefixes[kind] = [item for item in self._prefixes[kind] if item[0] != entity.topic_prefix]

    def quota_reset_required(self, kind: QuotaKind) -> bool:
        return False

    def update_cluster_metadata(self, cluster: ClusterView) -> bool:
        return False

    def close(self) -> None:
        pass

    def _find(self, key: SensorKey) -> tuple[float, QuotaEntity] | None:
        if key.topic:
            return self._topics[key.kind].get(key.topic)
        if key.topic_prefix:
            for prefix, value, entity in self._prefixes[key.kind]:
                if prefix == key.topic_prefix:
                    return value, entity
        return None


def topic_identity(topic: str) -> ClientIdentity:
    """The identity a topic manager (`TopicQuotaCallback`) is asked with for `topic`."""
    return ClientIdentity("", topic)
