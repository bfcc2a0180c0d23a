"""The quota stage inside a real `ClientConnection`, over a fake transport, a fake upstream and a
fake clock (the rig of `test_connection`): what the broker is sent and what the client gets for a
Fetch of a topic with a consumer budget."""

from __future__ import annotations

import datetime as dt
import struct

from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fq
from kio.schema.fetch.v12 import response as fr

from protocol.apis import ApiKey
from protocol.encode import decode_response_body, encode_request, encode_response
from protocol.headers import RequestHeader, read_request_header
from protocol.throttle import read_throttle_time_ms
from proxy.flow.pipeline import Pipeline
from proxy.pumps.connection import ClientConnection, ConnectionServices
from proxy.pumps.services import Upstream
from proxy.pumps.upstreams import BrokerRegistry, UpstreamTarget
from proxy.stages.quota import QuotaStage
from quotas.clock import FakeClock
from quotas.config import QuotaConfig
from quotas.engine import QuotaEngine
from tests.unit.proxy.test_connection import FakeTimers, FakeTransport, FakeUpstream, run_ready_callbacks


async def topic_rig() -> tuple[ClientConnection, FakeTransport, FakeUpstream, FakeTimers]:
    """A connection to broker 1 whose pipeline is the quota stage, with topic t at 1 000 B/s
    (Kafka's default window, 11 x 1 s)."""
    clock = FakeClock(1_000)
    timers = FakeTimers(clock)
    config = QuotaConfig.from_dict({"entries": [{"topic": "t", "consumer_byte_rate": 1000}]})
    engine = QuotaEngine(config, clock)
    upstream = FakeUpstream()

    async def connect(client: ClientConnection, target: UpstreamTarget) -> Upstream | str:
        return upstream

    registry = BrokerRegistry("127.0.0.1", "127.0.0.1", lambda n: 0, lambda s, t: None)
    services = ConnectionServices(pipeline=Pipeline([QuotaStage(engine)]), registry=registry, clock=clock,
                                  bootstrap=[], connect_upstream=connect, call_later=timers.call_later)
    conn = ClientConnection(services, UpstreamTarget(1))
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    await run_ready_callbacks()
    return conn, transport, upstream, timers


def fetch_request(correlation_id: int) -> bytes:
    """librdkafka's default sizes: 50 MiB per fetch, 1 MiB per partition, one partition of t."""
    body = fq.FetchRequest(max_wait=dt.timedelta(milliseconds=500), min_bytes=1, max_bytes=52_428_800,
                           isolation_level=0, session_id=0, session_epoch=-1, topics=(fq.FetchTopic(
                               topic="t", partitions=(fq.FetchPartition(
                                   partition=0, fetch_offset=0, partition_max_bytes=1 << 20),)),),
                           forgotten_topics_data=(), rack_id="")
    return encode_request(RequestHeader(ApiKey.FETCH, 12, correlation_id, "app", 2, 0), body)


def fetch_response(correlation_id: int, record_bytes: int) -> bytes:
    body = fr.FetchResponse(throttle_time=dt.timedelta(0), error_code=ErrorCode.none, session_id=0,
                            responses=(fr.FetchableTopicResponse(topic="t", partitions=(fr.PartitionData(
                                partition_index=0, error_code=ErrorCode.none, high_watermark=10,
                                last_stable_offset=10, log_start_offset=0, aborted_transactions=None,
                                preferred_read_replica=-1, records=b"r" * record_bytes),)),))
    return encode_response(1, correlation_id, body)


def max_bytes(request: bytes) -> int:
    header = read_request_header(request)
    return int(struct.unpack_from(">i", request, header.body_offset + 12)[0])  # replica, wait, min


async def test_a_default_size_fetch_of_a_held_topic_is_capped_then_throttled_and_emptied() -> None:
    conn, transport, upstream, timers = await topic_rig()
    frame = fetch_request(1)
    conn.data_received(struct.pack(">i", len(frame)) + frame)
    # the broker is asked for one sample window of t's budget: 1 000 B/s x 1 s, not 50 MiB
    assert len(upstream.written) == 1 and max_bytes(upstream.written[0]) == 1000
    conn.on_upstream_frame(fetch_response(1, 1000))  # 1 000 B / 10 s = 100 B/s: delivered
    delivered = transport.frames()[-1]
    assert len(delivered) > 1000 and read_throttle_time_ms(delivered, ApiKey.FETCH, 12) == 0
    # nine more at once: 10 000 B / 10 s = 1 000 B/s, not above the bound; the tenth is over:
    # 11 000 B / 10 s = 1 100 B/s, (1 100 - 1 000) / 1 000 x 10 000 ms = 1 000 ms; answered empty
    for n in range(2, 12):
        frame = fetch_request(n)
        conn.data_received(struct.pack(">i", len(frame)) + frame)
        conn.on_upstream_frame(fetch_response(n, 1000))
    last = transport.frames()[-1]
    body = decode_response_body(last, ApiKey.FETCH, 12)
    assert body.responses == () and body.throttle_time == dt.timedelta(milliseconds=1000)
    # and the client is muted: a fetch sent now waits out the delay before it reaches the broker
    frame = fetch_request(12)
    conn.data_received(struct.pack(">i", len(frame)) + frame)
    assert len(upstream.written) == 11
    timers.advance(1000)
    assert len(upstream.written) == 12 and max_bytes(upstream.written[-1]) == 1000
