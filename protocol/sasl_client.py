"""The client side of SASL PLAIN and SCRAM-SHA-256/512 (RFC 4616, RFC 5802, RFC 7677), sans I/O.

A mechanism is a little state machine: `first()` gives the first message, `next(server_message)`
the reply to each server message, until `done`. Kafka carries the messages in SaslAuthenticate
requests after a SaslHandshake naming the mechanism. Credentials are never part of a repr.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass, field

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class SaslError(Exception):
    """The server's messages break the mechanism (bad nonce, bad signature, malformed)."""


@dataclass(frozen=True, slots=True)
class SaslCredentials:
    mechanism: str
    username: str
    password: str = field(repr=False)

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"SASL mechanism must be one of {', '.join(MECHANISMS)}, got {self.mechanism!r}")

    def __repr__(self) -> str:  # never show the password
        return f"SaslCredentials(mechanism={self.mechanism!r}, username={self.username!r})"


class SaslMechanism:
    done: bool = False

    def first(self) -> bytes:
        raise NotImplementedError

    def next(self, server_message: bytes) -> bytes | None:
        """The reply to `server_message`, or None when the exchange is complete."""
        raise NotImplementedError


class PlainMechanism(SaslMechanism):
    def __init__(self, username: str, password: str) -> None:
        self._message = b"\0" + username.encode() + b"\0" + password.encode()

    def first(self) -> bytes:
        return self._message

    def next(self, server_message: bytes) -> bytes | None:
        self.done = True
        return None


def scram_escape(name: str) -> str:
    """RFC 5802 saslname: ``=`` -> ``=3D``, ``,`` -> ``=2C``."""
    return name.replace("=", "=3D").replace(",", "=2C")


class ScramMechanism(SaslMechanism):
    """SCRAM client (no channel binding, as Kafka). `nonce` is for tests; by default it is random."""

    def __init__(self, mechanism: str, username: str, password: str, nonce: str | None = None) -> None:
        self._hash = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
        self._password = password.encode()
        self._nonce = nonce or base64.b64encode(os.urandom(24)).decode().replace("=", "")
        self._client_first_bare = f"n={scram_escape(username)},r={self._nonce}"
        self._server_signature: bytes | None = None

    def first(self) -> bytes:
        return ("n,," + self._client_first_bare).encode()

    def _hmac(self, key: bytes, msg: bytes) -> bytes:
        return hmac.new(key, msg, self._hash).digest()

    def next(self, server_message: bytes) -> bytes | None:
        text = server_message.decode("utf-8", "replace")
        fields = _attributes(text)
        if self._server_signature is None:
            return self._client_final(text, fields)
        if "e" in fields:
            raise SaslError(f"server error: {fields['e']}")
        verifier = base64.b64decode(fields.get("v", ""))
        if not hmac.compare_digest(verifier, self._server_signature):
            raise SaslError("the server's signature does not match: it does not know the password")
        self.done = True
        return None

    def _client_final(self, server_first: str, fields: dict[str, str]) -> bytes:
        if "e" in fields:
            raise SaslError(f"server error: {fields['e']}")
        try:
            nonce, salt, iterations = fields["r"], base64.b64decode(fields["s"]), int(fields["i"])
        except (KeyError, ValueError) as exc:
            raise SaslError(f"malformed server-first message: {exc}") from None
        if not nonce.startswith(self._nonce) or iterations < 1:
            raise SaslError("the server's nonce does not extend ours")
        salted = hashlib.pbkdf2_hmac(self._hash, self._password, salt, iterations)
        client_key = self._hmac(salted, b"Client Key")
        stored_key = hashlib.new(self._hash, client_key).digest()
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._client_first_bare},{server_first},{without_proof}".encode()
        signature = self._hmac(stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def _attributes(message: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in message.split(","):
        name, sep, value = part.partition("=")
        if sep:
            out.setdefault(name, value)
    return out


def mechanism_for(credentials: SaslCredentials) -> SaslMechanism:
    if credentials.mechanism == "PLAIN":
        return PlainMechanism(credentials.username, credentials.password)
    return ScramMechanism(credentials.mechanism, credentials.username, credentials.password)
