"""A certificate subject printed as Java's `X500Principal.getName()` prints it."""

from __future__ import annotations

import pytest

from protocol.x500 import CertificateError, certificate_subject, name_to_rfc2253
from tests.unit.protocol.subjects import SUBJECTS, der_certificate


@pytest.mark.parametrize("case", sorted(SUBJECTS))
def test_subject_as_java_prints_it(case: str) -> None:
    subject, expected = SUBJECTS[case]
    assert certificate_subject(der_certificate(subject)) == expected


def test_name_golden_bytes() -> None:
    der = bytes([
        0x30, 0x1E,                                      # Name: SEQUENCE of 2 RDNs
        0x31, 0x0F, 0x30, 0x0D,                          # RDN 1: SET { SEQUENCE {
        0x06, 0x03, 0x55, 0x04, 0x0A,                    #   OID 2.5.4.10 (O)
        0x0C, 0x06, *b"Sluice",                          #   UTF8String "Sluice" } }
        0x31, 0x0B, 0x30, 0x09,                          # RDN 2: SET { SEQUENCE {
        0x06, 0x03, 0x55, 0x04, 0x03,                    #   OID 2.5.4.3 (CN)
        0x13, 0x02, *b"a,",                              #   PrintableString "a," } }
    ])
    assert name_to_rfc2253(der) == "CN=a\\,,O=Sluice"   # most specific first, ',' escaped


def test_long_form_lengths() -> None:
    value = b"x" * 200
    ava = bytes([0x06, 0x03, 0x55, 0x04, 0x03, 0x0C, 0x81, 200]) + value        # length 0x81 0xC8
    rdn = bytes([0x31, 0x81, len(ava) + 3, 0x30, 0x81, len(ava)]) + ava
    der = bytes([0x30, 0x81, len(rdn)]) + rdn
    assert name_to_rfc2253(der) == "CN=" + "x" * 200


@pytest.mark.parametrize("der", [b"", b"\x30", b"\x30\x05\x31\x03", b"\x31\x00", b"\x30\x84\xff\xff\xff\xff",
                                 b"\x30\x03\x31\x01\x30"])
def test_malformed_names_raise(der: bytes) -> None:
    with pytest.raises(CertificateError):
        name_to_rfc2253(der)


def test_not_a_certificate_raises() -> None:
    with pytest.raises(CertificateError):
        certificate_subject(b"\x30\x03\x02\x01\x01")
