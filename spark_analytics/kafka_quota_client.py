"""DescribeClientQuotas (48) and AlterClientQuotas (49) for `sluice tune`, with entities as strings.

kafka-python 3.0.12's KafkaAdminClient has no client-quota methods, so the requests are framed by
`protocol.quota_client`, the one client Sluice has for these two APIs (`sluice quotas` uses it
too). This module opens the socket and speaks in the access log's entity strings
(`contracts.access_log.format_quota_entity`: ``user=alice,client-id=<default>``). The same client
talks to Sluice or straight to a broker: it is the same protocol. SASL PLAIN and SCRAM-SHA-256/512
are supported; TLS is not yet.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from contracts.access_log import EntityComponent, format_quota_entity, parse_quota_entity
from protocol.quota_client import (
    MATCH_ANY,
    MATCH_DEFAULT,
    MATCH_EXACT,
    AlterEntry,
    QuotaAdminError,
    QuotaClient,
    Stream,
)
from protocol.sasl_client import MECHANISMS as SASL_MECHANISMS
from protocol.sasl_client import SaslCredentials as SaslConfig

__all__ = ["MATCH_ANY", "MATCH_DEFAULT", "MATCH_EXACT", "SASL_MECHANISMS", "AlterResult", "KafkaQuotaClient",
           "QuotaAdminError", "QuotaEntry", "QuotaOp", "SaslConfig"]


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


def _connect(host: str, port: int, timeout_s: float) -> Stream:
    return socket.create_connection((host, port), timeout=timeout_s)


class KafkaQuotaClient:
    """One connection to the first reachable bootstrap server. Use as a context manager."""

    def __init__(self, bootstrap: str, *, sasl: SaslConfig | None = None, client_id: str = "sluice-tune",
                 timeout_s: float = 30.0) -> None:
        self._client = QuotaClient(bootstrap, _connect, sasl=sasl, client_id=client_id,
                                   software_name="sluice-tune", timeout_s=timeout_s)

    def __enter__(self) -> KafkaQuotaClient:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        self._client.connect()

    def close(self) -> None:
        self._client.close()

    def describe(self, components: Sequence[tuple[str, int, str | None]] = (), *,
                 strict: bool = False) -> list[QuotaEntry]:
        """DescribeClientQuotas. `components` are (entity_type, match_type, match); no components
        with strict=False returns every configured entity."""
        entries = [QuotaEntry(format_quota_entity(e.entity), dict(e.values))
                   for e in self._client.describe(components, strict=strict)]
        return sorted(entries, key=lambda e: e.entity)

    def alter(self, changes: Mapping[str, Sequence[QuotaOp]], *,
              validate_only: bool = False) -> list[AlterResult]:
        """AlterClientQuotas: per entity string, the keys to set (value) or remove (None)."""
        entries = []
        for entity, ops in changes.items():
            components: tuple[EntityComponent, ...] = parse_quota_entity(entity)
            entries.append(AlterEntry(components, [(op.key, op.value) for op in ops]))
        outcomes = self._client.alter(entries, validate_only=validate_only)
        return [AlterResult(format_quota_entity(o.entity), o.error_code, o.error_message) for o in outcomes]
