"""Every input the fuzzers found that raised something other than a ProtocolError, pinned.

Each case names the target, the input and what it raised before the fix.
"""

from __future__ import annotations

import pytest

from protocol.errors import DecodeError
from protocol.log_dirs import parse_brokers, parse_log_dirs
from protocol.records import produce_response_errors, topic_ids_from_metadata_response
from tests.fuzz.targets import BY_NAME

# (target, input, what escaped before the fix)
FOUND = [
    ("log_dirs", b"", "struct.error: unpack_from requires a buffer of at least 4 bytes"),
    ("log_dirs", b"\x00\x00\x01", "struct.error (a response shorter than its correlation id)"),
    # atheris: a Produce v9 response whose partition error_code is cut after its first (non-zero) byte
    ("produce", bytes.fromhex("090000f8ff003d002000f8ff003d"), "struct.error at throttle.py _note_error"),
    # atheris: kio reads a null array as None; the callers iterated it
    ("log_dirs", bytes.fromhex("0102030400000000000000ff00ffff0100"), "TypeError: brokers is None"),
    ("log_dirs", bytes.fromhex("01023704000000fd0100000000"), "TypeError: results is None"),
    ("quota_client", bytes.fromhex("0000000c000000010000000101000000ff00ff00ff01ff0100"),
     "TypeError: ApiVersions api_keys is None"),
    # atheris (1,020,000-input run): a Metadata v12 response whose topics array is null (-1)
    ("records", bytes.fromhex("0c0102030400000000000100ffffffff0000"),
     "TypeError at records.py topic_ids_from_metadata_response: topics is None"),
    # atheris: kio 0.6.5's native reader preallocated a declared array length and aborted the whole
    # process; the length checks of commit 5080350 refuse these before kio sees them
    ("records", bytes.fromhex(
        "0c01020304000000000001009d9d9d9d9d9d9d9d0cba0102ffff1201a80000009d9d9d9d9d9d9d9d9d9d9d9d9d9d9d9d636262669d9d9d9d9d9d9d9d9d9d9d9d9d9d9d9d9d9d9dc29d9d9d9d9d9d9d9d9d00000000000000ffffffff0100"),
     "kio native reader aborted the process (array length it could not allocate)"),
    ("admin_requests", bytes.fromhex(
        "d802cfcfcfcf3100"),
     "kio native reader aborted the process (array length it could not allocate)"),
    ("admin_responses", bytes.fromhex(
        "0204010000ffffffffffffff0f00"),
     "kio native reader aborted the process (array length it could not allocate)"),
    ("log_dirs", bytes.fromhex(
        "fa00000000ffffffffffffffff6001"),
     "kio native reader aborted the process (array length it could not allocate)"),
    ("quota_client", bytes.fromhex(
        "0000000c000000010000fdededed1200"),
     "kio native reader aborted the process (array length it could not allocate)"),
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


def test_a_produce_response_cut_inside_an_error_code_is_a_decode_error() -> None:
    """The v9+ walk's fast path tested the error code's first byte and read two past the end."""
    payload = bytes.fromhex("0000f8ff003d002000f8ff003d")
    with pytest.raises(DecodeError, match="truncated produce v9 response"):
        produce_response_errors(payload, 9)


def test_a_metadata_response_with_a_null_topics_array_has_no_topic_ids() -> None:
    """kio reads a null array as None; the topic-id map (used for Produce v13 / Fetch v13+ names on
    the loop and in the access-log writer) iterated it and raised TypeError."""
    payload = bytes.fromhex(
        "01020304"      # correlation_id
        "00"            # response header tagged fields: none
        "00000000"      # throttle_time_ms
        "01"            # brokers: compact array of 0
        "00"            # cluster_id: null
        "ffffffff"      # controller_id: -1
        "00"            # topics: null (compact length 0)
        "00")           # tagged fields: none
    assert topic_ids_from_metadata_response(payload, 12) == {}
