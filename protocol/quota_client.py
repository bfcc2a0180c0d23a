"""A small blocking Kafka client for DescribeClientQuotas (48) and AlterClientQuotas (49).

Shared by `sluice quotas` (proxy), `sluice tune apply` (spark_analytics) and Sluice's import of
the brokers' quotas at start. The same client talks to Sluice or straight to a broker: it is the
same protocol. It negotiates versions with ApiVersions and authenticates with SaslHandshake +
SaslAuthenticate (PLAIN, SCRAM-SHA-256/512 from `protocol.sasl_client`).

This package does no I/O of its own: the caller passes `connect`, which opens a byte stream
(``socket.create_connection`` fits, or a function that also wraps it in TLS). Frames are encoded
and decoded with kio through `protocol.encode`.

Entities are Kafka's component lists: ``(("user", "alice"), ("client-id", None))``, a None name
being the default entity.
"""

from __future__ import annotations

import itertools
import struct
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from protocol.apis import ApiKey, request_header_version
from protocol.encode import decode_response_body, encode_request, request_schema
from protocol.errors import ProtocolError
from protocol.headers import RequestHeader
from protocol.sasl_client import SaslCredentials, SaslError, mechanism_for

MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY = 0, 1, 2

Component = tuple[str, str | None]
"""(entity_type, entity_name); a None name is the default entity."""
Filter = tuple[str, int, str | None]
"""(entity_type, match_type, match): a DescribeClientQuotas filter component."""

_OURS: dict[int, tuple[int, int]] = {ApiKey.DESCRIBE_CLIENT_QUOTAS: (0, 1),
                                     ApiKey.ALTER_CLIENT_QUOTAS: (0, 1)}
_MAX_FRAME = 64 * 1024 * 1024


class Stream(Protocol):
    def sendall(self, data: bytes, /) -> None: ...
    def recv(self, size: int, /) -> bytes: ...
    def close(self) -> None: ...


Connect = Callable[[str, int, float], Stream]
"""(host, port, timeout_s) -> an open stream; raises OSError when it cannot connect."""


class QuotaAdminError(RuntimeError):
    """A request failed as a whole: connection, authentication, or a top-level error code.

    `error_code` is Kafka's code when the server answered with one."""

    def __init__(self, message: str, error_code: int | None = None) -> None:
        super().__init__(message)
        self.error_code = error_code


@dataclass(frozen=True, slots=True)
class DescribedEntity:
    entity: tuple[Component, ...]
    values: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class AlterEntry:
    """The ops for one entity: key -> value to set, or None to remove the key."""

    entity: tuple[Component, ...]
    ops: Sequence[tuple[str, float | None]]


@dataclass(frozen=True, slots=True)
class AlterOutcome:
    entity: tuple[Component, ...]
    error_code: int
    error_message: str | None

    @property
    def ok(self) -> bool:
        return self.error_code == ErrorCode.none


def parse_bootstrap(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for item in bootstrap.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"bad bootstrap server {item.strip()!r}: expected host:port")
        out.append((host.strip("[]"), int(port)))
    return out


class QuotaClient:
    """One connection to the first reachable bootstrap server. Use as a context manager."""

    def __init__(self, bootstrap: str, connect: Connect, *, sasl: SaslCredentials | None = None,
                 client_id: str = "sluice-quotas", software_name: str = "sluice-quotas",
                 timeout_s: float = 30.0) -> None:
        self._servers = parse_bootstrap(bootstrap)
        self._connect = connect
        self._sasl = sasl
        self._client_id = client_id
        self._software_name = software_name
        self._timeout_s = timeout_s
        self._stream: Stream | None = None
        self._correlation = itertools.count(1)
        self._versions: dict[int, tuple[int, int]] = {}
        self.server = ""

    # ------------------------------------------------------------------ connection

    def __enter__(self) -> QuotaClient:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        errors = []
        for host, port in self._servers:
            try:
                self._stream = self._connect(host, port, self._timeout_s)
                self.server = f"{host}:{port}"
                break
            except OSError as exc:
                errors.append(f"{host}:{port}: {exc.strerror or exc}")
        else:
            raise QuotaAdminError("cannot connect to any bootstrap server: " + "; ".join(errors))
        try:
            if self._sasl is not None:
                self._authenticate(self._sasl)
            self._versions = self._api_versions()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def _read_exactly(self, n: int) -> bytes:
        assert self._stream is not None
        chunks, remaining = [], n
        while remaining:
            chunk = self._stream.recv(min(remaining, 1 << 20))
            if not chunk:
                raise QuotaAdminError(f"connection to {self.server} closed by the server")
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def call(self, api_key: int, version: int, body: Any) -> Any:
        """Send one request, wait for its response, return the decoded body."""
        if self._stream is None:
            raise QuotaAdminError("not connected")
        correlation_id = next(self._correlation)
        header = RequestHeader(api_key, version, correlation_id, self._client_id,
                               request_header_version(api_key, version), 0)
        try:
            payload = encode_request(header, body)
            self._stream.sendall(struct.pack(">i", len(payload)) + payload)
            (size,) = struct.unpack(">i", self._read_exactly(4))
            if not 4 <= size <= _MAX_FRAME:
                raise QuotaAdminError(f"{self.server} sent a frame of {size} bytes: not a Kafka broker?")
            response = self._read_exactly(size)
            (got,) = struct.unpack_from(">i", response, 0)
            if got != correlation_id:
                raise QuotaAdminError(f"correlation id {got}, expected {correlation_id}")
            return decode_response_body(response, api_key, version)
        except OSError as exc:
            raise QuotaAdminError(f"connection to {self.server} failed: {exc.strerror or exc}") from exc
        except ProtocolError as exc:
            raise QuotaAdminError(f"bad response from {self.server}: {exc}") from exc

    def _api_versions(self) -> dict[int, tuple[int, int]]:
        from importlib.metadata import PackageNotFoundError, version

        try:
            ours = version("sluice")
        except PackageNotFoundError:
            ours = "0"
        request = request_schema(ApiKey.API_VERSIONS, 3)(
            client_software_name=self._software_name, client_software_version=ours)
        try:
            response = self.call(ApiKey.API_VERSIONS, 3, request)
        except QuotaAdminError as exc:
            if isinstance(exc.__cause__, ProtocolError):
                return {}  # a reply kio cannot decode (a newer tagged field): use our newest versions
            raise
        if int(response.error_code) != 0:
            return {}
        return {int(k.api_key): (int(k.min_version), int(k.max_version))
                for k in response.api_keys or ()}  # kio reads a null array as None

    def version(self, api_key: int) -> int:
        low, high = _OURS[api_key]
        if not self._versions:
            return high
        if api_key not in self._versions:
            raise QuotaAdminError(f"{self.server} does not support API {api_key}")
        server_low, server_high = self._versions[api_key]
        chosen = min(high, server_high)
        if chosen < max(low, server_low):
            raise QuotaAdminError(f"no common version of API {api_key}: server {server_low}-{server_high}, "
                                  f"client {low}-{high}")
        return chosen

    def _authenticate(self, sasl: SaslCredentials) -> None:
        handshake = request_schema(ApiKey.SASL_HANDSHAKE, 1)(mechanism=sasl.mechanism)
        reply = self.call(ApiKey.SASL_HANDSHAKE, 1, handshake)
        if int(reply.error_code) != 0:
            raise QuotaAdminError(f"SASL mechanism {sasl.mechanism} is not enabled on {self.server}; "
                                  f"it offers {', '.join(reply.mechanisms) or 'none'}", int(reply.error_code))
        mechanism = mechanism_for(sasl)
        request_cls = request_schema(ApiKey.SASL_AUTHENTICATE, 2)
        message: bytes | None = mechanism.first()
        failed = f"SASL authentication failed ({sasl.mechanism} as {sasl.username!r})"
        try:
            while message is not None:
                reply = self.call(ApiKey.SASL_AUTHENTICATE, 2, request_cls(auth_bytes=message))
                if int(reply.error_code) != 0:
                    why = reply.error_message or f"error {int(reply.error_code)}"
                    raise QuotaAdminError(f"{failed}: {why}", int(reply.error_code))
                message = mechanism.next(reply.auth_bytes)
        except SaslError as exc:
            raise QuotaAdminError(f"{failed}: {exc}") from None
        if not mechanism.done:
            raise QuotaAdminError("SASL authentication did not complete")

    # ------------------------------------------------------------------ the two APIs

    def describe(self, components: Sequence[Filter] = (), *, strict: bool = False) -> list[DescribedEntity]:
        """DescribeClientQuotas; no components with strict=False returns every configured entity.

        Raises QuotaAdminError (with `error_code`) when the server answers an error."""
        from kio.static.primitive import i8

        version = self.version(ApiKey.DESCRIBE_CLIENT_QUOTAS)
        cls = request_schema(ApiKey.DESCRIBE_CLIENT_QUOTAS, version)
        component_cls = _item_class(cls, "components")
        request = cls(components=tuple(component_cls(entity_type=t, match_type=i8(m), match=name)
                                       for t, m, name in components),
                      strict=strict)
        response = self.call(ApiKey.DESCRIBE_CLIENT_QUOTAS, version, request)
        if int(response.error_code) != 0:
            raise QuotaAdminError(f"DescribeClientQuotas failed: {response.error_message or ''} "
                                  f"(error {int(response.error_code)})", int(response.error_code))
        return [DescribedEntity(tuple((e.entity_type, e.entity_name) for e in entry.entity),
                                {v.key: float(v.value) for v in entry.values})
                for entry in response.entries or ()]

    def alter(self, entries: Sequence[AlterEntry], *, validate_only: bool = False) -> list[AlterOutcome]:
        """AlterClientQuotas; per-entity outcomes (errors are per entity, not raised)."""
        from kio.static.primitive import f64

        version = self.version(ApiKey.ALTER_CLIENT_QUOTAS)
        cls = request_schema(ApiKey.ALTER_CLIENT_QUOTAS, version)
        entry_cls = _item_class(cls, "entries")
        entity_cls = _item_class(entry_cls, "entity")
        op_cls = _item_class(entry_cls, "ops")
        request = cls(entries=tuple(
            entry_cls(entity=tuple(entity_cls(entity_type=t, entity_name=n) for t, n in e.entity),
                      ops=tuple(op_cls(key=k, value=f64(0.0 if v is None else float(v)), remove=v is None)
                                for k, v in e.ops))
            for e in entries), validate_only=validate_only)
        response = self.call(ApiKey.ALTER_CLIENT_QUOTAS, version, request)
        return [AlterOutcome(tuple((c.entity_type, c.entity_name) for c in r.entity),
                             int(r.error_code), r.error_message) for r in response.entries]


_ITEM_CLASSES = {"components": "ComponentData", "entries": "EntryData", "entity": "EntityData",
                 "ops": "OpData"}


def _item_class(cls: Any, field_name: str) -> Any:
    """kio's class for the items of a tuple field (e.g. DescribeClientQuotasRequest.components)."""
    return getattr(sys.modules[cls.__module__], _ITEM_CLASSES[field_name])


__all__ = [
    "MATCH_ANY",
    "MATCH_DEFAULT",
    "MATCH_EXACT",
    "AlterEntry",
    "AlterOutcome",
    "Component",
    "Connect",
    "DescribedEntity",
    "Filter",
    "QuotaAdminError",
    "QuotaClient",
    "SaslCredentials",
    "Stream",
    "parse_bootstrap",
]
