"""A certificate's subject as Kafka sees it: Java's `X500Principal.getName()` (RFC 2253 form).

Kafka maps a TLS client to a principal from `SSLSession.getPeerPrincipal().getName()`, so the
mapping rules (`protocol.principal_rules`) are written against that exact string. This module
reads the subject out of a DER certificate and prints it the way the JDK's `sun.security.x509`
does (`X500Name.getRFC2253Name`, `RDN.toRFC2253String`, `AVA.toRFC2253String`):

* RDNs in reverse order of the encoding (most specific first), joined with ``,``; the attributes of
  a multi-valued RDN in encoding order, joined with ``+``;
* the RFC 2253 keywords CN, C, L, ST, O, OU, STREET, DC, UID; any other attribute type as its dotted
  OID (``1.2.840.113549.1.9.1=#1611...`` for an e-mail address);
* a value of a string type (UTF8, Printable, IA5, T61, General, BMP) as its bytes read as UTF-8,
  with ``, = + < > # ; " \\`` escaped by a backslash, NUL as ``\\00`` and leading or trailing
  spaces (and CRs) escaped; any other value, and every value of a dotted-OID attribute, as ``#``
  and the lowercase hex of its DER encoding.

Only the DER needed to reach the subject is parsed; anything malformed raises `CertificateError`.
"""

from __future__ import annotations

from typing import Final

from protocol.errors import ProtocolError

_SEQUENCE, _SET, _OID = 0x30, 0x31, 0x06
_STRING_TAGS: Final = frozenset({0x0C, 0x13, 0x14, 0x16, 0x1B, 0x1E})  # UTF8 Printable T61 IA5 General BMP
_KEYWORDS: Final = {
    "2.5.4.3": "CN", "2.5.4.6": "C", "2.5.4.7": "L", "2.5.4.8": "ST", "2.5.4.10": "O",
    "2.5.4.11": "OU", "2.5.4.9": "STREET", "0.9.2342.19200300.100.1.25": "DC",
    "0.9.2342.19200300.100.1.1": "UID",
}
_ESCAPED: Final = frozenset(',=+<>#;"\\')


class CertificateError(ProtocolError):
    """The certificate's DER could not be read far enough to find its subject."""


def _tlv(der: bytes, pos: int, end: int) -> tuple[int, int, int, int]:
    """(tag, content start, content end, element end) of the element at `pos`."""
    if pos + 2 > end:
        raise CertificateError(f"truncated DER element at offset {pos}")
    tag = der[pos]
    if tag & 0x1F == 0x1F:
        raise CertificateError(f"multi-byte DER tag at offset {pos}")
    first = der[pos + 1]
    pos += 2
    if first < 0x80:
        length = first
    else:
        count = first & 0x7F
        if count == 0 or count > 4 or pos + count > end:
            raise CertificateError(f"bad DER length at offset {pos - 1}")
        length = int.from_bytes(der[pos:pos + count], "big")
        pos += count
    if pos + length > end:
        raise CertificateError(f"DER element at offset {pos} runs past its container")
    return tag, pos, pos + length, pos + length


def _expect(der: bytes, pos: int, end: int, tag: int, what: str) -> tuple[int, int, int]:
    got, start, stop, after = _tlv(der, pos, end)
    if got != tag:
        raise CertificateError(f"{what}: expected DER tag 0x{tag:02x}, found 0x{got:02x}")
    return start, stop, after


def _oid(content: bytes) -> str:
    if not content:
        raise CertificateError("empty OID")
    arcs: list[int] = []
    value = 0
    for byte in content:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            arcs.append(value)
            value = 0
    if content[-1] & 0x80:
        raise CertificateError("truncated OID")
    first = arcs[0]
    head = [0, first] if first < 40 else [1, first - 40] if first < 80 else [2, first - 80]
    return ".".join(str(a) for a in head + arcs[1:])


def _value(oid: str, der: bytes, tag: int, start: int, stop: int, element_start: int) -> str:
    keyword = _KEYWORDS.get(oid)
    if keyword is None or tag not in _STRING_TAGS:
        return f"{keyword or oid}=#{der[element_start:stop].hex()}"
    text = str(der[start:stop], "utf-8", "replace")
    escaped = "".join("\\" + c if c in _ESCAPED else "\\00" if c == "\x00" else c for c in text)
    # then every leading and trailing space (or CR) gets a backslash too
    lead, trail = 0, len(escaped) - 1
    while lead < len(escaped) and escaped[lead] in " \r":
        lead += 1
    while trail >= 0 and escaped[trail] in " \r":
        trail -= 1
    return f"{keyword}=" + "".join("\\" + c if i < lead or i > trail else c for i, c in enumerate(escaped))


def name_to_rfc2253(der: bytes, start: int = 0, end: int | None = None) -> str:
    """A DER `Name` (SEQUENCE OF SET OF AttributeTypeAndValue) as Java's RFC 2253 string."""
    end = len(der) if end is None else end
    seq_start, seq_stop, _ = _expect(der, start, end, _SEQUENCE, "Name")
    rdns: list[str] = []
    pos = seq_start
    while pos < seq_stop:
        set_start, set_stop, pos = _expect(der, pos, seq_stop, _SET, "RelativeDistinguishedName")
        avas: list[str] = []
        p = set_start
        while p < set_stop:
            ava_start, ava_stop, p = _expect(der, p, set_stop, _SEQUENCE, "AttributeTypeAndValue")
            oid_start, oid_stop, value_pos = _expect(der, ava_start, ava_stop, _OID, "attribute type")
            tag, v_start, v_stop, _ = _tlv(der, value_pos, ava_stop)
            avas.append(_value(_oid(der[oid_start:oid_stop]), der, tag, v_start, v_stop, value_pos))
        rdns.append("+".join(avas))
    return ",".join(reversed(rdns))


def certificate_subject(der: bytes) -> str:
    """The subject of a DER X.509 certificate, as `X500Principal.getName()` prints it."""
    cert_start, cert_stop, _ = _expect(der, 0, len(der), _SEQUENCE, "Certificate")
    tbs_start, tbs_stop, _ = _expect(der, cert_start, cert_stop, _SEQUENCE, "TBSCertificate")
    pos = tbs_start
    tag, _, _, after = _tlv(der, pos, tbs_stop)
    if tag == 0xA0:                  # [0] EXPLICIT version
        pos = after
    for _field in range(4):          # serialNumber, signature, issuer, validity
        pos = _tlv(der, pos, tbs_stop)[3]
    return name_to_rfc2253(der, pos, tbs_stop)
