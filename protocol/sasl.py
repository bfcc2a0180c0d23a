"""SASL as Kafka carries it, read but never changed: who is authenticating, and did it work.

Sluice does not own credentials; the broker checks them. What Sluice needs is the name the broker
will use as the principal, read from the client's first SASL token, and whether the broker said
yes. Everything here is pure: wire fields out of SaslHandshake/SaslAuthenticate frames, and the
principal out of a mechanism's first client message, parsed the way Kafka's own SASL servers
parse it (so that a message the broker accepts names the same user here):

* **PLAIN** (RFC 4616, Kafka's `PlainSaslServer`): ``authzid NUL authcid NUL passwd``, exactly three
  fields; the principal is the authentication identity (authcid). A non-empty authzid that differs
  makes the broker refuse; that is the broker's call.
* **SCRAM-SHA-256/512** (RFC 5802, Kafka's `ScramMessages.ClientFirstMessage`):
  ``n,[a=authzid],[m=...,]n=saslname,r=nonce[,ext=value...]``; the principal is the saslname with
  ``=2C`` -> ``,`` and ``=3D`` -> ``=`` undone. With the ``tokenauth`` extension the client
  authenticates with a delegation token whose owner only the broker knows: no principal.
* **OAUTHBEARER** (RFC 7628, Kafka's `OAuthBearerClientInitialResponse`):
  ``n,[a=authzid],^Aauth=Bearer <jwt>^A[key=value^A...]^A``; the principal is a claim of the JWT
  payload (``sub`` unless configured otherwise). The token is not verified here: the broker
  verifies it, and Sluice only believes the claim once the broker has accepted the token.

Nothing in this module puts token bytes, passwords or tokens into an exception message or a repr:
callers log these errors as they are.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, field
from typing import Final

from protocol._wire import read_i16, read_i32, read_string, read_uvarint, skip, skip_string, truncated
from protocol.apis import ApiKey, response_header_version
from protocol.errors import DecodeError, ProtocolError
from protocol.headers import RequestHeader, response_body_offset

PLAIN: Final = "PLAIN"
SCRAM_SHA_256: Final = "SCRAM-SHA-256"
SCRAM_SHA_512: Final = "SCRAM-SHA-512"
OAUTHBEARER: Final = "OAUTHBEARER"
SCRAM_MECHANISMS: Final = frozenset({SCRAM_SHA_256, SCRAM_SHA_512})

SASL_API_KEYS: Final = frozenset({int(ApiKey.SASL_HANDSHAKE), int(ApiKey.SASL_AUTHENTICATE)})


class SaslTokenError(ProtocolError):
    """A SASL message Sluice cannot read. The message never quotes the token."""


# ----------------------------------------------------------------------------- wire fields

def read_sasl_handshake_request(payload: bytes, header: RequestHeader) -> str:
    """The mechanism a SaslHandshake v0/v1 request asks for (a non-nullable int16 string)."""
    mechanism, _ = read_string(payload, header.body_offset, False, "SaslHandshake mechanism")
    if mechanism is None:
        raise DecodeError("malformed SaslHandshake request: null mechanism", header.body_offset)
    return mechanism


def read_sasl_handshake_response(payload: bytes) -> int:
    """The error code of a SaslHandshake response (header v0; the body starts with it)."""
    return read_i16(payload, 4, "SaslHandshake error_code")


def read_sasl_authenticate_request(payload: bytes, header: RequestHeader) -> bytes:
    """The auth_bytes of a SaslAuthenticate v0-2 request (int32 length; compact from v2)."""
    pos = header.body_offset
    if header.api_version >= 2:
        length_plus_one, pos = read_uvarint(payload, pos, "SaslAuthenticate auth_bytes length")
        if length_plus_one == 0:
            raise DecodeError("malformed SaslAuthenticate request: null auth_bytes", pos)
        length = length_plus_one - 1
    else:
        length = read_i32(payload, pos, "SaslAuthenticate auth_bytes length")
        pos += 4
        if length < 0:
            raise DecodeError(f"malformed SaslAuthenticate request: auth_bytes length {length}", pos - 4)
    end = skip(payload, pos, length, "SaslAuthenticate auth_bytes")
    return payload[pos:end]


@dataclass(frozen=True, slots=True)
class SaslAuthenticateResult:
    error_code: int
    auth_bytes: bytes = field(repr=False)   # the server's SASL message


def read_sasl_authenticate_response(payload: bytes, api_version: int) -> SaslAuthenticateResult:
    """error_code and auth_bytes of a SaslAuthenticate v0-2 response.

    v0: error_code int16, error_message nullable string, auth_bytes bytes; v1 adds
    session_lifetime_ms (after auth_bytes, not read); v2 is flexible (compact fields, header v1).
    """
    flexible = api_version >= 2
    pos = response_body_offset(payload, response_header_version(ApiKey.SASL_AUTHENTICATE, api_version))
    error_code = read_i16(payload, pos, "SaslAuthenticate error_code")
    pos = skip_string(payload, pos + 2, flexible, "SaslAuthenticate error_message")
    if flexible:
        length_plus_one, pos = read_uvarint(payload, pos, "SaslAuthenticate auth_bytes length")
        length = length_plus_one - 1
    else:
        length = read_i32(payload, pos, "SaslAuthenticate auth_bytes length")
        pos += 4
    if length < 0:  # null: Kafka never sends it; read it as empty
        return SaslAuthenticateResult(error_code, b"")
    if pos + length > len(payload):
        raise truncated("SaslAuthenticate auth_bytes", pos, length, len(payload))
    return SaslAuthenticateResult(error_code, payload[pos:pos + length])


# ----------------------------------------------------------------------------- mechanisms

def plain_authcid(token: bytes) -> str:
    """The authentication identity of a PLAIN message, checked as Kafka's `PlainSaslServer` does:
    exactly three NUL-separated fields, a non-empty user name and password."""
    fields = str(token, "utf-8", "replace").split("\x00")
    if len(fields) != 3:
        raise SaslTokenError(f"PLAIN message has {len(fields)} NUL-separated fields, expected 3")
    _authzid, authcid, password = fields
    if not authcid:
        raise SaslTokenError("PLAIN message has an empty user name")
    if not password:
        raise SaslTokenError("PLAIN message has an empty password")
    return authcid


# Kafka's ScramMessages: Java character classes with && intersections, spelled out for `re`.
_SASLNAME = r"(?:[\x01-\x2b\x2d-\x3c\x3e-\x7f]|=2C|=3D)+"   # [\x01-\x7F&&[^=,]] | =2C | =3D
_VALUE = r"[\x01-\x2b\x2d-\x7f]+"                           # [\x01-\x7F&&[^,]]+
_PRINTABLE = r"[\x21-\x2b\x2d-\x7e]+"                       # [\x21-\x7E&&[^,]]+
_SCRAM_CLIENT_FIRST = re.compile(
    rf"n,(?:a=(?P<authzid>{_SASLNAME}))?,(?:m={_VALUE},)?n=(?P<saslname>{_SASLNAME}),"
    rf"r=(?P<nonce>{_PRINTABLE})(?P<extensions>(?:,[A-Za-z]+={_VALUE})*)")


@dataclass(frozen=True, slots=True)
class ScramClientFirst:
    username: str                        # the saslname, unescaped
    authzid: str                         # "" when absent; as sent (Kafka compares it escaped)
    extensions: dict[str, str]
    nonce: str = field(repr=False)

    @property
    def token_auth(self) -> bool:
        """A delegation-token login (KIP-48): the principal is the token's owner, not `username`."""
        return self.extensions.get("tokenauth", "").lower() == "true"


def scram_unescape(saslname: str) -> str:
    """RFC 5802 saslname -> user name: ``=2C`` is ``,`` and ``=3D`` is ``=`` (Kafka's
    `ScramFormatter.username`; any other ``=`` is invalid)."""
    name = saslname.replace("=2C", ",")
    if "=" in name.replace("=3D", ""):
        raise SaslTokenError("SCRAM user name has an '=' that is not =2C or =3D")
    return name.replace("=3D", "=")


def parse_scram_client_first(token: bytes) -> ScramClientFirst:
    """Kafka's `ClientFirstMessage`: only the "n" GS2 header (no channel binding) is accepted."""
    m = _SCRAM_CLIENT_FIRST.fullmatch(str(token, "utf-8", "replace"))
    if m is None:
        raise SaslTokenError("not a SCRAM client-first message")
    extensions: dict[str, str] = {}
    for item in m.group("extensions").split(",")[1:]:
        key, _, value = item.partition("=")
        extensions[key] = value
    return ScramClientFirst(scram_unescape(m.group("saslname")), m.group("authzid") or "", extensions,
                            m.group("nonce"))


# Kafka's OAuthBearerClientInitialResponse
_KVSEP: Final = "\x01"
_OAUTH_INITIAL = re.compile(
    rf"n,(?:a=(?P<authzid>{_SASLNAME}))?,\x01(?P<kvpairs>(?:[A-Za-z]+=[\x21-\x7e \t\r\n]+\x01)*)\x01")
_AUTH_VALUE = re.compile(r"(?P<scheme>\w+) +(?P<token>[-_.a-zA-Z0-9]+)", re.ASCII)


@dataclass(frozen=True, slots=True)
class OAuthBearerInitial:
    authzid: str
    extensions: dict[str, str]
    token: str = field(repr=False)


def parse_oauthbearer_initial(message: bytes) -> OAuthBearerInitial:
    m = _OAUTH_INITIAL.fullmatch(str(message, "utf-8", "replace"))
    if m is None:
        raise SaslTokenError("not an OAUTHBEARER client initial response")
    properties: dict[str, str] = {}
    kvpairs = m.group("kvpairs")
    if kvpairs:
        for pair in kvpairs[:-1].split(_KVSEP):
            key, _, value = pair.partition("=")
            properties[key] = value
    auth = properties.pop("auth", None)
    if auth is None:
        raise SaslTokenError("OAUTHBEARER client initial response has no 'auth'")
    a = _AUTH_VALUE.fullmatch(auth)
    if a is None or a.group("scheme").lower() != "bearer":
        raise SaslTokenError("OAUTHBEARER 'auth' is not 'Bearer <token>'")
    return OAuthBearerInitial(m.group("authzid") or "", properties, a.group("token"))


def jwt_claim(token: str, claim: str) -> str:
    """A string claim from a JWT's payload (the second dot-separated part, base64url JSON).

    The signature is not checked: the broker does that. Raises SaslTokenError if the token is not
    a JWS or the claim is missing or not a string (the broker would then refuse the token too).
    """
    parts = token.split(".")
    if len(parts) != 3:
        raise SaslTokenError(f"OAUTHBEARER token is not a JWS: {len(parts)} dot-separated parts")
    encoded = parts[1]
    try:
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
        claims = json.loads(raw)
    except (binascii.Error, ValueError):
        raise SaslTokenError("OAUTHBEARER token payload is not base64url JSON") from None
    if not isinstance(claims, dict):
        raise SaslTokenError("OAUTHBEARER token payload is not a JSON object")
    value = claims.get(claim)
    if not isinstance(value, str):
        raise SaslTokenError(f"OAUTHBEARER token has no string claim {claim!r}")
    return value


# ----------------------------------------------------------------------------- the exchange

@dataclass(frozen=True, slots=True)
class Candidate:
    """What the first client message says about the principal: a name, or why there is none."""

    principal: str | None
    reason: str = ""


def candidate_principal(mechanism: str, first_token: bytes, oauth_claim: str = "sub") -> Candidate:
    """The principal the broker will use if it accepts this exchange (Kafka's default principal
    builder: the SASL authorization id, which each of these servers sets to the name read here)."""
    try:
        if mechanism == PLAIN:
            return Candidate(plain_authcid(first_token))
        if mechanism in SCRAM_MECHANISMS:
            first = parse_scram_client_first(first_token)
            if first.token_auth:
                return Candidate(None, "SCRAM delegation-token login: only the broker knows the owner")
            return Candidate(first.username)
        if mechanism == OAUTHBEARER:
            return Candidate(jwt_claim(parse_oauthbearer_initial(first_token).token, oauth_claim))
    except SaslTokenError as exc:
        return Candidate(None, str(exc))
    return Candidate(None, f"mechanism {mechanism} does not reveal its principal to a proxy")


def understood(mechanism: str) -> bool:
    """Mechanisms whose exchange Sluice can follow to its end (and so through raw tokens)."""
    return mechanism in (PLAIN, OAUTHBEARER) or mechanism in SCRAM_MECHANISMS


def exchange_succeeded(mechanism: str, round_no: int, server_token: bytes) -> bool:
    """Whether the broker's answer to client message `round_no` (1-based), given without an error,
    ends the exchange in success.

    * PLAIN: one round; the server's (empty) answer is success.
    * SCRAM: round 1 is answered with server-first; round 2 with server-final, ``v=signature``.
    * OAUTHBEARER: a valid token is answered with an empty message. An invalid one is answered with
      an error JSON and no error code yet; the client then sends ``%x01`` and the broker fails it.
    """
    if mechanism == PLAIN:
        return round_no == 1
    if mechanism in SCRAM_MECHANISMS:
        return round_no == 2 and server_token.startswith(b"v=")
    if mechanism == OAUTHBEARER:
        return round_no == 1 and server_token == b""
    return False
