"""The PROXY protocol header (HAProxy's proxy-protocol.txt, versions 1 and 2), sans-IO.

A load balancer that relays TCP connects to Sluice and, before any of the client's bytes, sends one
header naming the real client ("source") and the address the client connected to ("destination"):

* v1, text, at most 107 bytes: ``PROXY TCP4 192.0.2.1 198.51.100.7 56324 9092\\r\\n`` (or ``TCP6``,
  or ``UNKNOWN`` followed by anything up to the CRLF);
* v2, binary: the 12-byte signature ``\\r\\n\\r\\n\\0\\r\\nQUIT\\n``, version/command, family/protocol,
  a 16-bit length, then the addresses and optional TLVs (skipped here).

`parse_proxy_header` is fed the bytes received so far and returns None while more are needed, a
`ProxyHeader` once the header is complete (with how many bytes it used: the rest are the client's),
or raises `ProxyHeaderError` as soon as the bytes cannot be a valid header of an accepted version.
A header is required: guessing whether one is present would let anyone spoof an address.

``UNKNOWN`` (v1), ``LOCAL`` (v2, e.g. health checks) and address families without an IP (v2
``AF_UNSPEC``/``AF_UNIX``) carry no client address: `source` is None and the connection's own peer
address applies, as the specification says.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

from protocol.errors import ProtocolError

V1_PREFIX: Final = b"PROXY "
V1_MAX_BYTES: Final = 107
V2_SIGNATURE: Final = b"\r\n\r\n\x00\r\nQUIT\n"
V2_FIXED_BYTES: Final = 16
_V2_FIXED: Final = struct.Struct(">12sBBH")

_AF_UNSPEC, _AF_INET, _AF_INET6, _AF_UNIX = 0x0, 0x1, 0x2, 0x3
_ADDRESS_BYTES: Final = {_AF_INET: 12, _AF_INET6: 36, _AF_UNIX: 216}


class ProxyHeaderError(ProtocolError):
    """Bytes that are not a valid PROXY protocol header (of an accepted version)."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    version: int                              # 1 or 2
    consumed: int                             # header bytes; what follows is the client's data
    source: tuple[str, int] | None            # the real client (IP, port); None: use the peer
    destination: tuple[str, int] | None = None


def parse_proxy_header(data: bytes | bytearray | memoryview,
                       versions: Collection[int] = (1, 2)) -> ProxyHeader | None:
    """Parse a PROXY header at the start of `data`; None if more bytes are needed."""
    if not data:
        return None
    head = bytes(data[:12])
    if 1 in versions and V1_PREFIX.startswith(head[:6]):     # "PROXY " or a start of it
        return _parse_v1(bytes(data[:V1_MAX_BYTES])) if len(data) >= 6 else None
    if 2 in versions and V2_SIGNATURE.startswith(head):       # the signature or a start of it
        return _parse_v2(data)
    accepted = " or ".join(f"v{v}" for v in sorted(versions))
    raise ProxyHeaderError(f"connection does not start with a PROXY protocol {accepted} header")


def _parse_v1(data: bytes) -> ProxyHeader | None:
    end = data.find(b"\r\n", 0, V1_MAX_BYTES)
    if end < 0:
        if len(data) >= V1_MAX_BYTES:
            raise ProxyHeaderError(f"PROXY v1 header has no CRLF in its first {V1_MAX_BYTES} bytes")
        if b"\n" in data or (b"\r" in data and not data.endswith(b"\r")):
            raise ProxyHeaderError("PROXY v1 header line is not ended by CRLF")
        return None
    try:
        line = data[:end].decode("ascii")
    except UnicodeDecodeError:
        raise ProxyHeaderError("PROXY v1 header is not US-ASCII") from None
    parts = line.split(" ")
    consumed = end + 2
    if len(parts) >= 2 and parts[1] == "UNKNOWN":
        return ProxyHeader(1, consumed, None)   # whatever follows UNKNOWN is ignored
    if len(parts) != 6 or parts[1] not in ("TCP4", "TCP6"):
        raise ProxyHeaderError("PROXY v1 header is not 'PROXY TCP4|TCP6 src dst sport dport'")
    family = 4 if parts[1] == "TCP4" else 6
    src = _v1_address(parts[2], family)
    dst = _v1_address(parts[3], family)
    return ProxyHeader(1, consumed, (src, _v1_port(parts[4])), (dst, _v1_port(parts[5])))


def _v1_address(text: str, family: int) -> str:
    try:
        if "%" in text:  # no zone ids
            raise ValueError
        address = ipaddress.IPv4Address(text) if family == 4 else ipaddress.IPv6Address(text)
    except ValueError:
        raise ProxyHeaderError(f"PROXY v1 header has an invalid IPv{family} address") from None
    return str(address)


def _v1_port(text: str) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 5 or (len(text) > 1 and text[0] == "0"):
        raise ProxyHeaderError("PROXY v1 header has an invalid port")
    port = int(text)
    if port > 65535:
        raise ProxyHeaderError("PROXY v1 header has an invalid port")
    return port


def _parse_v2(data: bytes | bytearray | memoryview) -> ProxyHeader | None:
    if len(data) < V2_FIXED_BYTES:
        return None
    _sig, ver_cmd, fam, length = _V2_FIXED.unpack_from(data, 0)
    if ver_cmd >> 4 != 2:
        raise ProxyHeaderError(f"PROXY v2 header has version {ver_cmd >> 4}, expected 2")
    command = ver_cmd & 0x0F
    if command > 1:
        raise ProxyHeaderError(f"PROXY v2 header has an unassigned command {command}")
    family, transport = fam >> 4, fam & 0x0F
    if family > _AF_UNIX or transport > 2:
        raise ProxyHeaderError(f"PROXY v2 header has an invalid family/protocol byte 0x{fam:02x}")
    consumed = V2_FIXED_BYTES + length
    if len(data) < consumed:
        return None
    if command == 0 or family in (_AF_UNSPEC, _AF_UNIX) or transport == 0:
        return ProxyHeader(2, consumed, None)   # LOCAL, or no IP address: the peer's applies
    need = _ADDRESS_BYTES[family]
    if length < need:
        raise ProxyHeaderError(f"PROXY v2 header is {length} bytes, too short for its addresses ({need})")
    block = bytes(data[V2_FIXED_BYTES:V2_FIXED_BYTES + need])
    if family == _AF_INET:
        src: str = str(ipaddress.IPv4Address(block[0:4]))
        dst: str = str(ipaddress.IPv4Address(block[4:8]))
        sport, dport = struct.unpack_from(">HH", block, 8)
    else:
        src = str(ipaddress.IPv6Address(block[0:16]))
        dst = str(ipaddress.IPv6Address(block[16:32]))
        sport, dport = struct.unpack_from(">HH", block, 32)
    return ProxyHeader(2, consumed, (src, sport), (dst, dport))


def encode_v1(source: tuple[str, int], destination: tuple[str, int]) -> bytes:
    """A v1 header (for tests and tools)."""
    family = "TCP6" if ipaddress.ip_address(source[0]).version == 6 else "TCP4"
    return f"PROXY {family} {source[0]} {destination[0]} {source[1]} {destination[1]}\r\n".encode("ascii")


def encode_v2(source: tuple[str, int] | None, destination: tuple[str, int] | None = None,
              tlvs: bytes = b"") -> bytes:
    """A v2 header: PROXY over TCP for the addresses given, LOCAL without them."""
    if source is None or destination is None:
        return _V2_FIXED.pack(V2_SIGNATURE, 0x20, 0x00, len(tlvs)) + tlvs
    src, dst = ipaddress.ip_address(source[0]), ipaddress.ip_address(destination[0])
    fam = 0x21 if src.version == 6 else 0x11
    block = src.packed + dst.packed + struct.pack(">HH", source[1], destination[1]) + tlvs
    return _V2_FIXED.pack(V2_SIGNATURE, 0x21, fam, len(block)) + block
