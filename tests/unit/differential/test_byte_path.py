"""The compiled data plane (protocol._speedups) against its pure-Python reference, byte for byte.

Hypothesis feeds the same byte streams to both: valid Kafka frames (kio builds the responses), the
same frames cut into arbitrary chunks, and corrupted or truncated ones. Both must return the same
frames, headers, acks, offsets and patched responses, and raise the same error with the same message.
"""

from __future__ import annotations

import itertools
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_response_schema

from protocol import fastpath
from protocol._wire import encode_uvarint
from protocol.apis import ApiKey, is_flexible, request_header_version
from protocol.errors import ProtocolError
from protocol.headers import RequestHeader
from tests.unit.differential.impls import PURE, compiled, outcome
from tests.unit.protocol.kio_support import (
    KIO_EXAMPLES,
    kio_api_keys,
    kio_entities,
    kio_versions,
    response_payload,
)
from tests.unit.protocol.test_rewrite import body_with_endpoints

I32 = struct.Struct(">i")
SETTINGS = settings(max_examples=100, deadline=None)


def test_the_selector_uses_the_compiled_twin_unless_told_otherwise() -> None:
    import os

    impl = compiled()
    if os.environ.get("SLUICE_PURE_PYTHON"):
        assert fastpath.IMPLEMENTATION == "pure"
        assert fastpath.FrameSplitter is PURE.FrameSplitter
    else:
        assert fastpath.IMPLEMENTATION == "compiled"
        assert fastpath.FrameSplitter is impl.FrameSplitter
        assert fastpath.read_request_header is impl.read_request_header
        assert fastpath.patch_throttle_time is impl.patch_throttle_time


# --- framing ------------------------------------------------------------------------------------

payloads = st.lists(st.binary(max_size=300), max_size=8)


def _stream(frames: list[bytes]) -> bytes:
    return b"".join(I32.pack(len(f)) + f for f in frames)


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def _drain(splitter: Any) -> list[Any]:
    out: list[Any] = []
    while True:
        result = outcome(splitter.next_frame)
        out.append(result)
        if result[0] == "raised" or result[1] is None:
            return out


@pytest.mark.both_twins
@SETTINGS
@given(frames=payloads, cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=12),
       kinds=st.lists(st.sampled_from([bytes, bytearray, memoryview]), min_size=1))
def test_framing_whole_frames_in_any_chunks(frames: list[bytes], cuts: list[int], kinds: list[type]) -> None:
    data = _stream(frames)
    pure, fast = PURE.FrameSplitter(), compiled().FrameSplitter()
    got_pure: list[Any] = []
    got_fast: list[Any] = []
    for i, chunk in enumerate(_chunks(data, cuts)):
        piece = kinds[i % len(kinds)](chunk)
        pure.feed(piece)
        fast.feed(piece)
        got_pure += _drain(pure)
        got_fast += _drain(fast)
        assert pure.buffered_bytes == fast.buffered_bytes
    assert got_fast == got_pure
    assert [r[1] for r in got_fast if r[1] is not None] == frames  # and both are right


@pytest.mark.both_twins
@SETTINGS
@given(data=st.binary(max_size=200), max_frame=st.integers(min_value=0, max_value=64),
       cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=6))
def test_framing_garbage_and_limits(data: bytes, max_frame: int, cuts: list[int]) -> None:
    pure, fast = PURE.FrameSplitter(max_frame), compiled().FrameSplitter(max_frame)
    for chunk in _chunks(data, cuts):
        pure.feed(chunk)
        fast.feed(chunk)
        assert _drain(fast) == _drain(pure)


@pytest.mark.both_twins
@SETTINGS
@given(frames=st.lists(st.binary(max_size=100), min_size=1, max_size=6),
       ops=st.lists(st.tuples(st.sampled_from(["pending", "partial", "next", "unread", "feed", "read"]),
                              st.integers(min_value=0, max_value=120)), max_size=20),
       max_frame=st.sampled_from([100, 2**20, 2**31 - 1]), big=st.integers(min_value=0, max_value=70_000))
def test_framing_cut_through_and_unread(frames: list[bytes], ops: list[tuple[str, int]], max_frame: int,
                                        big: int) -> None:
    """pending_frame / take_partial (a streamed Fetch), unread (SASL), feed and reads into the
    splitter's own room (get_buffer, buffer_updated) in any order, on both: the same frames, the
    same room offered, the same capacity kept."""
    data = _stream([*frames, (bytes(range(251)) * (big // 251 + 1))[:big]]) * 3  # a large one grows the room
    pure, fast = PURE.FrameSplitter(max_frame), compiled().FrameSplitter(max_frame)
    fed = 0
    taken: list[bytes] = []
    for op, n in ops:
        if op == "feed":
            piece, fed = data[fed : fed + n], min(fed + n, len(data))
            pure.feed(piece)
            fast.feed(piece)
        elif op == "read":  # as the event loop does: the room, n * 300 bytes of the stream into it
            rooms = [memoryview(s.get_buffer(-1)) for s in (pure, fast)]
            assert rooms[0].nbytes == rooms[1].nbytes > 0
            piece = data[fed : fed + min(n * 300, rooms[0].nbytes)]
            fed += len(piece)
            for room, splitter in zip(rooms, (pure, fast), strict=True):
                room[: len(piece)] = piece
                room.release()
                splitter.buffer_updated(len(piece))
        elif op == "pending":
            assert outcome(fast.pending_frame, n) == outcome(pure.pending_frame, n)
        elif op == "partial":  # a bad size at the front raises: both the same way, and nothing is taken
            pending = outcome(pure.pending_frame, 0)
            assert outcome(fast.pending_frame, 0) == pending
            if pending[0] == "ok" and pending[1] is not None:
                assert fast.take_partial() == pure.take_partial()
        elif op == "next":
            got = outcome(pure.next_frame)
            assert outcome(fast.next_frame) == got
            if got[0] == "ok" and got[1] is not None:
                taken.append(got[1])
        else:
            back = taken[-(n % 3):] if taken else []
            pure.unread(back)
            fast.unread(back)
        assert fast.buffered_bytes == pure.buffered_bytes
        assert fast.capacity_bytes == pure.capacity_bytes


@pytest.mark.both_twins
def test_framing_errors_match_exactly() -> None:
    for splitter in (PURE.FrameSplitter, compiled().FrameSplitter):
        with pytest.raises(ValueError, match="max_frame_bytes"):
            splitter(-1)
    for data in (b"\xff\xff\xff\xfe", b"\x00\x00\x01\x00"):  # negative; over the 16-byte limit
        pure, fast = PURE.FrameSplitter(16), compiled().FrameSplitter(16)
        pure.feed(data)
        fast.feed(data)
        assert _drain(fast) == _drain(pure)
        assert _drain(fast)[0][0] == "raised"


# --- request headers and Produce acks -----------------------------------------------------------

api_keys = st.one_of(st.sampled_from(sorted(ApiKey)), st.integers(min_value=-(2**15), max_value=2**15 - 1))


@st.composite
def request_frames(draw: st.DrawFn) -> bytes:
    api_key = int(draw(api_keys))
    api_version = draw(st.one_of(st.integers(min_value=0, max_value=20),
                                 st.integers(min_value=-(2**15), max_value=2**15 - 1)))
    correlation_id = draw(st.integers(min_value=-(2**31), max_value=2**31 - 1))
    head = struct.pack(">hhi", api_key, api_version, correlation_id)
    client_id = draw(st.one_of(st.none(), st.binary(max_size=40), st.text(max_size=20).map(str.encode)))
    if client_id is None:
        head += struct.pack(">h", draw(st.sampled_from([-1, -2, -300])))
    else:
        head += struct.pack(">h", len(client_id)) + client_id
    if 0 <= api_version < 2**15 and is_flexible(api_key, api_version):
        tags = draw(st.lists(st.tuples(st.integers(0, 300), st.binary(max_size=5)), max_size=2))
        head += encode_uvarint(len(tags))
        for tag, value in tags:
            head += encode_uvarint(tag) + encode_uvarint(len(value)) + value
    body = draw(st.binary(max_size=20))
    frame = head + body
    cut = draw(st.one_of(st.none(), st.integers(min_value=0, max_value=len(frame))))
    return frame if cut is None else frame[:cut]


@pytest.mark.both_twins
@SETTINGS
@given(frame=request_frames())
def test_request_headers(frame: bytes) -> None:
    got = outcome(compiled().read_request_header, frame)
    assert got == outcome(PURE.read_request_header, frame)
    if got[0] == "ok":
        header: RequestHeader = got[1]
        assert header.header_version == request_header_version(header.api_key, header.api_version)


# the same lengths with other bytes; invalid UTF-8 (0xff, a lone surrogate's encoding); two-byte letters
CLIENT_IDS = [b"a", b"b", b"ab", b"", b"\xff", b"\xfe", b"\xc3\xa9", b"\xc3\xa8", b"\xed\xa0\x80",
              b"producer-1"]


def _header_with_client_id(client_id: bytes) -> bytes:
    # api_key 18 (ApiVersions) v0: header v1, no tag section; correlation id 7; then the client-id
    return struct.pack(">hhih", 18, 0, 7, len(client_id)) + client_id


@pytest.mark.both_twins
@SETTINGS
@given(client_ids=st.lists(st.sampled_from(CLIENT_IDS), min_size=1, max_size=12))
def test_request_headers_in_sequence(client_ids: list[bytes]) -> None:
    # one after another, as a connection reads them: a client-id equal in length to the one before
    # (or the same bytes again, valid UTF-8 or not) still reads as its own bytes decode
    for client_id in client_ids:
        frame = _header_with_client_id(client_id)
        fast = compiled().read_request_header(frame)
        assert fast == PURE.read_request_header(frame)
        assert fast.client_id == client_id.decode("utf-8", "replace")


@st.composite
def produce_requests(draw: st.DrawFn) -> tuple[bytes, RequestHeader]:
    version = draw(st.integers(min_value=0, max_value=15))
    flexible = version >= 9
    head = struct.pack(">hhih", ApiKey.PRODUCE, version, 7, 3) + b"app" + (b"\x00" if flexible else b"")
    txn = draw(st.one_of(st.none(), st.binary(max_size=200)))
    if version < 3:
        body = b""
    elif flexible:
        body = b"\x00" if txn is None else encode_uvarint(len(txn) + 1) + txn
    else:
        body = struct.pack(">h", -1) if txn is None else struct.pack(">h", len(txn)) + txn
    body += struct.pack(">hi", draw(st.sampled_from([0, 1, -1, 5])), 30000) + draw(st.binary(max_size=10))
    frame = head + body
    frame = frame[: draw(st.integers(min_value=len(head), max_value=len(frame)))]
    return frame, PURE.read_request_header(frame)


@pytest.mark.both_twins
@SETTINGS
@given(request=produce_requests())
def test_produce_acks(request: tuple[bytes, RequestHeader]) -> None:
    frame, header = request
    expected = outcome(PURE.read_produce_acks, frame, header)
    assert outcome(compiled().read_produce_acks, frame, header) == expected


@pytest.mark.both_twins
def test_produce_acks_of_another_api_is_refused_alike() -> None:
    frame = struct.pack(">hhih", ApiKey.FETCH, 12, 1, -1) + b"\x00" * 20
    header = PURE.read_request_header(frame)
    expected = outcome(PURE.read_produce_acks, frame, header)
    assert outcome(compiled().read_produce_acks, frame, header) == expected
    assert outcome(PURE.read_produce_acks, frame, header)[0] == "raised"


# --- responses: correlation id and the throttle_time_ms patch -----------------------------------

throttles = st.integers(min_value=-(2**31), max_value=2**32)


def _same_patch(payload: bytes, api_key: int, api_version: int, new: int) -> None:
    fast = compiled()
    api_key = int(api_key)  # as the data plane passes it: the compiled twin hands an ApiKey to the reference
    for name in ("throttle_time_offset", "plan_throttle_patch", "patch_throttle_time"):
        args = (payload, api_key, api_version) + (() if name == "throttle_time_offset" else (new,))
        assert outcome(getattr(fast, name), *args) == outcome(getattr(PURE, name), *args), name


@pytest.mark.both_twins
@pytest.mark.parametrize("api_version", kio_versions(ApiKey.PRODUCE))
@KIO_EXAMPLES
@given(data=st.data(), new=throttles)
def test_produce_responses(api_version: int, data: st.DataObject, new: int) -> None:
    payload = response_payload(data.draw(kio_entities(load_response_schema(ApiKey.PRODUCE, api_version))))
    _same_patch(payload, ApiKey.PRODUCE, api_version, new)
    cut = data.draw(st.integers(min_value=0, max_value=len(payload)))
    _same_patch(payload[:cut], ApiKey.PRODUCE, api_version, new)  # truncated: the same error
    _same_patch(payload + b"\x00", ApiKey.PRODUCE, api_version, new)  # trailing garbage


@pytest.mark.both_twins
@pytest.mark.parametrize("api_version", kio_versions(ApiKey.PRODUCE))
@given(topics=st.lists(st.tuples(st.binary(min_size=0, max_size=12),
                                 st.lists(st.tuples(st.integers(-1, 2**31 - 1), st.integers(0, 120)),
                                          max_size=4)), max_size=4),
       existing=st.integers(min_value=-(2**31), max_value=2**31 - 1), new=throttles)
@SETTINGS
def test_produce_common_case_responses(api_version: int, topics: list[tuple[bytes, list[tuple[int, int]]]],
                                       existing: int, new: int) -> None:
    """The shape a broker sends nearly always (what the compiled walk does in C), built by hand."""
    if api_version < 9:
        return  # v3-v8 are fixed-offset: covered by test_produce_responses
    body = encode_uvarint(len(topics) + 1)
    for name, partitions in topics:
        body += (b"\x00" * 16) if api_version >= 13 else encode_uvarint(len(name) + 1) + name
        body += encode_uvarint(len(partitions) + 1)
        for index, error in partitions:
            body += struct.pack(">ihqqq", index, error, 5, -1, 0) + b"\x01\x00\x00"
        body += b"\x00"
    payload = I32.pack(9) + b"\x00" + body + I32.pack(existing) + b"\x00"
    assert PURE.throttle_time_offset(payload, ApiKey.PRODUCE, api_version) == len(payload) - 5
    _same_patch(payload, ApiKey.PRODUCE, api_version, new)


@pytest.mark.both_twins
@pytest.mark.parametrize("api_version", kio_versions(ApiKey.API_VERSIONS))
@KIO_EXAMPLES
@given(data=st.data(), new=throttles)
def test_api_versions_responses(api_version: int, data: st.DataObject, new: int) -> None:
    """Its throttle_time_ms follows the api_keys array (walked in C from v3: entries of 6 bytes and
    a tag section each); whole, cut short anywhere, and with a byte added."""
    schema = load_response_schema(ApiKey.API_VERSIONS, api_version)
    payload = response_payload(data.draw(kio_entities(schema)))
    _same_patch(payload, ApiKey.API_VERSIONS, api_version, new)
    cut = data.draw(st.integers(min_value=0, max_value=len(payload)))
    _same_patch(payload[:cut], ApiKey.API_VERSIONS, api_version, new)
    _same_patch(payload + b"\x00", ApiKey.API_VERSIONS, api_version, new)


@pytest.mark.both_twins
@pytest.mark.parametrize("api_version", kio_versions(ApiKey.API_VERSIONS))
@given(error=st.sampled_from([0, 0, 35, 35, 1, -1]),
       entries=st.lists(st.tuples(st.integers(0, 80), st.integers(0, 3), st.integers(0, 20),
                                  st.sampled_from([b"\x00", b"\x00", b"\x01\x00\x02ab", b"\x02"])),
                        max_size=90),
       count_delta=st.sampled_from([0, 0, 0, 1, -1, -2]), existing=st.integers(-(2**31), 2**31 - 1),
       v0_layout=st.booleans(), new=throttles)
@SETTINGS
def test_api_versions_hand_built(api_version: int, error: int, entries: list[tuple[int, int, int, bytes]],
                                 count_delta: int, existing: int, v0_layout: bool, new: int) -> None:
    """A broker's shape built by hand: no error or UNSUPPORTED_VERSION (35: perhaps the v0 fallback,
    in the v0 layout or the asked version's), entries with and without tagged fields, a count that
    does not match the entries, and everything after them."""
    flexible = api_version >= 3 and not v0_layout
    body = struct.pack(">h", error)
    if flexible:
        body += encode_uvarint(max(0, len(entries) + 1 + count_delta))
    else:
        body += I32.pack(len(entries) + count_delta)
    for key, low, high, tags in entries:
        body += struct.pack(">hhh", key, low, high) + (tags if flexible else b"")
    if not v0_layout:
        body += I32.pack(existing) + (b"\x00" if flexible else b"")
    payload = I32.pack(7) + body  # the ApiVersions response header is v0 at every version
    _same_patch(payload, ApiKey.API_VERSIONS, api_version, new)


def _responses_with_throttle() -> list[tuple[int, int]]:
    return [(k, v) for k in kio_api_keys() for v in kio_versions(k)
            if k != ApiKey.PRODUCE and k != ApiKey.API_VERSIONS]


@pytest.mark.both_twins
@pytest.mark.parametrize(("api_key", "api_version"), _responses_with_throttle())
@settings(max_examples=2, deadline=None, suppress_health_check=KIO_EXAMPLES.suppress_health_check)
@given(data=st.data(), new=throttles)
def test_every_other_response(api_key: int, api_version: int, data: st.DataObject, new: int) -> None:
    payload = response_payload(data.draw(kio_entities(load_response_schema(api_key, api_version))))
    _same_patch(payload, api_key, api_version, new)
    cut = data.draw(st.integers(min_value=0, max_value=min(len(payload), 12)))
    _same_patch(payload[:cut], api_key, api_version, new)


@pytest.mark.both_twins
@SETTINGS
@given(payload=st.binary(max_size=64), api_key=api_keys, api_version=st.integers(-3, 40), new=throttles)
def test_arbitrary_bytes_and_versions(payload: bytes, api_key: int, api_version: int, new: int) -> None:
    _same_patch(payload, int(api_key), api_version, new)
    assert outcome(compiled().read_response_correlation_id, payload) == outcome(
        PURE.read_response_correlation_id, payload)


@pytest.mark.both_twins
def test_patched_response_is_a_new_object_and_the_original_is_untouched() -> None:
    payload = I32.pack(1) + b"\x00" + I32.pack(0) + b"\x00" * 12  # Fetch v12: throttle first
    original = bytes(payload)
    patched = compiled().patch_throttle_time(payload, ApiKey.FETCH, 12, 250)
    assert patched == PURE.patch_throttle_time(payload, ApiKey.FETCH, 12, 250)
    assert patched[5:9] == I32.pack(250) and payload == original
    assert compiled().patch_throttle_time(patched, ApiKey.FETCH, 12, 100) is patched  # no change: same object


@pytest.mark.both_twins
def test_errors_are_protocol_errors_on_both() -> None:
    for impl in (PURE, compiled()):
        with pytest.raises(ProtocolError):
            impl.throttle_time_offset(b"\x00\x00", ApiKey.FETCH, 5)


# --- the Fetch response walk and record counts (protocol.records) -------------------------------


def _batch(count: int, records_bytes: int = 10, magic: int = 2) -> bytes:
    """A record batch header (magic 2) with `count` and `records_bytes` of (opaque) records."""
    length = 49 + records_bytes  # batchLength counts from partitionLeaderEpoch on
    return (struct.pack(">qiib", 0, length, 0, magic) + b"\x00" * 40 + struct.pack(">i", count)
            + b"\x00" * records_bytes)


record_sets = st.one_of(
    st.lists(st.tuples(st.integers(0, 500), st.integers(0, 40)), max_size=4).map(
        lambda bs: b"".join(_batch(c, r) for c, r in bs)),
    st.binary(max_size=80),
)


@pytest.mark.both_twins
@SETTINGS
@given(data=record_sets, cut=st.integers(0, 400), start=st.integers(-2, 5))
def test_count_records(data: bytes, cut: int, start: int) -> None:
    from protocol import records

    end = min(cut, len(data) + 3)
    expected = outcome(records.count_records, data, start, end)
    assert outcome(compiled().count_records, data, start, end) == expected


@st.composite
def fetch_responses(draw: st.DrawFn) -> tuple[bytes, int]:
    """Fetch v12-v18 responses in the shape brokers send (built by hand), sometimes disturbed."""
    version = draw(st.integers(12, 18))
    topics = draw(st.lists(st.tuples(st.text(max_size=10), st.lists(
        st.tuples(st.integers(0, 50), st.integers(-1, 120), record_sets), max_size=3)), max_size=3))
    body = I32.pack(draw(st.integers(0, 1000))) + struct.pack(">hi", draw(st.integers(0, 5)), 7)
    body += encode_uvarint(len(topics) + 1)
    for name, partitions in topics:
        if version >= 13:
            body += draw(st.binary(min_size=16, max_size=16))
        else:
            raw = name.encode()
            body += encode_uvarint(len(raw) + 1) + raw
        body += encode_uvarint(len(partitions) + 1)
        for index, error, records_set in partitions:
            body += struct.pack(">ihqqq", index, error, 10, 10, 0)
            body += draw(st.sampled_from([b"\x00", b"\x01"]))  # aborted_transactions: null or empty
            body += I32.pack(-1)  # preferred_read_replica
            body += encode_uvarint(len(records_set) + 1) + records_set + b"\x00"
        body += b"\x00"
    payload = I32.pack(3) + b"\x00" + body + b"\x00"
    mutation = draw(st.sampled_from(["none", "none", "cut", "byte", "tail"]))
    if mutation == "cut":
        payload = payload[: draw(st.integers(0, len(payload)))]
    elif mutation == "byte":
        i = draw(st.integers(0, len(payload) - 1))
        payload = payload[:i] + bytes([draw(st.integers(0, 255))]) + payload[i + 1 :]
    elif mutation == "tail":
        payload += b"\x00"
    return payload, version


@pytest.mark.both_twins
@SETTINGS
@given(response=fetch_responses())
def test_fetch_response_walk(response: tuple[bytes, int]) -> None:
    from protocol import records

    payload, version = response
    expected = outcome(records.fetch_response_partitions, payload, version)
    assert outcome(compiled().fetch_response_partitions, payload, version) == expected


@pytest.mark.both_twins
@pytest.mark.parametrize("api_version", kio_versions(ApiKey.FETCH))
@KIO_EXAMPLES
@given(data=st.data())
def test_fetch_responses_kio_builds(api_version: int, data: st.DataObject) -> None:
    from protocol import records

    payload = response_payload(data.draw(kio_entities(load_response_schema(ApiKey.FETCH, api_version))))
    expected = outcome(records.fetch_response_partitions, payload, api_version)
    assert outcome(compiled().fetch_response_partitions, payload, api_version) == expected


@pytest.mark.both_twins
def test_a_stale_build_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A protocol._speedups built from an older .pyx lacks a twin: the selector refuses it whole."""
    import importlib
    from types import SimpleNamespace

    from contracts.compiled import choose

    full = {name: getattr(compiled(), name) for name in fastpath._TWINS}
    monkeypatch.setattr(importlib, "import_module", lambda name: SimpleNamespace(**full))
    monkeypatch.delenv("SLUICE_PURE_PYTHON", raising=False)
    assert choose("protocol._speedups", fastpath._TWINS).compiled_module is not None
    assert choose("protocol._speedups", fastpath._TWINS).implementation == "compiled"
    del full["fetch_response_partitions"]
    stale = choose("protocol._speedups", fastpath._TWINS)
    assert (stale.compiled_module, stale.implementation) == (None, "pure")
    assert "is not built, or is older than protocol/_speedups.pyx" in stale.describe()


# --- KIP-951: does a Produce v10+ / Fetch v16+ response carry leader endpoints? -------------------

def _same_absence(payload: bytes, api_key: int, api_version: int) -> bool:
    from protocol import rewrite

    api_key = int(api_key)  # as the stage passes it: the compiled twin hands an ApiKey to the reference
    expected = outcome(rewrite.node_endpoints_absent, payload, api_key, api_version)
    assert outcome(compiled().node_endpoints_absent, payload, api_key, api_version) == expected
    assert expected[0] == "ok"  # never raises: the rewrite reports what is wrong
    return bool(expected[1])


@pytest.mark.both_twins
@pytest.mark.parametrize(("api_key", "api_version"), [
    *[(ApiKey.PRODUCE, v) for v in kio_versions(ApiKey.PRODUCE)],
    *[(ApiKey.FETCH, v) for v in kio_versions(ApiKey.FETCH)]])
@KIO_EXAMPLES
@given(data=st.data())
def test_node_endpoints_absent_kio_builds(api_key: int, api_version: int, data: st.DataObject) -> None:
    schema = load_response_schema(api_key, api_version)
    has_tag = "node_endpoints" in schema.__dataclass_fields__
    body = body_with_endpoints(api_key, api_version, data) if has_tag else data.draw(kio_entities(schema))
    payload = response_payload(body)
    absent = _same_absence(payload, api_key, api_version)
    if has_tag:
        assert absent is (not body.node_endpoints)
    cut = data.draw(st.integers(min_value=0, max_value=len(payload)))
    _same_absence(payload[:cut], api_key, api_version)
    _same_absence(payload + b"\x00", api_key, api_version)


@st.composite
def fetch_shapes(draw: st.DrawFn, version: int) -> bytes:
    """A Fetch response of `version` built by hand, up to its top-level tag section, in the shapes
    the compiled walk reads or refuses: aborted transactions, partition tags, long record sets
    (a three-byte length), a partition count of two bytes."""
    topics = draw(st.lists(st.lists(st.tuples(
        st.integers(0, 3), st.booleans(), st.sampled_from([0, 10, 200, 20_000])), max_size=3), max_size=3))
    many = draw(st.integers(0, 2))  # extra idle partitions in the first topic, up to 140 (a two-byte count)
    body = I32.pack(0) + struct.pack(">hi", 0, 7) + encode_uvarint(len(topics) + 1)
    for t, partitions in enumerate(topics):
        body += bytes(16) if version >= 13 else b"\x02t"
        rows = partitions + ([(0, False, 0)] * (70 * many) if t == 0 else [])
        body += encode_uvarint(len(rows) + 1)
        for aborted, tagged, size in rows:
            body += struct.pack(">ihqqq", 0, 0, 10, 10, 0)
            body += encode_uvarint(aborted + 1) + (struct.pack(">qq", 1, 2) + b"\x00") * aborted
            body += I32.pack(-1) + encode_uvarint(size + 1) + b"r" * size
            body += b"\x01\x01\x02\x00\x07" if tagged else b"\x00"  # one tag (1: 2 bytes) or none
        body += b"\x00"
    return I32.pack(3) + b"\x00" + body


@pytest.mark.both_twins
@pytest.mark.parametrize("version", range(12, 19))
@SETTINGS
@given(data=st.data())
def test_node_endpoints_absent_hand_built_fetches(version: int, data: st.DataObject) -> None:
    head = data.draw(fetch_shapes(version))
    payload = head + b"\x00"  # no top-level tags
    assert _same_absence(payload, ApiKey.FETCH, version) is (version >= 16)
    assert _same_absence(head + b"\x01\x00\x01\x01", ApiKey.FETCH, version) is False  # tag 0, 1 byte
    assert _same_absence(head + b"\x01\x05\x01Z", ApiKey.FETCH, version) is False      # tag 5, 1 byte
    cut = data.draw(st.integers(min_value=0, max_value=len(payload)))
    _same_absence(payload[:cut], ApiKey.FETCH, version)
    i = data.draw(st.integers(min_value=0, max_value=len(payload) - 1))
    changed = payload[:i] + bytes([data.draw(st.integers(0, 255))]) + payload[i + 1:]
    _same_absence(changed, ApiKey.FETCH, version)


@pytest.mark.both_twins
@SETTINGS
@given(payload=st.binary(max_size=64), api_key=st.sampled_from([ApiKey.PRODUCE, ApiKey.FETCH, 3, -1, 500]),
       api_version=st.integers(-2, 20))
def test_node_endpoints_absent_arbitrary_bytes(payload: bytes, api_key: int, api_version: int) -> None:
    _same_absence(payload, api_key, api_version)
