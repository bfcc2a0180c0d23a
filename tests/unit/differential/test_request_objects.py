"""The per-request objects the compiled request side makes without running their constructors
(`protocol/_slots.pxd`): a request header (`protocol._speedups.read_request_header`) and an
in-flight entry (`proxy.pumps._speedups.make_entry`, the one `RequestReader` makes), each against
the dataclass's own constructor. Every field must hold what the constructor puts there (the
declared defaults included), and the object must behave as one the constructor made: compared,
hashed (the frozen header), written and read (the entry's slots, which stages write)."""

from __future__ import annotations

import dataclasses
import struct

from hypothesis import given
from hypothesis import strategies as st

from protocol.headers import RequestHeader
from protocol.headers import read_request_header as pure_read_request_header
from proxy.flow.inflight import InFlight
from proxy.pumps import responses
from tests.unit.differential.impls import built, compiled

client_ids = st.one_of(st.none(), st.text(max_size=20))


@given(correlation_id=st.integers(-2**31, 2**31 - 1), api_key=st.integers(0, 80),
       api_version=st.integers(0, 20), client_id=client_ids, request_bytes=st.integers(0, 2**30),
       received_ms=st.integers(0, 2**45), expects_response=st.booleans())
def test_an_entry_made_in_c_is_the_one_the_constructor_makes(
        correlation_id: int, api_key: int, api_version: int, client_id: str | None, request_bytes: int,
        received_ms: int, expects_response: bool) -> None:
    module = built(responses.COMPILED_MODULE, "proxy.pumps._speedups")
    args = (correlation_id, api_key, api_version, client_id, request_bytes, received_ms)
    made = module.make_entry(*args, expects_response=expects_response)
    expected = InFlight(*args, expects_response=expects_response)
    assert type(made) is InFlight
    for f in dataclasses.fields(InFlight):  # every slot filled: none raises AttributeError
        assert getattr(made, f.name) == getattr(expected, f.name), f.name
        assert type(getattr(made, f.name)) is type(getattr(expected, f.name)), f.name
    assert made == expected and repr(made) == repr(expected)
    made.response, made.mutes_channel = b"x", True  # a stage writes its slots as on any entry
    expected.response, expected.mutes_channel = b"x", True
    assert made == expected
    assert made.answer(b"yy", 5) is None and made.response_bytes == 2 and not made.forwarded


@given(api_key=st.integers(0, 80), api_version=st.integers(0, 20),
       correlation_id=st.integers(-2**31, 2**31 - 1), client_id=st.one_of(st.none(), st.binary(max_size=30)),
       body=st.binary(max_size=8))
def test_a_header_made_in_c_is_the_one_the_constructor_makes(
        api_key: int, api_version: int, correlation_id: int, client_id: bytes | None, body: bytes) -> None:
    prefix = struct.pack(">hhi", api_key, api_version, correlation_id)
    payload = prefix + (struct.pack(">h", -1) if client_id is None
                        else struct.pack(">h", len(client_id)) + client_id) + b"\x00" + body
    expected = pure_read_request_header(payload)  # a well-formed header (an empty tag section if flexible)
    made = compiled().read_request_header(payload)
    assert type(made) is RequestHeader
    assert dataclasses.astuple(made) == dataclasses.astuple(expected)
    assert made == expected and hash(made) == hash(expected) and repr(made) == repr(expected)
    try:
        made.api_key = 1  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("a header made in C must stay frozen")
