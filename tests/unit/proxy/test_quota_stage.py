"""The quota stage on a fake clock: what is recorded, what is throttled, what the client gets."""

from __future__ import annotations

import datetime as dt
import importlib
import logging
import struct
import uuid

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import response as fr
from kio.schema.share_fetch.v1 import request as sf

from protocol.apis import ApiKey
from protocol.encode import decode_response_body, encode_request, encode_response
from protocol.headers import RequestHeader, read_request_header
from protocol.throttle import read_throttle_time_ms
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import FORWARD, ConnectionContext, Forward, RequestOutcome, ResponseOutcome
from proxy.stages.quota import QuotaStage
from quotas.clock import FakeClock
from quotas.config import QuotaConfig
from quotas.engine import QuotaEngine
from quotas.entity import ClientIdentity, QuotaKind

CTX = ConnectionContext(1, "127.0.0.1:5000", "broker 1", 1)


def stage_with(clock: FakeClock, **entry: object) -> tuple[QuotaStage, QuotaEngine]:
    config = QuotaConfig.from_dict({"entries": [{"client_id": "<default>", **entry}]})
    managers = QuotaEngine(config, clock)
    return QuotaStage(managers), managers


def on_request(stage: QuotaStage, header: RequestHeader, payload: bytes,
               received_ms: int = 0) -> tuple[RequestOutcome, InFlight]:
    """The stage's outcome (no say: forward as it is) and the in-flight entry it wrote its note on."""
    entry = InFlight(header.correlation_id, header.api_key, header.api_version, header.client_id,
                     len(payload), received_ms)
    outcome = stage.on_request(CTX, entry, header, payload)
    return (FORWARD if outcome is None else outcome), entry


def produce_request(size: int, client_id: str = "app") -> tuple[RequestHeader, bytes]:
    cid = client_id.encode()
    head = struct.pack(">hhih", ApiKey.PRODUCE, 8, 7, len(cid)) + cid   # Produce v8, correlation 7
    payload = head + b"\x00" * (size - len(head))                     # the body is never decoded here
    return RequestHeader(ApiKey.PRODUCE, 8, 7, client_id, 1, len(head)), payload


def produce_response_v8(correlation_id: int, broker_throttle_ms: int) -> bytes:
    # correlation_id, responses[] = empty, throttle_time_ms (last field in v1-v8)
    return struct.pack(">iii", correlation_id, 0, broker_throttle_ms)


def fetch_response_v12(correlation_id: int, record_bytes: int, session_id: int = 99) -> bytes:
    body = fr.FetchResponse(throttle_time=dt.timedelta(0), error_code=ErrorCode.none, session_id=session_id,
                            responses=(fr.FetchableTopicResponse(topic="t", partitions=(fr.PartitionData(
                                partition_index=0, error_code=ErrorCode.none, high_watermark=10,
                                last_stable_offset=10, log_start_offset=0, aborted_transactions=None,
                                preferred_read_replica=-1, records=b"r" * record_bytes),)),))
    return encode_response(1, correlation_id, body)


def test_produce_over_quota_mutes_at_once_with_the_delay_from_its_response() -> None:
    """KIP-219: the broker records a produce in its response callback and its delay starts when the
    response is sent, so a slow acks=all produce waits its latency + the delay. Old main counted
    the delay from the request's arrival (the client waited max(latency, delay))."""
    clock = FakeClock(0)
    stage, _ = stage_with(clock, producer_byte_rate=500)
    # 400 B at t = 0..9 s: 4000 B over a padded 10 s window = 400 B/s < 500 B/s, no throttle
    for second in range(10):
        clock.set(second * 1000)
        header, payload = produce_request(400)
        verdict, _ = on_request(stage, header, payload)
        assert verdict.throttle_time_ms == 0
    # 2300 B at t = 10.5 s: 6300 B / 10.5 s = 600 B/s; throttle = (600-500)/500 * 10500 = 2100 ms
    clock.set(10_500)
    header, payload = produce_request(2300)
    verdict, entry = on_request(stage, header, payload, 10_500)
    assert verdict.throttle_time_ms == 2100           # muted at once: no pipelined request is read
    assert entry.delay_from_response_ms == 2100       # and the delay runs from the response
    entry.response_received_ms = 10_510
    outcome = stage.on_response(CTX, entry, produce_response_v8(7, broker_throttle_ms=30))
    assert outcome is not None
    assert read_throttle_time_ms(outcome.payload, ApiKey.PRODUCE, 8) == 2100  # max(broker 30, ours)
    assert outcome.throttle_time_ms == 0                                      # the mute already started


def test_acks_0_produce_over_quota_mutes_at_once() -> None:
    """acks=0 gets no response: the mute at the request's arrival is the only throttle there is."""
    clock = FakeClock(0)
    stage, _ = stage_with(clock, producer_byte_rate=500)
    header, payload = produce_request(6000)
    entry = InFlight(header.correlation_id, header.api_key, header.api_version, header.client_id,
                     len(payload), 0, expects_response=False)
    # 6 000 B / 10 s = 600 B/s: (600 - 500) / 500 x 10 000 ms = 2 000 ms
    outcome = stage.on_request(CTX, entry, header, payload)
    assert outcome is not None and outcome.throttle_time_ms == 2000
    assert entry.delay_from_response_ms == 0


def test_broker_throttle_larger_than_ours_is_kept() -> None:
    clock = FakeClock(0)
    stage, _ = stage_with(clock, producer_byte_rate=10**9)
    header, payload = produce_request(100)
    _, entry = on_request(stage, header, payload)
    assert entry.quota is not None
    response = produce_response_v8(7, broker_throttle_ms=450)
    outcome = stage.on_response(CTX, entry, response)
    sent = response if outcome is None else outcome.payload   # no say: the broker's bytes go as they are
    assert read_throttle_time_ms(sent, ApiKey.PRODUCE, 8) == 450


def test_throttled_fetch_is_emptied_unrecorded_and_keeps_the_session() -> None:
    clock = FakeClock(0)
    stage, managers = stage_with(clock, consumer_byte_rate=1000)
    header = RequestHeader(ApiKey.FETCH, 12, 3, "app", 2, 0)
    _, entry = on_request(stage, header, b"\x00" * 40)
    assert entry.quota is not None
    response = fetch_response_v12(3, 20_000)
    entry.upstream_response_bytes = len(response)
    outcome = stage.on_response(CTX, entry, response[:32])   # only the head, as when streaming
    assert outcome is not None and outcome.replaced
    assert outcome is not None
    # 20 000+ B on a fresh sensor: rate = size / 10 s ~ 2000 B/s against 1000 B/s, so throttled
    size = len(response)
    expected = round((size / 10 - 1000) / 1000 * 10_000)
    assert outcome.throttle_time_ms == expected
    body = decode_response_body(outcome.payload, ApiKey.FETCH, 12)
    assert body.responses == () and body.error_code == 0 and body.session_id == 99
    assert body.throttle_time == dt.timedelta(milliseconds=expected)
    # the access log (and connection stats) read the throttle from the note: an emptied Fetch
    # is logged with the throttle_time_ms its client was told, not 0
    assert entry.quota.enforced_ms == expected
    # the bytes were taken back: the sensor's rate is 0 again
    identity = ClientIdentity.of("ANONYMOUS", "app")
    assert managers.for_broker(1).check(QuotaKind.FETCH, identity).observed == 0


def bucket_fetch(stage: QuotaStage, response: bytes) -> ResponseOutcome | None:
    header = RequestHeader(ApiKey.FETCH, 12, 3, "app", 2, 0)
    _, entry = on_request(stage, header, b"\x00" * 40)
    entry.upstream_response_bytes = len(response)
    return stage.on_response(CTX, entry, response)


def test_under_the_token_bucket_a_fetch_larger_than_the_burst_is_delivered_then_throttled() -> None:
    """A fetch is delivered while the credits are not negative, and takes them below zero; the
    next fetch, in debt, is answered empty (nothing recorded) until the debt has refilled. Were a
    fetch emptied whenever it does not fit in the credits, one larger than the burst (a broker
    returns a partition's first batch whole) would never be delivered."""
    clock = FakeClock(0)
    stage, managers = stage_with(clock, consumer_byte_rate=1000, rate_model="token_bucket", burst_ms=100)
    response = fetch_response_v12(3, 5_000)                 # ~5,100 B against a 100 B burst
    size = len(response)
    first = bucket_fetch(stage, response)
    # credits 100 - size < 0: delivered whole, throttled for the refill to zero = (size - 100) ms
    assert first is not None and not first.replaced and first.throttle_time_ms == size - 100
    delivered = decode_response_body(first.payload, ApiKey.FETCH, 12)
    assert bytes(delivered.responses[0].partitions[0].records) == b"r" * 5_000
    assert delivered.throttle_time == dt.timedelta(milliseconds=size - 100)   # patched in
    clock.advance(1000)                                       # 1,000 ms later: still in debt
    second = bucket_fetch(stage, response)
    assert second is not None and second.replaced             # empty, and told the time left
    assert second.throttle_time_ms == size - 100 - 1000
    assert decode_response_body(second.payload, ApiKey.FETCH, 12).responses == ()
    clock.advance(size - 100 - 1000)                          # the debt has refilled to zero
    third = bucket_fetch(stage, response)
    assert third is not None and not third.replaced and third.throttle_time_ms == size
    # what was delivered is what was charged: two responses over the (size - 100 + size) ms since
    identity = ClientIdentity.of("ANONYMOUS", "app")
    assert managers.for_broker(1).check(QuotaKind.FETCH, identity).throttle_time_ms == size


def test_shadow_mode_computes_but_does_not_throttle() -> None:
    clock = FakeClock(0)
    stage, _ = stage_with(clock, producer_byte_rate=100, shadow=True)
    header, payload = produce_request(50_000)
    verdict, entry = on_request(stage, header, payload)
    assert verdict.throttle_time_ms == 0 and entry.quota is not None
    (decision,) = [d for d in entry.quota.decisions if d.kind is QuotaKind.PRODUCE]
    assert decision.shadow and decision.would_throttle_ms > 0


def test_request_rate_counts_requests_but_not_api_versions() -> None:
    clock = FakeClock(0)
    stage, _ = stage_with(clock, request_rate=1)
    header = RequestHeader(ApiKey.METADATA, 12, 1, "app", 2, 0)
    throttles = [on_request(stage, header, b"")[0].throttle_time_ms for _ in range(11)]
    # 10 requests in a padded 10 s window = 1/s, not over; the 11th makes 1.1/s:
    # (1.1 - 1) / 1 * 10 000 = 1000 ms, which is also the cap for request quotas (one window)
    assert throttles[:10] == [0] * 10 and throttles[10] == 1000
    api_versions = RequestHeader(ApiKey.API_VERSIONS, 3, 2, "app", 2, 0)
    assert on_request(stage, api_versions, b"")[0].throttle_time_ms == 0


def test_fetch_requests_are_capped_to_what_the_quota_allows_in_one_window() -> None:
    clock = FakeClock(0)
    stage, _ = stage_with(clock, consumer_byte_rate=1000)
    head = struct.pack(">hhih", ApiKey.FETCH, 11, 9, 3) + b"app"          # Fetch v11, header v1
    body = struct.pack(">iiiii", -1, 500, 1, 52_428_800, 0)                # replica, wait, min, max, ...
    header = RequestHeader(ApiKey.FETCH, 11, 9, "app", 1, len(head))
    verdict, _ = on_request(stage, header, head + body)
    assert isinstance(verdict, Forward) and verdict.payload is not None
    # KAFKA-9677: quota x (samples - 1) x window = 1000 B/s x 10 x 1 s = 10 000 bytes
    assert struct.unpack_from(">i", verdict.payload, len(head) + 12)[0] == 10_000


def test_one_identity_object_per_principal_and_client_id() -> None:
    """The identity a request is charged to is made once per (principal, client id) and then the same
    object (the managers' lookups compare it by identity); other client ids and principals get
    their own, and a null client id is "" (Kafka's)."""
    from proxy.stages import identities as quota_stage

    clock = FakeClock(0)
    stage, _ = stage_with(clock, producer_byte_rate=10**9)
    header, payload = produce_request(100, "app")
    notes = [on_request(stage, header, payload)[1].quota for _ in range(3)]
    assert all(n is not None for n in notes)
    first = notes[0].identity  # type: ignore[union-attr]
    assert first == ClientIdentity("ANONYMOUS", "app")
    assert all(n.identity is first for n in notes)  # type: ignore[union-attr]
    other, other_payload = produce_request(100, "other")
    assert on_request(stage, other, other_payload)[1].quota.identity == ClientIdentity("ANONYMOUS", "other")  # type: ignore[union-attr]
    null_id = RequestHeader(ApiKey.PRODUCE, 8, 7, None, 1, 10)
    assert on_request(stage, null_id, payload)[1].quota.identity == ClientIdentity("ANONYMOUS", "")  # type: ignore[union-attr]
    user = ConnectionContext(2, "127.0.0.1:5001", "broker 1", 1, principal="User:alice")
    entry = InFlight(7, ApiKey.PRODUCE, 8, "app", len(payload), 0)
    stage.on_request(user, entry, header, payload)
    assert entry.quota is not None and entry.quota.identity == ClientIdentity("User:alice", "app")
    # bounded: past MAX_IDENTITIES pairs it starts over, and still answers the right identity
    for i in range(quota_stage.MAX_IDENTITIES + 5):
        h, p = produce_request(30, f"c{i}")
        assert on_request(stage, h, p)[1].quota.identity.client_id == f"c{i}"  # type: ignore[union-attr]
    assert len(stage._identities) <= quota_stage.MAX_IDENTITIES


# ---------------------------------------------------------------- topic budgets cap a fetch

T_ID = bytes(range(16))


def _topic_stage(clock: FakeClock) -> QuotaStage:
    """A topic budget alone: t at 1 000 B/s (one sample window: a fetch of t is capped at 1 000 B)."""
    config = QuotaConfig.from_dict({"entries": [{"topic": "t", "consumer_byte_rate": 1000}]})
    return QuotaStage(QuotaEngine(config, clock))


def fetch_request(version: int, topics: dict[str | bytes, list[int]], epoch: int = -1,
                  forgotten: dict[str | bytes, list[int]] | None = None,
                  max_bytes: int = 52_428_800) -> tuple[RequestHeader, bytes]:
    """A Fetch request as kio writes it: topics by name (v12) or by id (v13+), 1 MiB per partition."""
    schema = load_request_schema(ApiKey.FETCH, version)
    module = importlib.import_module(schema.__module__)

    def topic(key: str | bytes) -> dict[str, object]:
        return {"topic_id": uuid.UUID(bytes=key)} if isinstance(key, bytes) else {"topic": key}

    body = schema(max_wait=dt.timedelta(milliseconds=500), min_bytes=1, max_bytes=max_bytes, session_id=7,
                  session_epoch=epoch, topics=tuple(module.FetchTopic(**topic(k), partitions=tuple(
                      module.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=1 << 20)
                      for p in parts)) for k, parts in topics.items()),
                  forgotten_topics_data=tuple(module.ForgottenTopic(**topic(k), partitions=tuple(parts))
                                              for k, parts in (forgotten or {}).items()))
    payload = encode_request(RequestHeader(ApiKey.FETCH, version, 9, "app", 2, 0), body)
    return read_request_header(payload), payload


def capped_to(stage: QuotaStage, request: tuple[RequestHeader, bytes],
              ctx: ConnectionContext = CTX) -> int | None:
    """The max_bytes the stage forwards (None: the client's, unchanged)."""
    header, payload = request
    entry = InFlight(header.correlation_id, header.api_key, header.api_version, header.client_id,
                     len(payload), 0)
    outcome = stage.on_request(ctx, entry, header, payload)
    if outcome is None or not isinstance(outcome, Forward) or outcome.payload is None:
        return None
    # past replica_id (until v14), max_wait_ms and min_bytes
    at = header.body_offset + (12 if header.api_version <= 14 else 8)
    return int(struct.unpack_from(">i", outcome.payload, at)[0])


def test_a_fetch_of_a_topic_with_a_budget_is_capped_by_it_named_or_by_id() -> None:
    """Without it a consumer asking 1 MiB per partition of a topic whose budget admits less in a
    window is answered empty forever (issue 26: 0 of 10 000 records in 90 s)."""
    stage = _topic_stage(FakeClock(0))
    # by name (v12): 1 000 B/s x one 1 s sample = 1 000 B, for the whole request
    assert capped_to(stage, fetch_request(12, {"t": [0, 1]})) == 1000
    assert capped_to(stage, fetch_request(12, {"free": [0], "t": [2]})) == 1000
    assert capped_to(stage, fetch_request(12, {"free": [0]})) is None
    # by id (v13+): named as the response side names it, from Metadata it learned
    assert capped_to(stage, fetch_request(16, {T_ID: [0]})) is None  # not known yet: its hex form
    stage.topic_names.add({T_ID: "t"})
    assert capped_to(stage, fetch_request(16, {T_ID: [0]})) == 1000


def test_an_incremental_fetch_session_stays_capped_by_the_topics_it_fetches() -> None:
    """KIP-227: after a full fetch (epoch 0) the Java consumer lists only partitions that changed;
    an incremental request that lists none still fetches t, until t is forgotten."""
    stage = _topic_stage(FakeClock(0))
    other = ConnectionContext(2, "127.0.0.1:5001", "broker 1", 1)
    assert capped_to(stage, fetch_request(12, {"t": [0, 1], "free": [0]}, epoch=0)) == 1000
    assert capped_to(stage, fetch_request(12, {}, epoch=1)) == 1000            # lists nothing: t still
    assert capped_to(stage, fetch_request(12, {}, epoch=1), other) is None     # another connection's own
    assert capped_to(stage, fetch_request(12, {}, epoch=2, forgotten={"t": [0]})) == 1000  # t-1 left
    assert capped_to(stage, fetch_request(12, {}, epoch=3, forgotten={"t": [1]})) is None  # t forgotten
    assert capped_to(stage, fetch_request(12, {"t": [4]}, epoch=4)) == 1000    # added again
    # a sessionless fetch (librdkafka's, epoch -1) lists everything and leaves no session behind
    assert capped_to(stage, fetch_request(12, {"free": [0]}, epoch=-1)) is None
    assert capped_to(stage, fetch_request(12, {}, epoch=5)) is None


def share_fetch(max_records: int = 500) -> tuple[RequestHeader, bytes]:
    body = sf.ShareFetchRequest(group_id="g", member_id="m", share_session_epoch=0,
                                max_wait=dt.timedelta(milliseconds=500), min_bytes=1, max_bytes=52_428_800,
                                max_records=max_records, batch_size=max_records, topics=(sf.FetchTopic(
                                    topic_id=uuid.UUID(bytes=T_ID), partitions=(sf.FetchPartition(
                                        partition_index=0, acknowledgement_batches=()),)),),
                                forgotten_topics_data=())
    payload = encode_request(RequestHeader(ApiKey.SHARE_FETCH, 1, 9, "app", 2, 0), body)
    return read_request_header(payload), payload


def forwarded_share_limits(stage: QuotaStage) -> tuple[int, int, int]:
    """(max_bytes, max_records, batch_size) of the ShareFetch the stage forwards."""
    header, payload = share_fetch()
    entry = InFlight(9, ApiKey.SHARE_FETCH, 1, "app", len(payload), 0)
    outcome = stage.on_request(CTX, entry, header, payload)
    assert isinstance(outcome, Forward) and outcome.payload is not None
    # group_id "g" and member_id "m" (compact: 2 bytes each), share_session_epoch, max_wait_ms, min
    at = header.body_offset + 4 + 12
    return struct.unpack_from(">iii", outcome.payload, at)


def test_a_share_fetch_of_a_topic_with_a_budget_is_capped_by_it() -> None:
    stage = _topic_stage(FakeClock(0))
    stage.topic_names.add({T_ID: "t"})
    assert forwarded_share_limits(stage) == (1000, 500, 500)  # bytes: 1 000 B/s x one 1 s sample
    # a records budget caps max_records and batch_size: 40 records/s x one 1 s sample = 40
    config = QuotaConfig.from_dict({"entries": [{"topic": "t", "consumer_record_rate": 40}]})
    records = QuotaStage(QuotaEngine(config, FakeClock(0)))
    records.topic_names.add({T_ID: "t"})
    assert forwarded_share_limits(records) == (52_428_800, 40, 40)


def test_a_fetch_whose_topics_cannot_be_read_is_forwarded_uncapped_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    stage = _topic_stage(FakeClock(0))
    _, payload = fetch_request(12, {"t": [0]})
    truncated = payload[:-12]  # into t's partition
    with caplog.at_level(logging.WARNING, "sluice.quotas"):
        assert capped_to(stage, (read_request_header(truncated), truncated)) is None
    assert "cannot read the topics of Fetch v12" in caplog.text
