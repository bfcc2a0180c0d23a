"""Every input the fuzzers found that raised something other than a ProtocolError, pinned.

Each case names the target, the input and what it raised before the fix.
"""

from __future__ import annotations

import pytest

from protocol.errors import DecodeError
from protocol.log_dirs import parse_brokers, parse_log_dirs
from tests.fuzz.targets import BY_NAME

# (target, input, what escaped before the fix)
FOUND = [
    ("log_dirs", b"", "struct.error: unpack_from requires a buffer of at least 4 bytes"),
    ("log_dirs", b"\x00\x00\x01", "struct.error (a response shorter than its correlation id)"),
]


@pytest.mark.parametrize(("target", "data", "before"), FOUND, ids=[f"{t}-{i}" for i, (t, _, _) in
                                                                   enumerate(FOUND)])
def test_found_inputs_raise_only_protocol_errors(target: str, data: bytes, before: str) -> None:
    BY_NAME[target].call(data)


@pytest.mark.parametrize("data", [b"", b"\x00", b"\x00\x00\x00"])
def test_a_short_storage_response_is_a_decode_error(data: bytes) -> None:
    """The disk-usage guard's reads of a broker's answer (protocol.log_dirs): too short for a
    correlation id is a DecodeError the guard handles, not a struct.error that escapes it."""
    with pytest.raises(DecodeError, match="correlation_id"):
        parse_log_dirs(data, 1)
    with pytest.raises(DecodeError, match="correlation_id"):
        parse_brokers(data, 1)
