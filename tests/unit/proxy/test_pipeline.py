"""The typed stage contract: frozen outcomes combined by fixed rules, the broker's throttle read once."""

from __future__ import annotations

import asyncio
import dataclasses
import struct

import pytest

from protocol.apis import ApiKey
from protocol.headers import RequestHeader
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import (
    FORWARD,
    AnswerHere,
    AnswerLater,
    Close,
    ConnectionContext,
    Forward,
    Pipeline,
    RequestOutcome,
    ResponseOutcome,
    StageBase,
    broker_throttle_ms,
)

CTX = ConnectionContext(1, "127.0.0.1:5000", "broker 1", 1)
HEADER = RequestHeader(ApiKey.PRODUCE, 8, 7, "app", 1, 10)


class Says(StageBase):
    def __init__(self, request: RequestOutcome | None = None,
                 response: ResponseOutcome | None = None) -> None:
        self.request, self.response = request, response
        self.seen: list[bytes] = []

    def on_request(self, ctx: ConnectionContext, entry: InFlight, header: RequestHeader,
                   payload: bytes) -> RequestOutcome | None:
        self.seen.append(payload)
        return self.request

    def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome | None:
        self.seen.append(payload)
        return self.response


class ReadsBrokerThrottle(StageBase):
    def __init__(self) -> None:
        self.seen: list[int | None] = []

    def on_response(self, ctx: ConnectionContext, entry: InFlight, payload: bytes) -> ResponseOutcome | None:
        self.seen.append(broker_throttle_ms(entry))
        return None


def entry() -> InFlight:
    return InFlight(7, ApiKey.PRODUCE, 8, "app", 20, 0)


def request(*stages: StageBase, payload: bytes = b"client") -> RequestOutcome:
    return Pipeline(stages).on_request(CTX, entry(), HEADER, payload)


def test_outcomes_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Forward(b"x").throttle_time_ms = 5  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ResponseOutcome(b"x").replaced = True  # type: ignore[misc]


def test_no_stage_says_anything_forward_as_is() -> None:
    assert request(Says(), Says()) is FORWARD


def test_throttle_is_the_largest_whatever_the_order() -> None:
    for order in ((Forward(None, 300), Forward(None, 100)), (Forward(None, 100), Forward(None, 300))):
        assert request(*(Says(o) for o in order)).throttle_time_ms == 300


def test_a_forwarded_payload_is_what_later_stages_and_the_broker_see() -> None:
    later = Says()
    outcome = request(Says(Forward(b"capped")), later, Says(Forward(None, 50)))
    assert later.seen == [b"capped"]
    assert outcome == Forward(b"capped", 50)


def test_an_answer_beats_forward_and_keeps_the_largest_throttle() -> None:
    first = request(Says(Forward(None, 200)), Says(AnswerHere(b"local")))
    assert first == AnswerHere(b"local", 200)
    second = request(Says(AnswerHere(b"local")), Says(Forward(b"other", 70)))
    assert second == AnswerHere(b"local", 70)


def test_the_first_answer_wins() -> None:
    loop = asyncio.new_event_loop()
    try:
        pending: asyncio.Future[bytes] = loop.create_future()
        outcome = request(Says(AnswerLater(pending)), Says(AnswerHere(b"second")))
        assert isinstance(outcome, AnswerLater) and outcome.pending is pending
    finally:
        loop.close()


def test_close_beats_everything() -> None:
    outcome = request(Says(AnswerHere(b"a", 10)), Says(Close("bad request")), Says(Forward(b"x", 20)))
    assert outcome == Close("bad request", 20)


def test_responses_chain_payloads_and_replaced_sticks() -> None:
    second = Says(response=ResponseOutcome(b"patched", 40))
    pipeline = Pipeline([Says(response=ResponseOutcome(b"empty", 10, replaced=True)), second])
    outcome = pipeline.on_response(CTX, entry(), b"broker")
    assert second.seen == [b"empty"]
    assert outcome == ResponseOutcome(b"patched", 40, replaced=True)


def test_response_with_no_say_is_the_brokers() -> None:
    assert Pipeline([Says()]).on_response(CTX, entry(), b"broker") == ResponseOutcome(b"broker")


def test_the_brokers_throttle_is_its_own_whatever_stage_patched_first() -> None:
    # Produce v8 response: correlation id, no topics, throttle_time_ms = 450
    response = struct.pack(">iii", 7, 0, 450)
    patcher = Says(response=ResponseOutcome(struct.pack(">iii", 7, 0, 9000)))
    reader = ReadsBrokerThrottle()
    for stages in ((patcher, reader), (reader, patcher)):
        reader.seen.clear()
        e = entry()
        outcome = Pipeline(list(stages)).on_response(CTX, e, response)
        assert outcome.payload == struct.pack(">iii", 7, 0, 9000)
        assert reader.seen == [450] and broker_throttle_ms(e) == 450
        assert e.broker_response is response  # kept, not copied


def test_no_broker_response_no_broker_throttle() -> None:
    assert broker_throttle_ms(entry()) is None


# ---------------------------------------------------------------------- routes: which stages run


class OnlyFor(Says):
    """Has a say only on `api_key` (and counts how often the pipeline asked)."""

    def __init__(self, api_key: int, request: RequestOutcome | None = None,
                 response: ResponseOutcome | None = None) -> None:
        super().__init__(request, response)
        self.api_key = api_key
        self.asked: list[tuple[str, int, int]] = []
        self.completed = 0

    def handles(self, hook: str, api_key: int, api_version: int) -> bool:
        self.asked.append((hook, api_key, api_version))
        return api_key == self.api_key

    def on_complete(self, ctx: ConnectionContext, entry: InFlight, sent_ms: int) -> None:
        self.completed += 1


def test_a_stage_is_left_out_of_the_requests_it_does_not_handle() -> None:
    fetch_only = OnlyFor(ApiKey.FETCH, Close("never for a produce"), ResponseOutcome(b"never", 99))
    pipeline = Pipeline([fetch_only])
    e = entry()  # a Produce
    assert pipeline.on_request(CTX, e, HEADER, b"client") is FORWARD
    assert pipeline.on_response(CTX, e, b"broker") == ResponseOutcome(b"broker")
    pipeline.on_complete(CTX, e, 0)
    assert fetch_only.seen == [] and fetch_only.completed == 0

    fetch = InFlight(8, ApiKey.FETCH, 12, "app", 20, 0)
    fetch_header = RequestHeader(ApiKey.FETCH, 12, 8, "app", 1, 10)
    assert pipeline.on_request(CTX, fetch, fetch_header, b"client") == Close("never for a produce")
    assert pipeline.on_response(CTX, fetch, b"broker") == ResponseOutcome(b"never", 99)
    pipeline.on_complete(CTX, fetch, 0)
    assert fetch_only.seen == [b"client", b"broker"] and fetch_only.completed == 1


def test_a_stage_is_asked_once_per_api_key_and_version() -> None:
    stage = OnlyFor(ApiKey.PRODUCE)
    pipeline = Pipeline([stage])
    for _ in range(3):
        e = entry()
        pipeline.on_request(CTX, e, HEADER, b"client")
        pipeline.on_response(CTX, e, b"broker")
        pipeline.on_complete(CTX, e, 0)
    assert sorted(stage.asked) == [("on_complete", ApiKey.PRODUCE, 8), ("on_request", ApiKey.PRODUCE, 8),
                                   ("on_response", ApiKey.PRODUCE, 8)]
    assert len(stage.seen) == 6 and stage.completed == 3
    pipeline.route(ApiKey.PRODUCE, 9)  # another version: asked again
    assert len(stage.asked) == 6


def test_the_production_stages_handle_only_their_apis() -> None:
    from proxy.admin.api import QuotaAdminStage
    from proxy.stages.addresses import RewriteStage
    from proxy.stages.callbacks import ClusterMetadataStage
    from proxy.stages.client_software import ClientSoftwareStage

    software = ClientSoftwareStage()
    assert software.handles("on_request", ApiKey.API_VERSIONS, 3)
    assert not software.handles("on_request", ApiKey.API_VERSIONS, 2)  # no client software before v3
    assert not software.handles("on_request", ApiKey.PRODUCE, 9)
    admin = QuotaAdminStage.__new__(QuotaAdminStage)
    assert admin.handles("on_request", ApiKey.ALTER_CLIENT_QUOTAS, 1)
    assert admin.handles("on_request", ApiKey.DESCRIBE_CLIENT_QUOTAS, 1)
    assert not admin.handles("on_request", ApiKey.PRODUCE, 9)
    metadata = ClusterMetadataStage.__new__(ClusterMetadataStage)
    assert metadata.handles("on_response", ApiKey.METADATA, 12)
    assert not metadata.handles("on_response", ApiKey.FETCH, 12)
    rewrite = RewriteStage.__new__(RewriteStage)
    # KIP-951 leader endpoints: Produce v10+, Fetch v16+; the control plane in every version
    assert [v for v in range(14) if rewrite.handles("on_response", ApiKey.PRODUCE, v)] == [10, 11, 12, 13]
    assert [v for v in range(18) if rewrite.handles("on_response", ApiKey.FETCH, v)] == [16, 17]
    for api_key in (ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER, ApiKey.API_VERSIONS,
                    ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE):
        assert rewrite.handles("on_response", api_key, 0)
    assert not rewrite.handles("on_response", ApiKey.LIST_OFFSETS, 7)
