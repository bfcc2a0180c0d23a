"""Sluice answers DescribeClientQuotas (48) and AlterClientQuotas (49) itself, from its store.

Operators manage Sluice's quotas with the tools they already use (`kafka-configs --bootstrap-server
<sluice>`, any admin client); the brokers' own quotas are never touched, which is the point in
front of a managed Kafka. The answers follow the broker's code (`ClientQuotasImage.describe`,
`ClientQuotaControlManager`), with its error codes and messages:

Describe (top-level error, no entries):
  * INVALID_REQUEST (42): an empty or repeated entity type, a match type and match string that do
    not go together, an unknown match type, ``ip`` with user/client-id;
  * UNSUPPORTED_VERSION (35): an entity type other than user, client-id, ip.
  Match types: 0 exact name, 1 the default entity, 2 any name including the default; `strict`
  keeps only entities with exactly the filter's types.

Alter (an error per entity; an entity with an error changes nothing, the others apply):
  * CLUSTER_AUTHORIZATION_FAILED (31) for every entity unless the caller's principal is in
    `admins` (Kafka asks for ALTER_CONFIGS on the cluster);
  * INVALID_REQUEST (42): an empty entity, an unknown or repeated entity type, an empty name, ip
    combined with user/client-id, a repeated key or entity, an unknown key, a value <= 0, a
    fractional or too large byte rate.
  Sluice's differences: keys are Kafka's plus ``request_rate`` and ``sluice.shadow`` (=1);
  ``controller_mutation_rate`` and ip entities (connection quotas) are refused, since Sluice does
  not enforce them; a repeated entity or key changes nothing (a broker applies its first copy).
  `validate_only` checks and writes nothing. A batch is written to the store in one go; the store
  failing gives UNKNOWN_SERVER_ERROR (-1) for the entities that were to change.

A request Sluice cannot decode closes the connection, as a broker does.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from kio.schema.errors import ErrorCode
from kio.static.primitive import f64, i32Timedelta

from protocol.apis import ApiKey, api_name, response_header_version
from protocol.encode import decode_request_body, encode_response, response_schema
from protocol.errors import ProtocolError
from protocol.headers import RequestHeader
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import AnswerHere, AnswerLater, Close, ConnectionContext, RequestOutcome, StageBase
from quotas.entity import CLIENT_ID, CLIENT_ID_PREFIX, TOPIC, TOPIC_PREFIX, USER, QuotaEntity
from quotas.errors import QuotaConfigError
from quotas.table import QuotaChange, QuotaTable, format_value, validate_key_value

log = logging.getLogger("sluice.quota_admin")

IP = "ip"
ENTITY_TYPES = (USER, CLIENT_ID, IP, CLIENT_ID_PREFIX, TOPIC, TOPIC_PREFIX)  # the last three: Sluice's
MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY = 0, 1, 2

# the error codes these APIs answer with, by Kafka's names (kio's values)
INVALID_REQUEST: Final = ErrorCode.invalid_request
UNSUPPORTED_VERSION: Final = ErrorCode.unsupported_version
CLUSTER_AUTHORIZATION_FAILED: Final = ErrorCode.cluster_authorization_failed
UNKNOWN_SERVER_ERROR: Final = ErrorCode.unknown_server_error

_NOT_ENFORCED = {"controller_mutation_rate": "the brokers' controller mutation quota",
                 "connection_creation_rate": "the brokers' connection rate quota"}
_ZERO = i32Timedelta.parse(datetime.timedelta(0))


class AdminError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


Components = Sequence[tuple[str, str | None]]


# ------------------------------------------------------------------------------ describe

@dataclass(frozen=True)
class QuotaFilter:
    exact: Mapping[str, str | None]    # type -> name (None: the default entity)
    any_name: frozenset[str]           # types that must be present, any name
    strict: bool


def parse_filter(components: Iterable[tuple[str, int, str | None]], strict: bool) -> QuotaFilter:
    """Kafka's checks of DescribeClientQuotas components, in its order; raises AdminError."""
    exact: dict[str, str | None] = {}
    any_name: set[str] = set()
    for entity_type, match_type, match in components:
        if not entity_type:
            raise AdminError(INVALID_REQUEST, "Invalid empty entity type.")
        if entity_type in exact or entity_type in any_name:
            raise AdminError(INVALID_REQUEST, f"Entity type {entity_type} cannot appear more than once in "
                                              f"the filter.")
        if entity_type not in ENTITY_TYPES:
            raise AdminError(UNSUPPORTED_VERSION, f"Unsupported entity type {entity_type}")
        if match_type == MATCH_EXACT:
            if match is None:
                raise AdminError(INVALID_REQUEST, "Request specified MATCH_TYPE_EXACT, but set match string "
                                                  "to null.")
            exact[entity_type] = match
        elif match_type == MATCH_DEFAULT:
            if match is not None:
                raise AdminError(INVALID_REQUEST, "Request specified MATCH_TYPE_DEFAULT, but also specified "
                                                  "a match string.")
            exact[entity_type] = None
        elif match_type == MATCH_ANY:
            if match is not None:
                raise AdminError(INVALID_REQUEST, "Request specified MATCH_TYPE_SPECIFIED, but also "
                                                  "specified a match string.")
            any_name.add(entity_type)
        else:
            raise AdminError(INVALID_REQUEST, f"Unknown match type {match_type}")
    types = set(exact) | any_name
    if IP in types and types & {USER, CLIENT_ID}:
        raise AdminError(INVALID_REQUEST, "Invalid entity filter component combination. IP filter component "
                                          "should not be used with user or clientId filter component.")
    return QuotaFilter(exact, frozenset(any_name), strict)


def matches(entity: QuotaEntity, flt: QuotaFilter) -> bool:
    parts = dict(entity.to_kafka())
    if flt.strict and len(parts) != len(flt.exact) + len(flt.any_name):
        return False
    if not flt.exact and not flt.any_name:
        return not flt.strict  # an empty filter: everything, or nothing when strict
    for entity_type, name in flt.exact.items():
        if entity_type not in parts or parts[entity_type] != name:
            return False
    return all(t in parts for t in flt.any_name)


def describe(table: QuotaTable, flt: QuotaFilter) -> list[tuple[QuotaEntity, Mapping[str, float]]]:
    return [(entity, values) for entity, values in table.sorted_items() if matches(entity, flt)]


# ------------------------------------------------------------------------------ alter

@dataclass
class AlterResult:
    """One entity's outcome: an error, or the changes to make."""

    components: Components
    error_code: ErrorCode = ErrorCode.none
    error_message: str | None = None
    entity: QuotaEntity | None = None
    changes: list[QuotaChange] = field(default_factory=list)


def kafka_entity_string(components: Components) -> str:
    """Java's ``ClientQuotaEntity.toString``: ``ClientQuotaEntity(entries={client-id=app, user=alice})``."""
    inner = ", ".join(f"{t}={'null' if n is None else n}" for t, n in sorted(dict(components).items()))
    return f"ClientQuotaEntity(entries={{{inner}}})"


def validate_entity(components: Components) -> QuotaEntity:
    """`ClientQuotaControlManager.validateEntity` + `configKeysForEntityType`; raises AdminError."""
    if not components:
        raise AdminError(INVALID_REQUEST, "Invalid empty client quota entity")
    seen: dict[str, str | None] = {}
    for entity_type, name in components:
        if entity_type in seen:
            raise AdminError(INVALID_REQUEST,
                             f"Invalid client quota entity, duplicate entity entry {entity_type}")
        if entity_type not in ENTITY_TYPES:
            raise AdminError(INVALID_REQUEST, f"Unhandled client quota entity type: {entity_type}")
        if name is not None and not name:
            raise AdminError(INVALID_REQUEST, f"Empty {entity_type} not supported")
        seen[entity_type] = name
    if IP in seen:
        if USER in seen or CLIENT_ID in seen:
            raise AdminError(INVALID_REQUEST,  # sic: Kafka's words
                             "Invalid quota entity combination, IP entity shouldnot be combined with User or "
                             "ClientId")
        raise AdminError(INVALID_REQUEST, "Sluice does not enforce ip (connection rate) quotas: set them on "
                                          "the brokers")
    try:
        return QuotaEntity.from_kafka(seen.items())
    except QuotaConfigError as exc:  # Sluice's entity types: a default name or a refused shape
        raise AdminError(INVALID_REQUEST, f"Invalid client quota entity: {exc.reason}") from None


def validate_ops(entity: QuotaEntity, ops: Sequence[tuple[str, float, bool]]) -> list[QuotaChange]:
    """One entity's ops as changes; raises AdminError on the first invalid one."""
    changes = []
    for key, value, remove in ops:
        if remove:
            changes.append(QuotaChange(entity, key, None))  # removing an absent or unknown key: a no-op
            continue
        if key in _NOT_ENFORCED:
            raise AdminError(INVALID_REQUEST,
                             f"Sluice does not enforce {key} ({_NOT_ENFORCED[key]}): set it on the brokers")
        problem = validate_key_value(key, value)
        if problem is not None:
            raise AdminError(INVALID_REQUEST, problem)
        changes.append(QuotaChange(entity, key, value))
    return changes


def plan_alter(entries: Sequence[tuple[Components, Sequence[tuple[str, float, bool]]]]) -> list[AlterResult]:
    """Validate every entry; one result per distinct entity, in request order."""
    results: dict[tuple[tuple[str, str | None], ...], AlterResult] = {}
    for components, ops in entries:
        ident = tuple(sorted(components, key=lambda c: (c[0], c[1] or "")))
        if ident in results:  # Kafka: "Ignoring duplicate entity"; Sluice changes none of its copies
            earlier = results[ident]
            earlier.error_code, earlier.error_message = INVALID_REQUEST, (
                f"Ignoring duplicate entity {kafka_entity_string(components)}")
            earlier.changes = []
            continue
        result = results[ident] = AlterResult(components)
        keys = [key for key, _value, _remove in ops]
        duplicated = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
        try:
            if duplicated is not None:
                raise AdminError(INVALID_REQUEST, f"Duplicate quota key {duplicated} not updating quota for "
                                                  f"this entity {kafka_entity_string(components)}")
            result.entity = validate_entity(components)
            result.changes = validate_ops(result.entity, ops)
        except AdminError as exc:
            result.error_code, result.error_message = exc.code, exc.message
            result.changes = []
    return list(results.values())


# ------------------------------------------------------------------------------ the stage

class QuotaBackend(Protocol):
    """What the stage needs of `proxy.quota_service.QuotaService`."""

    table: QuotaTable

    def submit(self, changes: Sequence[QuotaChange]) -> asyncio.Future[QuotaTable]: ...

    def check_table(self, table: QuotaTable) -> str | None:
        """Why `table` cannot be enforced with the global settings (a `sluice.burst_ms` larger than
        the window allows, or with ``sluice.token_bucket=0``), or None when it can."""
        ...


class QuotaAdminStage(StageBase):
    """Answers API keys 48 and 49 locally; nothing else is touched."""

    def __init__(self, backend: QuotaBackend, admins: Iterable[str]) -> None:
        self._backend = backend
        self._admins = frozenset(admins)

    def handles(self, hook: str, api_key: int, api_version: int) -> bool:
        return api_key == ApiKey.DESCRIBE_CLIENT_QUOTAS or api_key == ApiKey.ALTER_CLIENT_QUOTAS

    def on_request(self, ctx: ConnectionContext, entry: InFlight, header: RequestHeader,
                   payload: bytes) -> RequestOutcome | None:
        api_key = header.api_key
        if api_key != ApiKey.DESCRIBE_CLIENT_QUOTAS and api_key != ApiKey.ALTER_CLIENT_QUOTAS:
            return None
        try:
            request = decode_request_body(payload, header)
            if api_key == ApiKey.DESCRIBE_CLIENT_QUOTAS:
                return AnswerHere(self._describe(header, request))
            return self._alter(ctx, header, request)
        except ProtocolError as exc:  # closed, as a broker closes a connection on a bad request
            return Close(f"cannot answer {api_name(api_key)} v{header.api_version}: {exc}")

    # -- describe ------------------------------------------------------------------------------

    def _describe(self, header: RequestHeader, request: Any) -> bytes:
        cls = response_schema(header.api_key, header.api_version)
        module = _module_of(cls)
        try:
            flt = parse_filter(((c.entity_type, int(c.match_type), c.match) for c in request.components),
                               bool(request.strict))
        except AdminError as exc:
            body = cls(throttle_time=_ZERO, error_code=exc.code, error_message=exc.message,
                       entries=None)
            return _encode(header, body)
        entries = tuple(
            module.EntryData(entity=tuple(module.EntityData(entity_type=t, entity_name=n)
                                          for t, n in entity.to_kafka()),
                             values=tuple(module.ValueData(key=k, value=f64(v)) for k, v in values.items()))
            for entity, values in describe(self._backend.table, flt))
        body = cls(throttle_time=_ZERO, error_code=ErrorCode.none, error_message="", entries=entries)
        return _encode(header, body)

    # -- alter ---------------------------------------------------------------------------------

    def _alter(self, ctx: ConnectionContext, header: RequestHeader, request: Any) -> AnswerHere | AnswerLater:
        entries = [(tuple((e.entity_type, e.entity_name) for e in entry.entity),
                    [(op.key, float(op.value), bool(op.remove)) for op in entry.ops])
                   for entry in request.entries]
        if ctx.principal not in self._admins:
            log.warning("AlterClientQuotas from %s (principal %s) refused: not one of the admins",
                        ctx.client_address, ctx.principal)
            denied = [AlterResult(components, CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed.")
                      for components, _ops in entries]
            return AnswerHere(self._alter_response(header, denied))
        results = plan_alter(entries)
        for result in results:  # keys valid one by one may still not fit together or the window
            problem = self._backend.check_table(self._backend.table.apply(result.changes)) \
                if result.changes else None
            if problem is not None:
                result.error_code, result.error_message, result.changes = INVALID_REQUEST, problem, []
        changes = [c for r in results for c in r.changes]
        if request.validate_only or not changes:
            return AnswerHere(self._alter_response(header, results))
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[bytes] = loop.create_future()
        written = self._backend.submit(changes)

        def done(future: asyncio.Future[QuotaTable]) -> None:
            if not future.cancelled() and future.exception() is None:
                log.info("quotas altered by %s from %s: %s", ctx.principal, ctx.client_address,
                         "; ".join(_describe_change(c) for c in changes))
            else:
                why = "cancelled" if future.cancelled() else str(future.exception())
                log.error("quota change by %s not written: %s", ctx.principal, why)
                for result in results:
                    if result.changes:
                        result.error_code = UNKNOWN_SERVER_ERROR
                        result.error_message = f"Sluice could not write its quota store: {why}"
            if not answer.done():
                try:
                    answer.set_result(self._alter_response(header, results))
                except ProtocolError as exc:
                    answer.set_exception(exc)

        written.add_done_callback(done)
        return AnswerLater(answer)

    @staticmethod
    def _alter_response(header: RequestHeader, results: Sequence[AlterResult]) -> bytes:
        cls = response_schema(header.api_key, header.api_version)
        module = _module_of(cls)
        entries = tuple(module.EntryData(error_code=r.error_code, error_message=r.error_message,
                                         entity=tuple(module.EntityData(entity_type=t, entity_name=n)
                                                      for t, n in r.components))
                        for r in results)
        return _encode(header, cls(throttle_time=_ZERO, entries=entries))


def _module_of(cls: Any) -> Any:
    return sys.modules[cls.__module__]


def _encode(header: RequestHeader, body: Any) -> bytes:
    return encode_response(response_header_version(header.api_key, header.api_version), header.correlation_id,
                           body)


def _describe_change(change: QuotaChange) -> str:
    if change.value is None:
        return f"{change.entity.describe()} -{change.key}"
    return f"{change.entity.describe()} {change.key}={format_value(change.value)}"


__all__ = [
    "AdminError",
    "QuotaAdminStage",
    "QuotaFilter",
    "describe",
    "parse_filter",
    "plan_alter",
]
