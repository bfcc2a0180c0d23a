"""DescribeClientQuotas (48) and AlterClientQuotas (49) over a plain blocking socket.

kafka-python 3.0.12's KafkaAdminClient has no client-quota methods (it ships the protocol classes
only), so this module frames the two requests itself with kio, the codec Sluice already depends
on. The same client talks to Sluice or straight to a broker: it is the same protocol. For SASL it
runs SaslHandshake + SaslAuthenticate and takes the mechanisms' steps (PLAIN, SCRAM-SHA-256/512)
from kafka-python, imported only when SASL is asked for. TLS is not supported yet.

Entities are the strings of `access_log_schema.format_quota_entity` (`user=alice,client-id=<default>`).
"""

from __future__ import annotations

import importlib
import io
import itertools
import socket
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from spark_analytics.access_log_schema import EntityComponent, format_quota_entity, parse_quota_entity

DESCRIBE_CLIENT_QUOTAS = 48
ALTER_CLIENT_QUOTAS = 49
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
API_VERSIONS = 18

MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY = 0, 1, 2
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_KIO_VERSIONS = {DESCRIBE_CLIENT_QUOTAS: (0, 1), ALTER_CLIENT_QUOTAS: (0, 1)}
_KIO_PACKAGES = {DESCRIBE_CLIENT_QUOTAS: "describe_client_quotas", ALTER_CLIENT_QUOTAS: "alter_client_quotas",
                 SASL_HANDSHAKE: "sasl_handshake", SASL_AUTHENTICATE: "sasl_authenticate",
                 API_VERSIONS: "api_versions"}


class QuotaAdminError(RuntimeError):
    """A request failed: connection, authentication, or a top-level error code."""


@dataclass(frozen=True, slots=True)
class SaslConfig:
    mechanism: str
    username: str
    password: str

    def __post_init__(self) -> None:
        if self.mechanism not in SASL_MECHANISMS:
            raise ValueError(f"SASL mechanism must be one of {SASL_MECHANISMS}, got {self.mechanism!r}")

    def __repr__(self) -> str:  # never print the password
        return f"SaslConfig(mechanism={self.mechanism!r}, username={self.username!r})"


@dataclass(frozen=True, slots=True)
class QuotaEntry:
    entity: str
    values: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class QuotaOp:
    key: str
    value: float | None  # None removes the key


@dataclass(frozen=True, slots=True)
class AlterResult:
    entity: str
    error_code: int
    error_message: str | None

    @property
    def ok(self) -> bool:
        return self.error_code == 0


def _module(api_key: int, version: int, direction: str) -> ModuleType:
    return importlib.import_module(f"kio.schema.{_KIO_PACKAGES[api_key]}.v{version}.{direction}")


def _parse_bootstrap(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for item in bootstrap.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"bad bootstrap server {item!r}: expected host:port")
        out.append((host.strip("[]"), int(port)))
    return out


class KafkaQuotaClient:
    """One connection to the first reachable bootstrap server. Use as a context manager."""

    def __init__(self, bootstrap: str, *, sasl: SaslConfig | None = None, client_id: str = "sluice-tune",
                 timeout_s: float = 30.0) -> None:
        self._servers = _parse_bootstrap(bootstrap)
        self._sasl = sasl
        self._client_id = client_id
        self._timeout_s = timeout_s
        self._sock: socket.socket | None = None
        self._correlation = itertools.count(1)
        self._versions: dict[int, tuple[int, int]] = {}

    # ------------------------------------------------------------------ connection

    def __enter__(self) -> KafkaQuotaClient:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        errors = []
        for host, port in self._servers:
            try:
                self._sock = socket.create_connection((host, port), timeout=self._timeout_s)
                break
            except OSError as exc:
                errors.append(f"{host}:{port}: {exc}")
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
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _read_exactly(self, n: int) -> bytes:
        assert self._sock is not None
        chunks, remaining = [], n
        while remaining:
            chunk = self._sock.recv(remaining)
            if not chunk:
                raise QuotaAdminError("connection closed by the server")
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def _call(self, api_key: int, version: int, body: Any) -> Any:
        from kio.serial import entity_reader, entity_writer
        from kio.static.primitive import i16, i32

        if self._sock is None:
            raise QuotaAdminError("not connected")
        correlation_id = next(self._correlation)
        header_cls = type(body).__header_schema__
        header = header_cls(request_api_key=i16(api_key), request_api_version=i16(version),
                            correlation_id=i32(correlation_id), client_id=self._client_id)
        buf = io.BytesIO()
        buf.write(b"\0\0\0\0")
        entity_writer(header_cls)(buf, header)
        entity_writer(type(body))(buf, body)
        frame = bytearray(buf.getvalue())
        struct.pack_into(">i", frame, 0, len(frame) - 4)
        self._sock.sendall(frame)

        (size,) = struct.unpack(">i", self._read_exactly(4))
        payload = self._read_exactly(size)
        response_cls = _module(api_key, version, "response").__dict__[type(body).__name__.replace(
            "Request", "Response")]
        resp_header, offset = entity_reader(response_cls.__header_schema__)(payload, 0)
        if resp_header.correlation_id != correlation_id:
            raise QuotaAdminError(f"correlation id {resp_header.correlation_id}, expected {correlation_id}")
        response, _ = entity_reader(response_cls)(payload, offset)
        return response

    def _api_versions(self) -> dict[int, tuple[int, int]]:
        from importlib.metadata import PackageNotFoundError, version

        try:
            ours = version("sluice")
        except PackageNotFoundError:
            ours = "unknown"
        module = _module(API_VERSIONS, 3, "request")
        try:
            response = self._call(API_VERSIONS, 3, module.ApiVersionsRequest(
                client_software_name="sluice-tune", client_software_version=ours))
        except (KeyError, ValueError):  # a reply kio cannot decode (unknown tagged field)
            return {}
        if int(response.error_code) != 0:
            return {}
        return {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys}

    def _version(self, api_key: int) -> int:
        low, high = _KIO_VERSIONS[api_key]
        if not self._versions:  # ApiVersions unreadable: the newest we can speak
            return high
        if api_key not in self._versions:
            raise QuotaAdminError(f"the server does not support API {api_key}")
        server_low, server_high = self._versions[api_key]
        version = min(high, server_high)
        if version < max(low, server_low):
            raise QuotaAdminError(f"no common version of API {api_key}: server {server_low}-{server_high}, "
                                  f"client {low}-{high}")
        return version

    def _authenticate(self, sasl: SaslConfig) -> None:
        from kafka.net.sasl import get_sasl_mechanism

        handshake = _module(SASL_HANDSHAKE, 1, "request").SaslHandshakeRequest(mechanism=sasl.mechanism)
        reply = self._call(SASL_HANDSHAKE, 1, handshake)
        if int(reply.error_code) != 0:
            raise QuotaAdminError(f"SASL handshake for {sasl.mechanism} failed: {reply.error_code!r}; "
                                  f"the server offers {list(reply.mechanisms)}")
        mechanism = get_sasl_mechanism(sasl.mechanism)(
            sasl_mechanism=sasl.mechanism, sasl_plain_username=sasl.username,
            sasl_plain_password=sasl.password, security_protocol="SASL_PLAINTEXT")
        request_cls = _module(SASL_AUTHENTICATE, 2, "request").SaslAuthenticateRequest
        while not mechanism.is_done():
            reply = self._call(SASL_AUTHENTICATE, 2, request_cls(auth_bytes=mechanism.auth_bytes()))
            if int(reply.error_code) != 0:
                why = reply.error_message or repr(reply.error_code)
                raise QuotaAdminError(f"SASL authentication failed: {why}")
            mechanism.receive(reply.auth_bytes)
        if not mechanism.is_authenticated():
            raise QuotaAdminError("SASL authentication did not complete")

    # ------------------------------------------------------------------ the two APIs

    def describe(self, components: Sequence[tuple[str, int, str | None]] = (), *,
                 strict: bool = False) -> list[QuotaEntry]:
        """DescribeClientQuotas. `components` are (entity_type, match_type, match); no components
        with strict=False returns every configured entity."""
        from kio.static.primitive import i8

        version = self._version(DESCRIBE_CLIENT_QUOTAS)
        module = _module(DESCRIBE_CLIENT_QUOTAS, version, "request")
        request = module.DescribeClientQuotasRequest(
            components=tuple(module.ComponentData(entity_type=t, match_type=i8(m), match=name)
                             for t, m, name in components),
            strict=strict)
        response = self._call(DESCRIBE_CLIENT_QUOTAS, version, request)
        if int(response.error_code) != 0:
            raise QuotaAdminError(f"DescribeClientQuotas failed: {response.error_code!r} "
                                  f"{response.error_message or ''}".strip())
        entries = []
        for entry in response.entries or ():
            entity = format_quota_entity((e.entity_type, e.entity_name) for e in entry.entity)
            entries.append(QuotaEntry(entity, {v.key: float(v.value) for v in entry.values}))
        return sorted(entries, key=lambda e: e.entity)

    def alter(self, changes: Mapping[str, Sequence[QuotaOp]], *,
              validate_only: bool = False) -> list[AlterResult]:
        """AlterClientQuotas: per entity string, the keys to set (value) or remove (None)."""
        from kio.static.primitive import f64

        version = self._version(ALTER_CLIENT_QUOTAS)
        module = _module(ALTER_CLIENT_QUOTAS, version, "request")
        entries = []
        for entity, ops in changes.items():
            components: tuple[EntityComponent, ...] = parse_quota_entity(entity)
            entries.append(module.EntryData(
                entity=tuple(module.EntityData(entity_type=t, entity_name=n) for t, n in components),
                ops=tuple(module.OpData(key=op.key, value=f64(0.0 if op.value is None else float(op.value)),
                                        remove=op.value is None) for op in ops)))
        response = self._call(ALTER_CLIENT_QUOTAS, version, module.AlterClientQuotasRequest(
            entries=tuple(entries), validate_only=validate_only))
        return [AlterResult(format_quota_entity((e.entity_type, e.entity_name) for e in r.entity),
                            int(r.error_code), r.error_message) for r in response.entries]
