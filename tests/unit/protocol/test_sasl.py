"""SASL frames and first client messages, read the way Kafka's SASL servers read them.

The secrets in these messages ("pw-SECRET", the JWT) must never appear in an exception message:
`assert_no_secret` checks every error raised here.
"""

from __future__ import annotations

import base64
import datetime
import importlib
import json
import struct
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i64Timedelta

from protocol.encode import encode_request
from protocol.errors import DecodeError
from protocol.headers import RequestHeader, read_request_header
from protocol.sasl import (
    Candidate,
    SaslTokenError,
    candidate_principal,
    exchange_succeeded,
    jwt_claim,
    parse_oauthbearer_initial,
    parse_scram_client_first,
    plain_authcid,
    read_sasl_authenticate_request,
    read_sasl_authenticate_response,
    read_sasl_handshake_request,
    read_sasl_handshake_response,
    scram_unescape,
    understood,
)
from tests.unit.protocol.kio_support import response_payload

SECRET = "pw-SECRET"


def assert_no_secret(exc: pytest.ExceptionInfo[BaseException]) -> None:
    assert SECRET not in str(exc.value) and SECRET not in repr(exc.value)


def jwt(claims: dict[str, Any], header: dict[str, Any] | None = None, signature: str = "") -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")
    return f"{part(header or {'alg': 'none'})}.{part(claims)}.{signature}"


def oauth_message(token: str, authzid: str = "", extensions: str = "", scheme: str = "Bearer") -> bytes:
    return f"n,{'a=' + authzid if authzid else ''},\x01auth={scheme} {token}\x01{extensions}\x01".encode()


# ----------------------------------------------------------------------------- frames

def test_handshake_request_golden() -> None:
    payload = b"".join([
        struct.pack(">hhi", 17, 1, 7),   # api_key SaslHandshake, v1, correlation_id 7
        struct.pack(">h", 3), b"cli",    # client_id "cli" (request header v1)
        struct.pack(">h", 13), b"SCRAM-SHA-256",   # mechanism: int16 length string
    ])
    assert read_sasl_handshake_request(payload, read_request_header(payload)) == "SCRAM-SHA-256"


def test_handshake_request_truncated() -> None:
    payload = struct.pack(">hhih", 17, 0, 1, -1) + struct.pack(">h", 5) + b"PLA"
    with pytest.raises(DecodeError):
        read_sasl_handshake_request(payload, read_request_header(payload))


def test_handshake_response_golden() -> None:
    payload = b"".join([
        struct.pack(">i", 7),             # correlation_id (response header v0)
        struct.pack(">h", 33),            # error_code UNSUPPORTED_SASL_MECHANISM
        struct.pack(">i", 1), struct.pack(">h", 5), b"PLAIN",   # mechanisms ["PLAIN"]
    ])
    assert read_sasl_handshake_response(payload) == 33


@pytest.mark.parametrize("version", [0, 1])
def test_authenticate_request_v0_v1_golden(version: int) -> None:
    payload = b"".join([
        struct.pack(">hhi", 36, version, 9),        # SaslAuthenticate, correlation_id 9
        struct.pack(">h", -1),                      # client_id null
        struct.pack(">i", 4), b"\x00a\x00b",        # auth_bytes: int32 length
    ])
    assert read_sasl_authenticate_request(payload, read_request_header(payload)) == b"\x00a\x00b"


def test_authenticate_request_v2_golden() -> None:
    payload = b"".join([
        struct.pack(">hhi", 36, 2, 9),              # SaslAuthenticate v2 (flexible: header v2)
        struct.pack(">h", 1), b"c",                 # client_id "c"
        b"\x00",                                    # header tagged fields: none
        b"\x05", b"\x00a\x00b",                     # auth_bytes: compact, length + 1 = 5
        b"\x00",                                    # body tagged fields: none
    ])
    assert read_sasl_authenticate_request(payload, read_request_header(payload)) == b"\x00a\x00b"


@pytest.mark.parametrize("version", [0, 1, 2])
def test_authenticate_request_against_kio(version: int) -> None:
    mod = importlib.import_module(f"kio.schema.sasl_authenticate.v{version}.request")
    body = mod.SaslAuthenticateRequest(auth_bytes=b"n,,n=alice,r=abc")
    header = RequestHeader(36, version, 3, "x", 2 if version >= 2 else 1, 0)
    payload = encode_request(header, body)
    assert read_sasl_authenticate_request(payload, read_request_header(payload)) == b"n,,n=alice,r=abc"


def test_authenticate_request_truncated_and_negative() -> None:
    for body in [struct.pack(">i", 10) + b"abc", struct.pack(">i", -1)]:
        payload = struct.pack(">hhih", 36, 1, 1, -1) + body
        with pytest.raises(DecodeError):
            read_sasl_authenticate_request(payload, read_request_header(payload))


def test_authenticate_response_v1_golden() -> None:
    payload = b"".join([
        struct.pack(">i", 9),                       # correlation_id (header v0)
        struct.pack(">h", 58),                      # error_code SASL_AUTHENTICATION_FAILED
        struct.pack(">h", 3), b"bad",               # error_message
        struct.pack(">i", 2), b"v=",                # auth_bytes
        struct.pack(">q", 0),                       # session_lifetime_ms (v1+)
    ])
    result = read_sasl_authenticate_response(payload, 1)
    assert (result.error_code, result.auth_bytes) == (58, b"v=")


def test_authenticate_response_v2_golden() -> None:
    payload = b"".join([
        struct.pack(">i", 9), b"\x00",              # correlation_id, header tagged fields (header v1)
        struct.pack(">h", 0),                       # error_code NONE
        b"\x00",                                    # error_message: compact null
        b"\x01",                                    # auth_bytes: compact, empty
        struct.pack(">q", 3600000),                 # session_lifetime_ms
        b"\x00",                                    # body tagged fields
    ])
    result = read_sasl_authenticate_response(payload, 2)
    assert (result.error_code, result.auth_bytes) == (0, b"")


@pytest.mark.parametrize("version", [0, 1, 2])
@pytest.mark.parametrize(("error", "message", "auth"), [(ErrorCode.none, None, b"r=abc,s=c2FsdA==,i=4096"),
                                                        (ErrorCode.sasl_authentication_failed, "no", b"")])
def test_authenticate_response_against_kio(version: int, error: ErrorCode, message: str | None,
                                           auth: bytes) -> None:
    mod = importlib.import_module(f"kio.schema.sasl_authenticate.v{version}.response")
    kwargs: dict[str, Any] = {"error_code": error, "error_message": message, "auth_bytes": auth}
    if version >= 1:
        kwargs["session_lifetime"] = i64Timedelta.parse(datetime.timedelta(seconds=60))
    payload = response_payload(mod.SaslAuthenticateResponse(**kwargs))
    result = read_sasl_authenticate_response(payload, version)
    assert (result.error_code, result.auth_bytes) == (error.value, auth)


def test_authenticate_response_truncated() -> None:
    payload = struct.pack(">ihh", 1, 0, -1) + struct.pack(">i", 10) + b"xy"
    with pytest.raises(DecodeError):
        read_sasl_authenticate_response(payload, 0)


def test_auth_bytes_are_not_in_the_result_repr() -> None:
    payload = struct.pack(">ihh", 1, 0, -1) + struct.pack(">i", 9) + SECRET.encode()
    assert SECRET not in repr(read_sasl_authenticate_response(payload, 0))


# ----------------------------------------------------------------------------- PLAIN

@pytest.mark.parametrize(("token", "authcid"), [
    (b"\x00alice\x00" + SECRET.encode(), "alice"),            # no authzid
    (b"alice\x00alice\x00" + SECRET.encode(), "alice"),       # authzid = authcid
    (b"admin\x00alice\x00" + SECRET.encode(), "alice"),       # differing authzid: the broker refuses; authcid
    ("\x00Zoë\x00pw".encode(), "Zoë"),                       # UTF-8
])
def test_plain_authcid(token: bytes, authcid: str) -> None:
    assert plain_authcid(token) == authcid


@pytest.mark.parametrize("token", [
    b"alice\x00" + SECRET.encode(),                  # 2 fields
    b"\x00alice\x00" + SECRET.encode() + b"\x00x",   # 4 fields
    b"\x00\x00" + SECRET.encode(),                   # empty user name
    b"\x00alice\x00",                                # empty password
    b"",
])
def test_plain_malformed(token: bytes) -> None:
    with pytest.raises(SaslTokenError) as exc:
        plain_authcid(token)
    assert_no_secret(exc)


# ----------------------------------------------------------------------------- SCRAM

@pytest.mark.parametrize(("saslname", "user"), [
    ("alice", "alice"),
    ("a=2Cb", "a,b"),
    ("a=3Db", "a=b"),
    ("=3D2C", "=2C"),          # =3D first would give "=2C", which must not then become ","
    ("=2C=3D=2C", ",=,"),
])
def test_scram_unescape(saslname: str, user: str) -> None:
    assert scram_unescape(saslname) == user


def test_scram_unescape_rejects_a_bare_equals() -> None:
    with pytest.raises(SaslTokenError):
        scram_unescape("a=b")


def test_scram_client_first_golden() -> None:
    first = parse_scram_client_first(b"n,,n=user=2Cname,r=fyko+d2lbbFgONRv9qkxdawL")
    assert (first.username, first.authzid, first.extensions, first.token_auth) == ("user,name", "", {}, False)
    assert first.nonce == "fyko+d2lbbFgONRv9qkxdawL"
    assert "fyko" not in repr(first)


def test_scram_client_first_with_authzid_reserved_and_extensions() -> None:
    first = parse_scram_client_first(b"n,a=alice,m=ext,n=alice,r=abc,tokenauth=true,other=1")
    assert first.username == "alice" and first.authzid == "alice"
    assert first.extensions == {"tokenauth": "true", "other": "1"}
    assert first.token_auth


@pytest.mark.parametrize("message", [
    b"y,,n=alice,r=abc",              # channel binding flag: Kafka only accepts "n"
    b"p=tls-unique,,n=alice,r=abc",
    b"n,,n=,r=abc",                   # empty user name
    b"n,,n=a=2Xb,r=abc",              # '=' not followed by 2C or 3D
    "n,,n=Zoë,r=abc".encode(),        # Kafka's saslname is 7-bit
    b"n,,r=abc,n=alice",              # wrong order
    b"n,,n=alice,r=a b",              # the nonce is printable without spaces
    b"n,,n=alice",
    b"c=biws,r=abc,p=" + SECRET.encode(),   # a client-final message is not a client-first
])
def test_scram_client_first_malformed(message: bytes) -> None:
    with pytest.raises(SaslTokenError) as exc:
        parse_scram_client_first(message)
    assert_no_secret(exc)


# ----------------------------------------------------------------------------- OAUTHBEARER

def test_oauthbearer_initial_response_golden() -> None:
    token = jwt({"sub": "alice", "exp": 2_000_000_000})
    message = b"n,,\x01auth=Bearer " + token.encode() + b"\x01\x01"   # GS2 header, ^A, auth=..., ^A^A
    initial = parse_oauthbearer_initial(message)
    assert (initial.authzid, initial.extensions, initial.token) == ("", {}, token)
    assert token not in repr(initial)
    assert jwt_claim(initial.token, "sub") == "alice"


def test_oauthbearer_authzid_extensions_and_scheme_case() -> None:
    token = jwt({"sub": "svc"})
    initial = parse_oauthbearer_initial(oauth_message(token, "svc", "traceId=123\x01", scheme="bEaReR"))
    assert (initial.authzid, initial.extensions) == ("svc", {"traceId": "123"})


@pytest.mark.parametrize("message", [
    b"n,,\x01host=x\x01\x01",                                    # no auth
    b"n,,\x01auth=Basic " + SECRET.encode() + b"\x01\x01",       # not a bearer token
    b"n,,\x01auth=Bearer " + SECRET.encode() + b"!\x01\x01",     # token characters
    b"n,,\x01auth=Bearer " + SECRET.encode() + b"\x01",          # missing the final ^A
    b"y,,\x01auth=Bearer " + SECRET.encode() + b"\x01\x01",
])
def test_oauthbearer_malformed(message: bytes) -> None:
    with pytest.raises(SaslTokenError) as exc:
        parse_oauthbearer_initial(message)
    assert_no_secret(exc)


def test_jwt_claims() -> None:
    token = jwt({"sub": "alice", "user_name": "Alice A.", "groups": ["x"], "n": 3})
    assert jwt_claim(token, "sub") == "alice"
    assert jwt_claim(token, "user_name") == "Alice A."
    for claim in ("groups", "n", "missing"):
        with pytest.raises(SaslTokenError):
            jwt_claim(token, claim)


NOT_AN_OBJECT = base64.urlsafe_b64encode(b"[1]").decode()


@pytest.mark.parametrize("token", [SECRET, f"a.{SECRET}.c", "a.b", f"x.{NOT_AN_OBJECT}.y"])
def test_jwt_malformed(token: str) -> None:
    with pytest.raises(SaslTokenError) as exc:
        jwt_claim(token, "sub")
    assert_no_secret(exc)


# ----------------------------------------------------------------------------- the exchange

def test_candidates() -> None:
    assert candidate_principal("PLAIN", b"\x00alice\x00pw") == Candidate("alice")
    assert candidate_principal("SCRAM-SHA-256", b"n,,n=bob,r=x") == Candidate("bob")
    assert candidate_principal("SCRAM-SHA-512", b"n,,n=b=3Dob,r=x") == Candidate("b=ob")
    token = jwt({"sub": "carol", "email": "c@example.com"})
    assert candidate_principal("OAUTHBEARER", oauth_message(token)) == Candidate("carol")
    assert candidate_principal("OAUTHBEARER", oauth_message(token), "email") == Candidate("c@example.com")


@pytest.mark.parametrize(("mechanism", "token", "reason"), [
    ("SCRAM-SHA-256", b"n,,n=tokenid,r=x,tokenauth=true", "delegation-token"),
    ("PLAIN", b"alice" + SECRET.encode(), "fields"),
    ("OAUTHBEARER", oauth_message(f"x.{SECRET}.y"), "base64url JSON"),
    ("GSSAPI", b"\x60\x82" + SECRET.encode(), "does not reveal"),
    ("plain", b"\x00alice\x00pw", "does not reveal"),      # mechanism names are case-sensitive in Kafka
])
def test_no_candidate(mechanism: str, token: bytes, reason: str) -> None:
    candidate = candidate_principal(mechanism, token)
    assert candidate.principal is None and reason in candidate.reason and SECRET not in candidate.reason


def test_understood_mechanisms() -> None:
    assert all(understood(m) for m in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"))
    assert not any(understood(m) for m in ("GSSAPI", "plain", "SCRAM-SHA-1"))


@pytest.mark.parametrize(("mechanism", "round_no", "server", "done"), [
    ("PLAIN", 1, b"", True),
    ("PLAIN", 2, b"", False),
    ("SCRAM-SHA-256", 1, b"r=abc,s=c2FsdA==,i=4096", False),   # server-first
    ("SCRAM-SHA-256", 2, b"v=c2lnbmF0dXJl", True),             # server-final: verified
    ("SCRAM-SHA-512", 2, b"e=invalid-proof", False),
    ("OAUTHBEARER", 1, b"", True),
    ("OAUTHBEARER", 1, b'{"status":"invalid_token"}', False),  # the error challenge
    ("OAUTHBEARER", 2, b"", False),                            # after the client's %x01
    ("GSSAPI", 1, b"", False),
])
def test_exchange_succeeded(mechanism: str, round_no: int, server: bytes, done: bool) -> None:
    assert exchange_succeeded(mechanism, round_no, server) is done
