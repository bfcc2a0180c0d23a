"""PROXY protocol v1/v2 headers (HAProxy's proxy-protocol.txt), fed whole and byte by byte."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.proxy_protocol import (
    V2_SIGNATURE,
    ProxyHeader,
    ProxyHeaderError,
    encode_v1,
    encode_v2,
    parse_proxy_header,
)

KAFKA = b"\x00\x00\x00\x0a\x00\x12\x00\x03"   # what the client sends next: not part of the header


def feed_bytewise(data: bytes, versions: tuple[int, ...] = (1, 2)) -> ProxyHeader:
    """Every strict prefix asks for more; the whole gives the header."""
    for n in range(len(data)):
        try:
            got = parse_proxy_header(data[:n], versions)
        except ProxyHeaderError:
            raise AssertionError(f"prefix of {n} bytes rejected") from None
        if got is not None:
            return got
    raise AssertionError("never complete")


# ----------------------------------------------------------------------------- v1

def test_v1_tcp4_golden() -> None:
    line = b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n"
    assert parse_proxy_header(line + KAFKA) == ProxyHeader(1, len(line), ("192.168.0.1", 56324),
                                                           ("192.168.0.11", 443))


def test_v1_tcp6_golden() -> None:
    line = b"PROXY TCP6 2001:db8::1 2001:DB8:0:0:0:0:0:2 4711 9092\r\n"
    header = parse_proxy_header(line + KAFKA)
    assert header == ProxyHeader(1, len(line), ("2001:db8::1", 4711), ("2001:db8::2", 9092))


def test_v1_longest_line_is_107_bytes() -> None:
    full = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
    line = f"PROXY TCP6 {full} {full} 65535 65535\r\n".encode()
    assert len(line) == 104
    assert parse_proxy_header(line) == ProxyHeader(1, 104, ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 65535),
                                                   ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 65535))
    unknown = f"PROXY UNKNOWN {full} {full} 65535 65535\r\n".encode()
    assert len(unknown) == 107 and parse_proxy_header(unknown) == ProxyHeader(1, 107, None)


@pytest.mark.parametrize("line", [b"PROXY UNKNOWN\r\n", b"PROXY UNKNOWN anything at all\r\n"])
def test_v1_unknown_has_no_source(line: bytes) -> None:
    assert parse_proxy_header(line + KAFKA) == ProxyHeader(1, len(line), None)


def test_v1_needs_more_until_crlf() -> None:
    line = b"PROXY TCP4 10.0.0.1 10.0.0.2 1 2\r\n"
    assert feed_bytewise(line + KAFKA) == ProxyHeader(1, len(line), ("10.0.0.1", 1), ("10.0.0.2", 2))


@pytest.mark.parametrize("line", [
    b"PROXY TCP4 10.0.0.1 10.0.0.2 1 2\n",              # LF alone
    b"PROXY TCP4 10.0.0.1 10.0.0.2 1 2\rX",             # CR alone
    b"PROXY TCP4 010.0.0.1 10.0.0.2 1 2\r\n",           # leading zero in an octet
    b"PROXY TCP4 10.0.0.1 10.0.0.2 01 2\r\n",           # leading zero in a port
    b"PROXY TCP4 10.0.0.1 10.0.0.2 65536 2\r\n",        # port out of range
    b"PROXY TCP4 10.0.0.1 10.0.0.2 -1 2\r\n",
    b"PROXY TCP4 2001:db8::1 10.0.0.2 1 2\r\n",         # family mismatch
    b"PROXY TCP6 10.0.0.1 ::1 1 2\r\n",
    b"PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n",             # zone id
    b"PROXY TCP4  10.0.0.1 10.0.0.2 1 2\r\n",           # two spaces
    b"PROXY TCP4 10.0.0.1 10.0.0.2 1\r\n",              # a field missing
    b"PROXY UDP4 10.0.0.1 10.0.0.2 1 2\r\n",
    b"PROXY \xff\r\n",                                  # not ASCII
    b"PROXY TCP4 " + b"1" * 100,                        # no CRLF within 107 bytes
    b"proxy TCP4 10.0.0.1 10.0.0.2 1 2\r\n",            # lower case
    b"GET / HTTP/1.1\r\n",
    KAFKA,                                              # a Kafka client straight in
])
def test_v1_malformed(line: bytes) -> None:
    with pytest.raises(ProxyHeaderError):
        parse_proxy_header(line, (1,))


# ----------------------------------------------------------------------------- v2

def test_v2_tcp4_golden() -> None:
    data = b"".join([
        V2_SIGNATURE,                       # \r\n\r\n\0\r\nQUIT\n
        b"\x21",                            # version 2, command PROXY
        b"\x11",                            # AF_INET, STREAM
        struct.pack(">H", 12),              # 12 address bytes follow
        bytes([203, 0, 113, 7]),            # source 203.0.113.7
        bytes([10, 0, 0, 1]),               # destination 10.0.0.1
        struct.pack(">HH", 4711, 9092),     # ports
    ])
    assert parse_proxy_header(data + KAFKA) == ProxyHeader(2, 28, ("203.0.113.7", 4711), ("10.0.0.1", 9092))


def test_v2_tcp6_golden_with_tlvs() -> None:
    tlvs = b"\x02\x00\x03abc" + b"\x04\x00\x00"          # PP2_TYPE_AUTHORITY "abc", a NOOP
    data = b"".join([
        V2_SIGNATURE, b"\x21",
        b"\x21",                                          # AF_INET6, STREAM
        struct.pack(">H", 36 + len(tlvs)),
        bytes.fromhex("20010db8000000000000000000000001"),  # source 2001:db8::1
        bytes.fromhex("00000000000000000000000000000001"),  # destination ::1
        struct.pack(">HH", 50000, 9093),
        tlvs,                                             # skipped
    ])
    header = feed_bytewise(data + KAFKA)
    assert header == ProxyHeader(2, len(data), ("2001:db8::1", 50000), ("::1", 9093))


@pytest.mark.parametrize(("fam", "body"), [
    (0x00, b""),                      # LOCAL with AF_UNSPEC (a health check)
    (0x11, bytes(12)),                # LOCAL must ignore any addresses present
])
def test_v2_local_has_no_source(fam: int, body: bytes) -> None:
    data = V2_SIGNATURE + bytes([0x20, fam]) + struct.pack(">H", len(body)) + body
    assert parse_proxy_header(data + KAFKA) == ProxyHeader(2, len(data), None)


@pytest.mark.parametrize(("fam", "body"), [(0x00, b""), (0x31, bytes(216)), (0x10, bytes(12))])
def test_v2_proxy_without_an_ip_has_no_source(fam: int, body: bytes) -> None:
    data = V2_SIGNATURE + bytes([0x21, fam]) + struct.pack(">H", len(body)) + body
    assert parse_proxy_header(data) == ProxyHeader(2, len(data), None)


def test_v2_udp_still_names_the_source() -> None:
    addresses = bytes([1, 2, 3, 4, 5, 6, 7, 8]) + b"\x00\x01\x00\x02"
    data = V2_SIGNATURE + b"\x21\x12" + struct.pack(">H", 12) + addresses       # PROXY, UDP over IPv4
    assert parse_proxy_header(data) == ProxyHeader(2, 28, ("1.2.3.4", 1), ("5.6.7.8", 2))


@pytest.mark.parametrize("data", [
    V2_SIGNATURE + b"\x11\x11\x00\x0c" + bytes(12),       # version 1 in the v2 layout
    V2_SIGNATURE + b"\x22\x11\x00\x0c" + bytes(12),       # command 2
    V2_SIGNATURE + b"\x21\x41\x00\x0c" + bytes(12),       # family 4
    V2_SIGNATURE + b"\x21\x13\x00\x0c" + bytes(12),       # protocol 3
    V2_SIGNATURE + b"\x21\x11\x00\x08" + bytes(8),        # too short for IPv4 addresses
    V2_SIGNATURE + b"\x21\x21\x00\x0c" + bytes(12),       # too short for IPv6 addresses
    b"\r\n\r\n\x00\r\nQUIT!",                             # signature broken
])
def test_v2_malformed(data: bytes) -> None:
    with pytest.raises(ProxyHeaderError):
        parse_proxy_header(data, (2,))


def test_v2_waits_for_its_length() -> None:
    data = encode_v2(("192.0.2.5", 1000), ("192.0.2.6", 9092), tlvs=b"\x04\x00\x05hello")
    assert parse_proxy_header(data[:-1]) is None
    assert parse_proxy_header(data) == ProxyHeader(2, len(data), ("192.0.2.5", 1000), ("192.0.2.6", 9092))


# ----------------------------------------------------------------------------- versions

def test_a_version_not_accepted_is_malformed() -> None:
    with pytest.raises(ProxyHeaderError, match="v2 header"):
        parse_proxy_header(encode_v1(("10.0.0.1", 1), ("10.0.0.2", 2)), (2,))
    with pytest.raises(ProxyHeaderError, match="v1 header"):
        parse_proxy_header(encode_v2(("10.0.0.1", 1), ("10.0.0.2", 2)), (1,))


def test_empty_input_needs_more() -> None:
    assert parse_proxy_header(b"") is None


@given(st.sampled_from(["v1", "v2"]), st.ip_addresses(), st.integers(0, 65535), st.binary(max_size=20))
def test_encode_parse_round_trip(version: str, source: object, port: int, rest: bytes) -> None:
    address = str(source)
    destination = ("::1" if ":" in address else "127.0.0.1", 9092)
    data = (encode_v1 if version == "v1" else encode_v2)((address, port), destination)
    header = parse_proxy_header(data + rest)
    assert header is not None and header.source == (address, port) and header.consumed == len(data)
