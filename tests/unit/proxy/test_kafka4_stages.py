"""Kafka 4.x through the stages (issue 15): ShareFetch metered and never emptied, leader endpoints
rewritten (also at the end of a streamed Fetch), and what ApiVersions advertises per API."""

from __future__ import annotations

import datetime as dt
import logging
import struct
import typing
import uuid
from pathlib import Path

import pytest
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v16 import response as f16
from kio.schema.produce.v11 import response as p11
from kio.schema.share_fetch.v1 import response as sf

from protocol.apis import ApiKey, api_name
from protocol.encode import decode_response_body, encode_response
from protocol.headers import read_request_header
from protocol.rewrite import BrokerAddress, cap_api_versions_response
from protocol.throttle import read_throttle_time_ms
from protocol.versions import API_POLICIES, NO_THROTTLE_FIELD, Treatment
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext, Forward
from proxy.pumps.upstreams import BrokerRegistry
from proxy.stages import addresses
from proxy.stages.addresses import ResponseRewriter, RewriteStage
from proxy.stages.quota import QuotaStage
from quotas.clock import FakeClock
from quotas.config import QuotaConfig
from quotas.engine import QuotaEngine
from quotas.entity import ClientIdentity, QuotaKind
from tests.unit.protocol.kio_support import kio_api_keys, kio_versions
from tests.unit.protocol.test_share import share_fetch_request

CTX = ConnectionContext(1, "127.0.0.1:5000", "broker 1", 1)
TOPIC = uuid.UUID(int=5)


class FakeRegistry(BrokerRegistry):
    def __init__(self) -> None:
        super().__init__("127.0.0.1", "sluice.local", lambda n: 0, lambda s, t: None)

    def advertise(self, original: BrokerAddress) -> BrokerAddress:
        return BrokerAddress(original.node_id, "sluice.local", 19000 + original.node_id)


def share_fetch_response(correlation_id: int, record_bytes: int, leader_host: str | None = None) -> bytes:
    partition = sf.PartitionData(
        partition_index=0, error_code=ErrorCode.none, acknowledge_error_code=0,
        current_leader=sf.LeaderIdAndEpoch(leader_id=1, leader_epoch=0), records=b"r" * record_bytes,
        acquired_records=(sf.AcquiredRecords(first_offset=0, last_offset=9, delivery_count=1),))
    endpoints = () if leader_host is None else (sf.NodeEndpoint(node_id=2, host=leader_host, port=9092),)
    body = sf.ShareFetchResponse(throttle_time=dt.timedelta(0), error_code=ErrorCode.none,
                                 acquisition_lock_timeout=dt.timedelta(seconds=30),
                                 responses=(sf.ShareFetchableTopicResponse(topic_id=TOPIC,
                                                                           partitions=(partition,)),),
                                 node_endpoints=endpoints)
    return encode_response(1, correlation_id, body)


# ---------------------------------------------------------------------------------- ShareFetch quota


def test_throttled_share_fetch_is_delivered_recorded_and_throttled() -> None:
    clock = FakeClock(0)
    config = QuotaConfig.from_dict({"entries": [{"client_id": "<default>", "consumer_byte_rate": 1000}]})
    managers = QuotaEngine(config, clock)
    stage = QuotaStage(managers)
    request = share_fetch_request(1, 52428800, 1)
    header = read_request_header(request)
    entry = InFlight(9, ApiKey.SHARE_FETCH, 1, "c", len(request), 0)
    verdict = stage.on_request(CTX, entry, header, request)
    # KAFKA-9677 as the broker does for share fetches: max_bytes <= quota x window (1000 B/s x 10 s)
    assert verdict == Forward(share_fetch_request(1, 10_000, 1), 0)
    response = share_fetch_response(9, 20_000)
    entry.upstream_response_bytes = len(response)
    outcome = stage.on_response(CTX, entry, response)
    assert outcome is not None and not outcome.replaced
    # 20 000+ B on a fresh sensor: size / 10 s against 1000 B/s: throttled, as for a Fetch
    expected = round((len(response) / 10 - 1000) / 1000 * 10_000)
    assert outcome.throttle_time_ms == expected
    body = decode_response_body(outcome.payload, ApiKey.SHARE_FETCH, 1)
    assert bytes(body.responses[0].partitions[0].records) == b"r" * 20_000  # the acquired records go out
    assert body.responses[0].partitions[0].acquired_records[0].last_offset == 9
    assert read_throttle_time_ms(outcome.payload, ApiKey.SHARE_FETCH, 1) == expected
    # ...and stay recorded (a Fetch would be un-recorded because it is emptied)
    observed = managers.for_broker(1).check(QuotaKind.FETCH, ClientIdentity.of("ANONYMOUS", "c")).observed
    assert observed == pytest.approx(len(response) / 10, rel=0.01)


def test_share_fetch_under_quota_passes_unchanged_and_is_not_request_percentage() -> None:
    clock = FakeClock(0)
    config = QuotaConfig.from_dict({"entries": [{"client_id": "<default>", "consumer_byte_rate": 10**9,
                                                 "request_percentage": 1}]})
    stage = QuotaStage(QuotaEngine(config, clock))
    request = share_fetch_request(2, 1000, 1)
    entry = InFlight(9, ApiKey.SHARE_FETCH, 2, "c", len(request), 0)
    assert stage.on_request(CTX, entry, read_request_header(request), request) is None  # not capped
    entry.response_received_ms = 5000  # a 5 s long poll: would be 500 % of a thread
    response = share_fetch_response(9, 100)
    entry.upstream_response_bytes = len(response)
    assert stage.on_response(CTX, entry, response) is None  # nothing to patch, nothing to mute
    assert entry.quota is not None
    assert [d.kind for d in entry.quota.decisions] == [QuotaKind.FETCH]  # no REQUEST_PERCENTAGE


# ---------------------------------------------------------------------------------- addresses


def fetch_v16(correlation_id: int, record_bytes: int, leader_host: str) -> bytes:
    partition = f16.PartitionData(
        partition_index=0, error_code=ErrorCode.none, high_watermark=10, last_stable_offset=10,
        log_start_offset=0, aborted_transactions=None, preferred_read_replica=-1, records=b"r" * record_bytes)
    moved = f16.PartitionData(
        partition_index=1, error_code=ErrorCode.not_leader_or_follower, high_watermark=-1,
        last_stable_offset=-1, log_start_offset=-1, aborted_transactions=None, preferred_read_replica=-1,
        records=None, current_leader=f16.LeaderIdAndEpoch(leader_id=2, leader_epoch=3))
    body = f16.FetchResponse(
        throttle_time=dt.timedelta(0), error_code=ErrorCode.none, session_id=5,
        responses=(f16.FetchableTopicResponse(topic_id=TOPIC, partitions=(partition, moved)),),
        node_endpoints=(f16.NodeEndpoint(node_id=2, host=leader_host, port=9092, rack=None),))
    return encode_response(1, correlation_id, body)


@pytest.mark.parametrize("broker_host", ["broker-two.internal.example", "b2"])
def test_streamed_fetch_v16_gets_its_endpoints_rewritten_at_the_same_length(broker_host: str) -> None:
    rewriter = ResponseRewriter(FakeRegistry())
    response = fetch_v16(4, 100_000, broker_host)
    entry = InFlight(4, ApiKey.FETCH, 16, "c", 50, 0)
    entry.upstream_response_bytes = len(response)
    outcome = rewriter.outcome(entry, response[:32])  # the head only: the response streams
    assert outcome.payload == response[:32] and outcome.tail is not None
    sent = bytearray()
    for at in range(0, len(response), 8192):  # the connection feeds the head, then each chunk
        chunk = response[at:at + 8192]
        sent += chunk[:outcome.tail.feed(chunk)]
    sent += outcome.tail.finish()
    assert len(sent) == len(response)  # the size prefix sent first stays right
    assert broker_host.encode() not in sent
    assert sent[:-60] == response[:-60]  # records and partitions pass untouched
    if len(broker_host) > len("sluice.local"):  # shorter mapped host: padded, endpoint kept
        assert b"sluice.local" in sent
    # (a longer mapped host does not fit in place: the endpoint is left out; the client asks Metadata)


def test_whole_fetch_v16_and_share_fetch_are_rewritten() -> None:
    rewriter = ResponseRewriter(FakeRegistry())
    response = fetch_v16(4, 100, "b2")
    entry = InFlight(4, ApiKey.FETCH, 16, "c", 50, 0)
    entry.upstream_response_bytes = len(response)
    outcome = rewriter.outcome(entry, response)
    body = decode_response_body(outcome.payload, ApiKey.FETCH, 16)
    assert outcome.tail is None
    assert [(e.node_id, e.host, e.port) for e in body.node_endpoints] == [(2, "sluice.local", 19002)]
    share = share_fetch_response(6, 100, leader_host="b2")
    entry = InFlight(6, ApiKey.SHARE_FETCH, 1, "c", 50, 0)
    entry.upstream_response_bytes = len(share)
    body = decode_response_body(rewriter.outcome(entry, share).payload, ApiKey.SHARE_FETCH, 1)
    assert [(e.node_id, e.host, e.port) for e in body.node_endpoints] == [(2, "sluice.local", 19002)]


def produce_v11(correlation_id: int, leader_host: str | None) -> bytes:
    partition = p11.PartitionProduceResponse(
        index=0, error_code=ErrorCode.none if leader_host is None else ErrorCode.not_leader_or_follower,
        base_offset=-1, log_append_time=None, log_start_offset=-1, record_errors=(), error_message=None)
    endpoints = () if leader_host is None else (
        p11.NodeEndpoint(node_id=2, host=leader_host, port=9092, rack=None),)
    body = p11.ProduceResponse(
        responses=(p11.TopicProduceResponse(name="t", partition_responses=(partition,)),),
        throttle_time=dt.timedelta(0), node_endpoints=endpoints)
    return encode_response(1, correlation_id, body)


@pytest.mark.parametrize("pure", [False, True])
def test_the_stage_leaves_responses_without_leader_endpoints_alone_and_maps_the_rest(
        pure: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # modern clients' every Produce (v10+) and Fetch (v16+) response passes the stage: nearly all
    # carry no endpoints and must come back as "nothing to say": the stage as built (its compiled
    # hook when built) and its readable hook on the pure check
    if pure:
        from protocol import rewrite
        monkeypatch.setattr(addresses, "node_endpoints_absent", rewrite.node_endpoints_absent)
    stage = RewriteStage(ResponseRewriter(FakeRegistry()))
    on_response = RewriteStage.on_response.__get__(stage) if pure else stage.on_response
    cases = [(ApiKey.PRODUCE, 11, produce_v11(3, None), produce_v11(4, "b2")),
             (ApiKey.FETCH, 16, fetch_v16_without_endpoints(5), fetch_v16(6, 100, "b2"))]
    for api_key, version, plain, moved in cases:
        for payload in (plain, moved):
            entry = InFlight(1, int(api_key), version, "c", 50, 0)
            entry.upstream_response_bytes = len(payload)
            said = on_response(CTX, entry, payload)
            if payload is plain:
                assert said is None
                continue
            assert said is not None
            body = decode_response_body(said.payload, api_key, version)
            assert [(e.node_id, e.host, e.port) for e in body.node_endpoints] == [(2, "sluice.local", 19002)]


def fetch_v16_without_endpoints(correlation_id: int) -> bytes:
    partition = f16.PartitionData(
        partition_index=0, error_code=ErrorCode.none, high_watermark=10, last_stable_offset=10,
        log_start_offset=0, aborted_transactions=None, preferred_read_replica=-1, records=b"r" * 100)
    body = f16.FetchResponse(
        throttle_time=dt.timedelta(0), error_code=ErrorCode.none, session_id=5,
        responses=(f16.FetchableTopicResponse(topic_id=TOPIC, partitions=(partition,)),), node_endpoints=())
    return encode_response(1, correlation_id, body)


# ---------------------------------------------------------------------------------- ApiVersions

# What Kafka 4.3.1's broker advertises (captured from a real broker: tests/integration pins it live)
KAFKA_431: dict[int, tuple[int, int]] = {
    0: (0, 13), 1: (4, 18), 2: (1, 11), 3: (0, 13), 8: (2, 10), 9: (1, 10), 10: (0, 6), 11: (0, 9),
    12: (0, 4), 13: (0, 5), 14: (0, 5), 15: (0, 6), 16: (0, 5), 17: (0, 1), 18: (0, 4), 19: (2, 7),
    20: (1, 6), 21: (0, 2), 22: (0, 5), 23: (2, 4), 24: (0, 5), 25: (0, 4), 26: (0, 5), 27: (1, 2),
    28: (0, 5), 29: (1, 3), 30: (1, 3), 31: (1, 3), 32: (1, 4), 33: (0, 2), 34: (1, 2), 35: (1, 5),
    36: (0, 2), 37: (0, 3), 38: (1, 3), 39: (1, 2), 40: (1, 2), 41: (1, 3), 42: (0, 2), 43: (0, 2),
    44: (0, 1), 45: (0, 1), 46: (0, 0), 47: (0, 0), 48: (0, 1), 49: (0, 1), 50: (0, 0), 51: (0, 0),
    55: (0, 2), 57: (0, 2), 60: (0, 2), 61: (0, 0), 64: (0, 0), 65: (0, 0), 66: (0, 2), 68: (0, 1),
    69: (0, 1), 74: (0, 1), 75: (0, 0), 76: (1, 1), 77: (1, 1), 78: (1, 2), 79: (1, 2), 80: (0, 1),
    81: (0, 0), 83: (0, 0), 84: (0, 0), 85: (0, 1), 86: (0, 0), 87: (0, 1), 88: (0, 0), 89: (0, 0),
    90: (0, 1), 91: (0, 0), 92: (0, 0),
}  # fmt: skip


def api_versions_v3(entries: dict[int, tuple[int, int]], correlation_id: int = 1) -> bytes:
    out = [struct.pack(">ih", correlation_id, 0), bytes([len(entries) + 1])]  # header v0, error_code
    for key, (low, high) in entries.items():
        out.append(struct.pack(">hhh", key, low, high) + b"\x00")  # api_key, min, max, tags
    out.append(struct.pack(">i", 0) + b"\x00")  # throttle_time_ms, tags
    return b"".join(out)


def read_entries(payload: bytes) -> dict[int, tuple[int, int]]:
    count = payload[6] - 1
    return {struct.unpack_from(">h", payload, 7 + 7 * i)[0]: struct.unpack_from(">hh", payload, 9 + 7 * i)
            for i in range(count)}


def test_kafka_431_is_advertised_unchanged() -> None:
    payload = api_versions_v3(KAFKA_431)
    assert cap_api_versions_response(payload, 3, ResponseRewriter(FakeRegistry())._caps) == payload


def test_newer_versions_capped_only_where_sluice_must_know_them(caplog: pytest.LogCaptureFixture) -> None:
    future = dict(KAFKA_431)
    future[ApiKey.FETCH] = (4, 19)           # carries addresses: capped at 18
    future[ApiKey.SHARE_FETCH] = (1, 3)      # carries addresses: capped at 2
    future[ApiKey.LIST_GROUPS] = (0, 6)      # carries throttle_time_ms: capped at 5
    future[ApiKey.WRITE_TXN_MARKERS] = (1, 3)  # nothing Sluice touches: passes, with a note
    future[ApiKey.VOTE] = (0, 3)             # idem
    future[200] = (0, 1)                     # an API key Sluice has never heard of: passes
    rewriter = ResponseRewriter(FakeRegistry())
    with caplog.at_level(logging.INFO, "sluice.rewrite"):
        outcome = rewriter.outcome(InFlight(1, 18, 3, "c", 10, 0), api_versions_v3(future))
    capped = read_entries(outcome.payload)
    assert capped == {**future, ApiKey.FETCH: (4, 18), ApiKey.SHARE_FETCH: (1, 2), ApiKey.LIST_GROUPS: (0, 5)}
    notes = [r.getMessage() for r in caplog.records]
    assert any("WriteTxnMarkers" in n and "v3-v3" in n for n in notes)
    assert any("Unknown(200)" in n for n in notes)
    assert not any("Fetch" in n or "ListGroups" in n for n in notes)


EXPECTED_TREATMENTS = {
    Treatment.REWRITE: {ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA, ApiKey.FIND_COORDINATOR,
                        ApiKey.DESCRIBE_CLUSTER, ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE},
    Treatment.READ: {ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE},
    Treatment.ANSWER: {ApiKey.DESCRIBE_CLIENT_QUOTAS, ApiKey.ALTER_CLIENT_QUOTAS},
}


def test_policy_table_is_pinned() -> None:
    for treatment, keys in EXPECTED_TREATMENTS.items():
        assert {k for k, p in API_POLICIES.items() if p.treatment is treatment} == keys
    for key, policy in API_POLICIES.items():
        if policy.treatment is Treatment.PASS:
            assert key in NO_THROTTLE_FIELD and policy.max_version is None
        elif key in KAFKA_431:
            assert policy.max_version is not None and policy.max_version >= KAFKA_431[key][1]  # none lowered
    assert {k for k, p in API_POLICIES.items() if p.treatment is Treatment.PASS} == NO_THROTTLE_FIELD - {
        ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE}


def test_no_throttle_field_matches_kafkas_schemas() -> None:
    def latest(key: int) -> type:
        return load_response_schema(key, max(kio_versions(key)))  # type: ignore[no-any-return]

    without = {key for key in kio_api_keys() if "throttle_time" not in typing.get_type_hints(latest(key))}
    removed_in_4 = {ApiKey.LEADER_AND_ISR, ApiKey.STOP_REPLICA, ApiKey.UPDATE_METADATA,
                    ApiKey.CONTROLLED_SHUTDOWN}
    assert without == NO_THROTTLE_FIELD - removed_in_4


def test_the_docs_compatibility_table_says_what_the_policy_does() -> None:
    docs = (Path(__file__).resolve().parents[3] / "docs" / "operating.md").read_text()
    section = docs.split("## Kafka 4.x clients: API compatibility", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines()
            if line.startswith("| ") and "---" not in line]
    names = {api_name(k): p.treatment for k, p in API_POLICIES.items()}
    listed: dict[Treatment, set[str]] = {}
    for what, apis, _versions, _why in [r[:4] for r in rows[1:]]:
        treatment = Treatment(what.strip())
        found = {n.strip() for n in apis.replace("(", ",").replace(")", ",").split(",")}
        listed.setdefault(treatment, set()).update(n for n in found if n in names)
    for treatment in (Treatment.REWRITE, Treatment.READ, Treatment.ANSWER):
        assert listed[treatment] == {n for n, t in names.items() if t is treatment}
    removed_in_4 = {"LeaderAndIsr", "StopReplica", "UpdateMetadata", "ControlledShutdown"}
    assert listed[Treatment.PASS] == {n for n, t in names.items() if t is Treatment.PASS} - removed_in_4
    assert all(names[n] is Treatment.THROTTLE for n in listed[Treatment.THROTTLE])


def test_share_fetch_is_charged_to_topic_quotas_and_consumer_record_rate_as_fetch_is() -> None:
    """Old main charged a ShareFetch to consumer_byte_rate only: share consumers escaped topic
    quotas and consumer_record_rate (issue 26)."""
    from tests.unit.protocol.test_records import kio_batch

    topic = TOPIC.bytes.hex()  # a topic id Sluice has not named yet is charged under its hex
    config = QuotaConfig.from_dict({"entries": [
        {"client_id": "<default>", "consumer_record_rate": 1},
        {"topic": topic, "consumer_record_rate": 1, "consumer_byte_rate": 10**6, "request_rate": 100}]})
    engine = QuotaEngine(config, FakeClock(0))
    stage = QuotaStage(engine)
    request = share_fetch_request(1, 52428800, 1)
    entry = InFlight(9, ApiKey.SHARE_FETCH, 1, "c", len(request), 0)
    stage.on_request(CTX, entry, read_request_header(request), request)
    assert entry.whole_response  # records and topics are read from the response
    batch = kio_batch(20)
    partition = sf.PartitionData(
        partition_index=0, error_code=ErrorCode.none, acknowledge_error_code=0,
        current_leader=sf.LeaderIdAndEpoch(leader_id=1, leader_epoch=0), records=batch,
        acquired_records=(sf.AcquiredRecords(first_offset=0, last_offset=19, delivery_count=1),))
    response = encode_response(1, 9, sf.ShareFetchResponse(
        throttle_time=dt.timedelta(0), error_code=ErrorCode.none,
        acquisition_lock_timeout=dt.timedelta(seconds=30),
        responses=(sf.ShareFetchableTopicResponse(topic_id=TOPIC, partitions=(partition,)),),
        node_endpoints=()))
    entry.upstream_response_bytes = len(response)
    outcome = stage.on_response(CTX, entry, response)
    # 20 records / 10 s = 2/s against 1/s, for the client and for the topic:
    # (2 - 1) / 1 x 10 000 ms = 10 000 ms; delivered all the same (the broker acquired them)
    assert outcome is not None and not outcome.replaced and outcome.throttle_time_ms == 10_000
    assert entry.quota is not None
    charged = {(d.kind, d.key.topic): d.observed for d in entry.quota.decisions}
    assert charged[(QuotaKind.CONSUMER_RECORD_RATE, "")] == 2.0
    assert charged[(QuotaKind.CONSUMER_RECORD_RATE, topic)] == 2.0
    assert charged[(QuotaKind.FETCH, topic)] == len(batch) / 10   # the record set's bytes
    assert charged[(QuotaKind.REQUEST_RATE, topic)] == 0.1        # one request / 10 s
