"""Who a quota applies to, who is asking, and which sensor a request is counted in.

* `QuotaEntity` is a *configured* entity, Kafka's {user}, {client-id} or {user, client-id} shapes,
  where each named component may be `DEFAULT` (Kafka's ``<default>``, a null name on the wire);
  Sluice adds {client-id-prefix} and {user, client-id-prefix} (Redpanda's prefix entities) and the
  topic entities {topic} and {topic-prefix}, which apply to every client beside its own quota.
* `ClientIdentity` is the *caller*: principal name and client id, as the proxy saw them.
* `SensorKey` is the resolved sharing group (Kafka's quota metric tags): every request with the
  same key is counted in one rate and shares one limit.
"""

from __future__ import annotations

import enum
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from quotas.errors import QuotaConfigError


class QuotaKind(enum.Enum):
    """A quota type, valued by its Kafka config key."""

    PRODUCE = "producer_byte_rate"
    FETCH = "consumer_byte_rate"
    REQUEST_PERCENTAGE = "request_percentage"
    REQUEST_RATE = "request_rate"
    """Sluice's own requests-per-second quota; Kafka has no such key."""
    PRODUCER_RECORD_RATE = "producer_record_rate"
    """Sluice's own: records produced per second (counted from the record batch headers)."""
    CONSUMER_RECORD_RATE = "consumer_record_rate"
    """Sluice's own: records fetched per second (counted from the record batch headers)."""

    # Members are singletons compared by identity; the C-level identity hash keeps dict lookups
    # keyed by kind off the (Python-level) Enum.__hash__ on the hot path.
    __hash__ = object.__hash__

    @property
    def is_byte_rate(self) -> bool:
        """Byte rates are Kafka LONG configs (whole numbers) and their throttle is uncapped."""
        return self is QuotaKind.PRODUCE or self is QuotaKind.FETCH

    @property
    def caps_throttle(self) -> bool:
        """Request quotas cap the throttle at one window (`ClientRequestQuotaManager`); byte and
        record rates are uncapped (`ClientQuotaManager`)."""
        return self is QuotaKind.REQUEST_RATE or self is QuotaKind.REQUEST_PERCENTAGE

    @property
    def topic_attributable(self) -> bool:
        """Kinds a topic entry may limit: bytes and requests (records too), counted per topic."""
        return self is not QuotaKind.REQUEST_PERCENTAGE


class Default(enum.Enum):
    """The type of `DEFAULT`, Kafka's ``<default>`` entity name."""

    DEFAULT = "<default>"

    def __repr__(self) -> str:
        return "DEFAULT"

    def __str__(self) -> str:
        return "<default>"


DEFAULT: Final = Default.DEFAULT

UNAUTHENTICATED_PRINCIPAL: Final = "ANONYMOUS"

USER: Final = "user"
CLIENT_ID: Final = "client-id"
CLIENT_ID_PREFIX: Final = "client-id-prefix"
TOPIC: Final = "topic"
TOPIC_PREFIX: Final = "topic-prefix"

Name = str | Default
"""An entity component name: a real name, or `DEFAULT`."""


@dataclass(frozen=True, slots=True)
class ClientIdentity:
    """The caller as Kafka sees it: principal name (``ANONYMOUS`` when unauthenticated) and the
    request header's client id (``""`` when null)."""

    principal: str
    client_id: str

    @classmethod
    def of(cls, principal: str | None, client_id: str | None) -> ClientIdentity:
        """Map the wire's nulls: no principal is ``ANONYMOUS``, a null client id is ``""``."""
        return cls(UNAUTHENTICATED_PRINCIPAL if principal is None else principal,
                   "" if client_id is None else client_id)


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """A configured quota entity. `None` means the component is absent; `DEFAULT` is ``<default>``.

    Valid shapes are Kafka's {user}, {client-id} and {user, client-id}, and Sluice's
    {client-id-prefix}, {user, client-id-prefix}, {topic} and {topic-prefix}; names must not be
    empty, prefixes and topics are never `DEFAULT`. `each_client_id` (prefix entities only) gives
    every client id of the prefix its own sensor instead of one shared by all; it is a setting of
    the entity, not part of its identity (equality and hashing ignore it).
    """

    user: Name | None = None
    client_id: Name | None = None
    client_id_prefix: str | None = None
    topic: str | None = None
    topic_prefix: str | None = None
    each_client_id: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        for key, value in (("user", self.user), ("client_id", self.client_id)):
            if value is None or value is DEFAULT:
                continue
            if not isinstance(value, str):
                raise QuotaConfigError(key, f"must be a string or <default>, got {value!r}")
            if not value:
                raise QuotaConfigError(key, 'must not be empty (write "<default>" for the default entity)')
        for key, value in (("client_id_prefix", self.client_id_prefix), ("topic", self.topic),
                           ("topic_prefix", self.topic_prefix)):
            if value is None:
                continue
            if not isinstance(value, str):
                raise QuotaConfigError(key, f"must be a string, got {value!r}")
            if not value:
                raise QuotaConfigError(key, "must not be empty")
        if self.topic is not None and self.topic_prefix is not None:
            raise QuotaConfigError("topic_prefix", "an entry names a topic or a topic_prefix, not both")
        if self.is_topic and (self.user is not None or self.client_id is not None
                              or self.client_id_prefix is not None):
            raise QuotaConfigError("topic" if self.topic is not None else "topic_prefix",
                                   "a topic entry applies to every client: it cannot also name a user, "
                                   "client_id or client_id_prefix")
        if self.client_id_prefix is not None and self.client_id is not None:
            raise QuotaConfigError("client_id_prefix", "an entry names a client_id or a client_id_prefix, "
                                                       "not both")
        if self.each_client_id and self.client_id_prefix is None:
            raise QuotaConfigError("each_client_id", "applies only to a client_id_prefix entry")
        if (self.user is None and self.client_id is None and self.client_id_prefix is None
                and not self.is_topic):
            raise QuotaConfigError("", "an entity needs a user, a client_id, a client_id_prefix, a topic "
                                       "or a topic_prefix")

    @property
    def is_topic(self) -> bool:
        """A topic or topic-prefix entity: it limits what every client moves to or from its topics."""
        return self.topic is not None or self.topic_prefix is not None

    def describe(self) -> str:
        """A human form: ``user 'alice', client-id <default>``."""
        parts = []
        if self.user is not None:
            parts.append(f"user {_describe_name(self.user)}")
        if self.client_id is not None:
            parts.append(f"client-id {_describe_name(self.client_id)}")
        if self.client_id_prefix is not None:
            each = " (each client-id)" if self.each_client_id else ""
            parts.append(f"client-id-prefix '{self.client_id_prefix}'{each}")
        if self.topic is not None:
            parts.append(f"topic '{self.topic}'")
        if self.topic_prefix is not None:
            parts.append(f"topic-prefix '{self.topic_prefix}'")
        return ", ".join(parts)

    def __str__(self) -> str:
        return self.describe()

    def to_kafka(self) -> list[tuple[str, str | None]]:
        """Kafka's entity list (DescribeClientQuotas/AlterClientQuotas): ``None`` name = default."""
        out: list[tuple[str, str | None]] = []
        if self.user is not None:
            out.append((USER, None if self.user is DEFAULT else self.user))
        if self.client_id is not None:
            out.append((CLIENT_ID, None if self.client_id is DEFAULT else self.client_id))
        for entity_type, name in ((CLIENT_ID_PREFIX, self.client_id_prefix), (TOPIC, self.topic),
                                  (TOPIC_PREFIX, self.topic_prefix)):
            if name is not None:
                out.append((entity_type, name))
        return out

    @classmethod
    def from_kafka(cls, components: Iterable[tuple[str, str | None]]) -> QuotaEntity:
        """Build from Kafka's ``[(entity_type, entity_name)]``; a ``None`` name is the default.

        Raises `QuotaConfigError` for what Kafka rejects with INVALID_REQUEST: unknown or repeated
        entity types, empty names, and ``ip`` (connection quotas are not client quotas); and for
        Sluice's own types, a default (null) name or a shape `QuotaEntity` refuses.
        """
        names: dict[str, Name] = {}
        for entity_type, name in components:
            if entity_type not in ENTITY_TYPES:
                raise QuotaConfigError("entity_type", f"unsupported entity type {entity_type!r}")
            if entity_type in names:
                raise QuotaConfigError("entity_type", f"entity type {entity_type!r} given twice")
            if name is None and entity_type not in (USER, CLIENT_ID):
                raise QuotaConfigError("entity_type", f"entity type {entity_type!r} has no default entity")
            names[entity_type] = DEFAULT if name is None else name
        return cls(user=names.get(USER), client_id=names.get(CLIENT_ID),
                   client_id_prefix=_plain(names.get(CLIENT_ID_PREFIX)), topic=_plain(names.get(TOPIC)),
                   topic_prefix=_plain(names.get(TOPIC_PREFIX)))


@dataclass(frozen=True, slots=True)
class SensorKey:
    """A sharing group: Kafka's quota metric tags plus the quota kind.

    ``""`` means the tag is not used: ``SensorKey(PRODUCE, "alice", "")`` is all of alice's
    client ids together, ``SensorKey(PRODUCE, "", "app")`` is client id ``app`` of every user.
    `user` is the principal name as given (Kafka's JMX tags hold `sanitize_user(user)`).
    Sluice's tags: `client_id_prefix` (every client id of a shared prefix entry together),
    `topic` (one topic) and `topic_prefix` (every topic of a topic-prefix entry together).

    `tags`: any other tags a callback groups by (KIP-257's ``quotaMetricTags`` returns any map),
    as sorted ``(name, value)`` pairs; `from_tags` builds a key from such a map. Two keys with
    different tags are different budgets; the fleet, the metrics (a ``tags`` label) and
    ``describe --effective`` carry them.
    """

    kind: QuotaKind
    user: str
    client_id: str
    client_id_prefix: str = ""
    topic: str = ""
    topic_prefix: str = ""
    tags: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_tags(cls, kind: QuotaKind, tags: Mapping[str, str]) -> SensorKey:
        """The key of KIP-257's tag map: Kafka's ``user`` and ``client-id`` and Sluice's
        ``client-id-prefix``, ``topic`` and ``topic-prefix`` go to their fields, every other tag
        (with a non-empty value) to `tags`."""
        known = {name: tags.get(name, "") for name in _KNOWN_TAGS}
        extra = tuple(sorted((str(k), str(v)) for k, v in tags.items() if k not in _KNOWN_TAGS and v != ""))
        return cls(kind, known[USER], known[CLIENT_ID], known[CLIENT_ID_PREFIX], known[TOPIC],
                   known[TOPIC_PREFIX], extra)

    @property
    def tag_map(self) -> dict[str, str]:
        """Every tag of this key with a value, by its KIP-257 name (the inverse of `from_tags`)."""
        out = {name: value for name, value in ((USER, self.user), (CLIENT_ID, self.client_id),
                                               (CLIENT_ID_PREFIX, self.client_id_prefix),
                                               (TOPIC, self.topic), (TOPIC_PREFIX, self.topic_prefix))
               if value}
        out.update(self.tags)
        return out

    @property
    def tags_label(self) -> str:
        """The callback's own tags as one label value, ``name=value,...`` (``""`` when none)."""
        return ",".join(f"{k}={v}" for k, v in self.tags)


_KNOWN_TAGS: Final = (USER, CLIENT_ID, CLIENT_ID_PREFIX, TOPIC, TOPIC_PREFIX)


def sanitize_user(name: str) -> str:
    """Kafka's `Sanitizer.sanitize`: URL-encode as Java's `URLEncoder`, then ``+`` -> ``%20``,
    ``*`` -> ``%2A``. Letters, digits, ``.``, ``-`` and ``_`` stay as they are."""
    return urllib.parse.quote(name, safe="").replace("~", "%7E")


ENTITY_TYPES: Final = frozenset({USER, CLIENT_ID, CLIENT_ID_PREFIX, TOPIC, TOPIC_PREFIX})
"""The entity types of the admin APIs Sluice answers: Kafka's two and Sluice's three."""


def _plain(name: Name | None) -> str | None:
    return None if name is None else str(name)


def _describe_name(name: Name) -> str:
    return "<default>" if name is DEFAULT else f"'{name}'"
