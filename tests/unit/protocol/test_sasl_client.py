"""SASL client mechanisms against the RFCs' published exchanges."""

from __future__ import annotations

import pytest

from protocol.sasl_client import (
    PlainMechanism,
    SaslCredentials,
    SaslError,
    ScramMechanism,
    mechanism_for,
    scram_escape,
)

# RFC 7677 section 3 (SCRAM-SHA-256), user "user", password "pencil"
NONCE = "rOprNGfwEbeRWgbNEkqO"
SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_scram_sha_256_matches_rfc_7677() -> None:
    scram = ScramMechanism("SCRAM-SHA-256", "user", "pencil", nonce=NONCE)
    assert scram.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    assert scram.next(SERVER_FIRST) == CLIENT_FINAL
    assert not scram.done
    assert scram.next(SERVER_FINAL) is None
    assert scram.done


def test_scram_rejects_a_server_that_does_not_know_the_password() -> None:
    scram = ScramMechanism("SCRAM-SHA-256", "user", "pencil", nonce=NONCE)
    scram.next(SERVER_FIRST)
    with pytest.raises(SaslError, match="signature"):
        scram.next(b"v=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")


@pytest.mark.parametrize("server_first", [b"r=someoneelse,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
                                          b"r=rOprNGfwEbeRWgbNEkqOx,i=4096", b"e=unknown-user"])
def test_scram_rejects_bad_server_first_messages(server_first: bytes) -> None:
    with pytest.raises(SaslError):
        ScramMechanism("SCRAM-SHA-512", "user", "pencil", nonce=NONCE).next(server_first)


def test_scram_escapes_user_names() -> None:
    assert scram_escape("a=b,c") == "a=3Db=2Cc"
    assert ScramMechanism("SCRAM-SHA-512", "a,b", "x", nonce="n").first() == b"n,,n=a=2Cb,r=n"


def test_plain_is_one_message() -> None:
    plain = PlainMechanism("alice", "alice-secret")
    assert plain.first() == b"\0alice\0alice-secret"
    assert plain.next(b"") is None and plain.done


def test_credentials_never_show_the_password() -> None:
    creds = SaslCredentials("SCRAM-SHA-256", "admin", "hunter2")
    assert "hunter2" not in repr(creds) and "hunter2" not in str(creds)
    assert isinstance(mechanism_for(creds), ScramMechanism)
    with pytest.raises(ValueError, match="one of PLAIN"):
        SaslCredentials("GSSAPI", "admin", "x")
