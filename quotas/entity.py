"""Who a quota applies to, who is asking, and which sensor a request is counted in.

* `QuotaEntity` is a *configured* entity, Kafka's {user}, {client-id} or {user, client-id} shapes,
  where each named component may be `DEFAULT` (Kafka's ``<default>``, a null name on the wire).
* `ClientIdentity` is the *caller*: principal name and client id, as the proxy saw them.
* `SensorKey` is the resolved sharing group (Kafka's quota metric tags): every request with the
  same key is counted in one rate and shares one limit.
"""

from __future__ import annotations

import enum
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from quotas.errors import QuotaConfigError


class QuotaKind(enum.Enum):
    """A quota type, valued by its Kafka config key."""

    PRODUCE = "producer_byte_rate"
    FETCH = "consumer_byte_rate"
    REQUEST_PERCENTAGE = "request_percentage"
    REQUEST_RATE = "request_rate"
    """Sluice's own requests-per-second quota; Kafka has no such key."""

    # Members are singletons compared by identity; the C-level identity hash keeps dict lookups
    # keyed by kind off the (Python-level) Enum.__hash__ on the hot path.
    __hash__ = object.__hash__

    @property
    def is_byte_rate(self) -> bool:
        """Byte rates are Kafka LONG configs (whole numbers) and their throttle is uncapped."""
        return self is QuotaKind.PRODUCE or self is QuotaKind.FETCH

    @property
    def caps_throttle(self) -> bool:
        """Request quotas cap the throttle at one window (`ClientRequestQuotaManager`)."""
        return not self.is_byte_rate


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

    Valid shapes are {user}, {client-id} and {user, client-id}; names must not be empty.
    """

    user: Name | None = None
    client_id: Name | None = None

    def __post_init__(self) -> None:
        if self.user is None and self.client_id is None:
            raise QuotaConfigError("", "an entity needs a user, a client_id or both")
        for key, value in (("user", self.user), ("client_id", self.client_id)):
            if value is None or value is DEFAULT:
                continue
            if not isinstance(value, str):
                raise QuotaConfigError(key, f"must be a string or <default>, got {value!r}")
            if not value:
                raise QuotaConfigError(key, 'must not be empty (write "<default>" for the default entity)')

    def describe(self) -> str:
        """A human form: ``user 'alice', client-id <default>``."""
        parts = []
        if self.user is not None:
            parts.append(f"user {_describe_name(self.user)}")
        if self.client_id is not None:
            parts.append(f"client-id {_describe_name(self.client_id)}")
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
        return out

    @classmethod
    def from_kafka(cls, components: Iterable[tuple[str, str | None]]) -> QuotaEntity:
        """Build from Kafka's ``[(entity_type, entity_name)]``; a ``None`` name is the default.

        Raises `QuotaConfigError` for what Kafka rejects with INVALID_REQUEST: unknown or repeated
        entity types, empty names, and ``ip`` (connection quotas are not client quotas).
        """
        names: dict[str, Name] = {}
        for entity_type, name in components:
            if entity_type not in (USER, CLIENT_ID):
                raise QuotaConfigError("entity_type", f"unsupported entity type {entity_type!r}")
            if entity_type in names:
                raise QuotaConfigError("entity_type", f"entity type {entity_type!r} given twice")
            names[entity_type] = DEFAULT if name is None else name
        return cls(user=names.get(USER), client_id=names.get(CLIENT_ID))


@dataclass(frozen=True, slots=True)
class SensorKey:
    """A sharing group: Kafka's quota metric tags plus the quota kind.

    ``""`` means the tag is not used: ``SensorKey(PRODUCE, "alice", "")`` is all of alice's
    client ids together, ``SensorKey(PRODUCE, "", "app")`` is client id ``app`` of every user.
    `user` is the principal name as given (Kafka's JMX tags hold `sanitize_user(user)`).
    """

    kind: QuotaKind
    user: str
    client_id: str


def sanitize_user(name: str) -> str:
    """Kafka's `Sanitizer.sanitize`: URL-encode as Java's `URLEncoder`, then ``+`` -> ``%20``,
    ``*`` -> ``%2A``. Letters, digits, ``.``, ``-`` and ``_`` stay as they are."""
    return urllib.parse.quote(name, safe="").replace("~", "%7E")


def _describe_name(name: Name) -> str:
    return "<default>" if name is DEFAULT else f"'{name}'"
