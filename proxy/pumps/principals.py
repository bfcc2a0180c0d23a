"""Who is calling: the principal of each client connection (`ConnectionContext.principal`).

Sluice owns no credentials; the broker checks them. A connection's principal is, as in Kafka:

1. after a SASL exchange **the broker accepted**: the name that exchange authenticated (PLAIN's
   authcid, SCRAM's user name, OAUTHBEARER's token subject or configured claim), read from the
   client's first SASL message by `protocol.sasl`. A re-authentication (KIP-368) replaces it once
   the broker accepts again. A refused or abandoned exchange changes nothing;
2. otherwise, on a TLS listener, the client certificate's subject mapped by
   `ssl.principal.mapping.rules` (a certificate no rule maps refuses the connection, as Kafka does);
3. otherwise the client's IP address if the listener says `principal_from: client_address` (the
   real one, behind a PROXY-protocol hop);
4. otherwise ``ANONYMOUS``.

`SaslInspector` is per connection, created at the first SaslHandshake or SaslAuthenticate. It is not
a pipeline stage: the connection calls it only for those two API keys (one comparison per request
and per response), so connections that never authenticate pay nothing.

Never logged: passwords, tokens, SASL bytes, the user name of a refused attempt (it may be a
mistyped password), mechanism names Sluice does not know (a client chooses them).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from kio.schema.errors import ErrorCode

from protocol.apis import ApiKey
from protocol.errors import ProtocolError
from protocol.headers import RequestHeader
from protocol.principal_rules import SslPrincipalMapper
from protocol.sasl import (
    OAUTHBEARER,
    PLAIN,
    SCRAM_MECHANISMS,
    Candidate,
    candidate_principal,
    exchange_succeeded,
    read_sasl_authenticate_request,
    read_sasl_authenticate_response,
    read_sasl_handshake_request,
    read_sasl_handshake_response,
    understood,
)
from protocol.x500 import certificate_subject
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext
from quotas.entity import UNAUTHENTICATED_PRINCIPAL

log = logging.getLogger("sluice.auth")

_KNOWN: Final = frozenset({PLAIN, OAUTHBEARER, "GSSAPI", *SCRAM_MECHANISMS})
RAW_TOKENS: Final = "raw"                     # SaslInspector.on_response: raw tokens follow


def mechanism_label(mechanism: str) -> str:
    """A mechanism name fit for a log line or a metric label (clients choose the name)."""
    return mechanism if mechanism in _KNOWN else "other"


@dataclass(frozen=True)
class AuthSettings:
    """The listener's principal settings, shared by its connections."""

    tls_mapper: SslPrincipalMapper = field(default_factory=SslPrincipalMapper)
    principal_from_address: bool = False
    oauthbearer_claim: str = "sub"
    on_result: Callable[[str, str], None] | None = None   # (mechanism label, "success" | "failure")

    def connection_principal(self, ssl_object: ssl.SSLObject | ssl.SSLSocket | None, client_ip: str) -> str:
        """The principal a connection starts with. Raises ProtocolError (NoMatchingRule,
        CertificateError) for a client certificate that maps to no principal."""
        if ssl_object is not None:
            der = ssl_object.getpeercert(binary_form=True)
            if der:
                return self.tls_mapper.name(certificate_subject(der))
        return client_ip if self.principal_from_address else UNAUTHENTICATED_PRINCIPAL

    def record(self, mechanism: str, result: str) -> None:
        if self.on_result is not None:
            self.on_result(mechanism_label(mechanism), result)


class _Exchange:
    """One SASL exchange: a handshake and the client messages that follow it."""

    __slots__ = ("accepted", "candidate", "failed", "mechanism", "rounds", "version")

    def __init__(self, mechanism: str, version: int) -> None:
        self.mechanism = mechanism
        self.version = version                # SaslHandshake version: 0 = raw tokens follow
        self.accepted = False                 # the broker accepted the mechanism
        self.failed = False
        self.rounds = 0                       # client messages sent so far
        self.candidate = Candidate(None, "no client message yet")


class SaslInspector:
    """Follows one connection's SASL exchanges and sets `ctx.principal` when the broker says yes."""

    def __init__(self, ctx: ConnectionContext, settings: AuthSettings,
                 on_success: Callable[[], None] | None = None) -> None:
        self._ctx = ctx
        self._settings = settings
        self._on_success = on_success  # called each time the broker accepts an exchange
        self._exchange: _Exchange | None = None
        self._authenticated = False

    # ------------------------------------------------------------------ Kafka-framed requests

    def on_request(self, header: RequestHeader, payload: bytes, entry: InFlight) -> None:
        """A SaslHandshake or SaslAuthenticate request on its way to the broker."""
        if header.api_key == ApiKey.SASL_HANDSHAKE:
            try:
                mechanism = read_sasl_handshake_request(payload, header)
            except ProtocolError as exc:
                log.info("connection %d: unreadable SaslHandshake request: %s", self._ctx.connection_id, exc)
                mechanism = ""
            started = self._exchange = _Exchange(mechanism, header.api_version)
            entry.sasl_exchange, entry.sasl_round = started, 0
            return
        exchange = self._exchange
        if exchange is None:
            return  # no handshake: the broker refuses it (ILLEGAL_SASL_STATE)
        exchange.rounds += 1
        if exchange.rounds == 1:
            try:
                token = read_sasl_authenticate_request(payload, header)
            except ProtocolError as exc:
                exchange.candidate = Candidate(None, f"unreadable SaslAuthenticate request: {exc}")
            else:
                exchange.candidate = self._candidate(exchange, token)
        entry.sasl_exchange, entry.sasl_round = exchange, exchange.rounds

    def on_response(self, entry: InFlight, payload: bytes) -> str | None:
        """The broker's answer to one of them. Returns RAW_TOKENS when a SaslHandshake v0 was
        accepted (raw SASL tokens follow in both directions), or a reason to close the connection
        when they would follow for a mechanism whose end Sluice cannot tell."""
        exchange = entry.sasl_exchange
        if not isinstance(exchange, _Exchange):
            return None
        round_no = entry.sasl_round
        if entry.api_key == ApiKey.SASL_HANDSHAKE:
            return self._handshake_answered(exchange, payload)
        try:
            result = read_sasl_authenticate_response(payload, entry.api_version)
        except ProtocolError as exc:
            log.warning("connection %d: unreadable SaslAuthenticate response: %s",
                        self._ctx.connection_id, exc)
            self._failed(exchange, "unreadable response")
            return None
        if result.error_code != ErrorCode.none:
            self._failed(exchange, f"broker error {result.error_code}")
        elif exchange.accepted and not exchange.failed and exchange_succeeded(
                exchange.mechanism, round_no, result.auth_bytes):
            self._succeeded(exchange)
        return None

    def _handshake_answered(self, exchange: _Exchange, payload: bytes) -> str | None:
        try:
            error_code = read_sasl_handshake_response(payload)
        except ProtocolError as exc:
            log.warning("connection %d: unreadable SaslHandshake response: %s", self._ctx.connection_id, exc)
            error_code = ErrorCode.unknown_server_error
        if error_code != ErrorCode.none:
            self._failed(exchange, f"broker error {error_code} to the SaslHandshake")
            return None
        exchange.accepted = True
        if not understood(exchange.mechanism):
            log.warning("connection %d: SASL %s: Sluice cannot learn this mechanism's principal; "
                        "the connection keeps principal %r", self._ctx.connection_id,
                        mechanism_label(exchange.mechanism), self._ctx.principal)
            if exchange.version == 0:
                return (f"SASL {mechanism_label(exchange.mechanism)} with raw tokens (SaslHandshake v0) "
                        "is not supported: Sluice cannot tell where the exchange ends")
            return None
        return RAW_TOKENS if exchange.version == 0 else None

    # ------------------------------------------------------------------ raw tokens (after a v0 handshake)

    def raw_client_token(self, token: bytes) -> None:
        exchange = self._exchange
        assert exchange is not None
        exchange.rounds += 1
        if exchange.rounds == 1:
            exchange.candidate = self._candidate(exchange, token)

    def raw_server_token(self, token: bytes) -> bool:
        """True when this token ends the exchange in success: Kafka requests follow. A broker that
        refuses raw-token credentials closes the connection instead of answering."""
        exchange = self._exchange
        assert exchange is not None
        if exchange_succeeded(exchange.mechanism, exchange.rounds, token):
            self._succeeded(exchange)
            return True
        return False

    # ------------------------------------------------------------------ outcomes

    def _candidate(self, exchange: _Exchange, first_token: bytes) -> Candidate:
        return candidate_principal(exchange.mechanism, first_token, self._settings.oauthbearer_claim)

    def _succeeded(self, exchange: _Exchange) -> None:
        ctx = self._ctx
        what = "re-authenticated" if self._authenticated else "authenticated"
        self._authenticated = True
        self._settings.record(exchange.mechanism, "success")
        if self._on_success is not None:
            self._on_success()
        name = exchange.candidate.principal
        if name is None:
            log.warning("connection %d from %s: SASL %s accepted by the broker, but Sluice cannot tell the "
                        "principal (%s); it stays %r", ctx.connection_id, ctx.client_address,
                        mechanism_label(exchange.mechanism), exchange.candidate.reason, ctx.principal)
            return
        ctx.principal = name
        log.info("connection %d from %s %s as %r (SASL %s)", ctx.connection_id, ctx.client_address, what,
                 name, mechanism_label(exchange.mechanism))

    def _failed(self, exchange: _Exchange, why: str) -> None:
        if exchange.failed:
            return
        exchange.failed = True
        self._settings.record(exchange.mechanism, "failure")
        log.info("connection %d from %s: SASL %s authentication failed (%s); principal stays %r",
                 self._ctx.connection_id, self._ctx.client_address, mechanism_label(exchange.mechanism), why,
                 self._ctx.principal)
