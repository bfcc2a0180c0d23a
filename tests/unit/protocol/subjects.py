"""Certificate subjects with every escaping case of Java's `X500Principal.getName()`, and what it
prints for each (checked against the JDK by tests/integration/test_principal_oracle.py)."""

from __future__ import annotations

import datetime as dt

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.name import _ASN1Type
from cryptography.x509.oid import NameOID

A = x509.NameAttribute
N = NameOID

# name -> (subject in encoding order, what Java prints)
SUBJECTS: dict[str, tuple[x509.Name, str]] = {
    "simple": (x509.Name([A(N.ORGANIZATION_NAME, "Sluice"), A(N.COMMON_NAME, "alice")]),
               "CN=alice,O=Sluice"),
    # , = + < > # ; " \ are escaped wherever they are
    "specials": (x509.Name([A(N.COMMON_NAME, 'a,b+c=d#e;f"g\\h<i>j')]),
                 'CN=a\\,b\\+c\\=d\\#e\\;f\\"g\\\\h\\<i\\>j'),
    # every leading/trailing space gets a backslash; inner ones do not
    "spaces": (x509.Name([A(N.COMMON_NAME, "  lead"), A(N.ORGANIZATIONAL_UNIT_NAME, "trail  "),
                          A(N.ORGANIZATION_NAME, "in side")]),
               "O=in side,OU=trail\\ \\ ,CN=\\ \\ lead"),
    "all-spaces": (x509.Name([A(N.COMMON_NAME, "   ")]), "CN=\\ \\ \\ "),
    "trailing-cr": (x509.Name([A(N.COMMON_NAME, "x\r")]), "CN=x\\\r"),
    "nul": (x509.Name([A(N.COMMON_NAME, "a\x00b")]), "CN=a\\00b"),
    "hash": (x509.Name([A(N.COMMON_NAME, "#hash")]), "CN=\\#hash"),
    # a multi-valued RDN keeps its encoding order
    "multi-valued": (x509.Name([x509.RelativeDistinguishedName([A(N.COMMON_NAME, "a"), A(N.USER_ID, "b")])]),
                     "CN=a+UID=b"),
    # attributes without an RFC 2253 keyword: dotted OID and the hex of the DER value
    "email": (x509.Name([A(N.COMMON_NAME, "e"), A(N.EMAIL_ADDRESS, "e@example.com")]),
              "1.2.840.113549.1.9.1=#160d65406578616d706c652e636f6d,CN=e"),
    "serial-title-names": (x509.Name([A(N.SERIAL_NUMBER, "1234"), A(N.TITLE, "boss"), A(N.GIVEN_NAME, "G"),
                                      A(N.SURNAME, "S")]),
                           "2.5.4.4=#0c0153,2.5.4.42=#0c0147,2.5.4.12=#0c04626f7373,2.5.4.5=#130431323334"),
    "utf8": (x509.Name([A(N.COMMON_NAME, "Zoë 日本")]), "CN=Zoë 日本"),
    "all-keywords": (x509.Name([A(N.DOMAIN_COMPONENT, "com"), A(N.DOMAIN_COMPONENT, "example"),
                                A(N.COUNTRY_NAME, "US"), A(N.STATE_OR_PROVINCE_NAME, "MD"),
                                A(N.LOCALITY_NAME, "Fulton"), A(N.STREET_ADDRESS, "1 Main St"),
                                A(N.ORGANIZATIONAL_UNIT_NAME, "SME"), A(N.COMMON_NAME, "Duke")]),
                     "CN=Duke,OU=SME,STREET=1 Main St,L=Fulton,ST=MD,C=US,DC=example,DC=com"),
    "printable": (x509.Name([A(N.COMMON_NAME, "print", _type=_ASN1Type.PrintableString)]), "CN=print"),
    "ia5": (x509.Name([A(N.COMMON_NAME, "ia5", _type=_ASN1Type.IA5String)]), "CN=ia5"),
    # the JDK reads a BMPString's UTF-16 bytes as UTF-8: NULs, escaped as \00
    "bmp": (x509.Name([A(N.COMMON_NAME, "bmp", _type=_ASN1Type.BMPString)]), "CN=\\00b\\00m\\00p"),
    "empty": (x509.Name([]), ""),
}


def der_certificate(subject: x509.Name) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject)
            .issuer_name(x509.Name([A(N.COMMON_NAME, "Test CA")])).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.DER)
