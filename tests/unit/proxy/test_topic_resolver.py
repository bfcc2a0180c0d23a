"""Naming topic ids this process never saw named: `TopicNames` (bounded, tells a resolver of a
miss) and `TopicIdResolver` over a canned broker (a narrow fake: one Metadata answer)."""

from __future__ import annotations

import asyncio
import datetime
import struct
import uuid

from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import response as r

from protocol.encode import decode_request_body
from protocol.headers import read_request_header
from proxy.stages.topic_resolver import TopicIdResolver
from proxy.stages.topic_usage import TopicNames
from tests.harness.wait import poll_async
from tests.unit.protocol.kio_support import response_payload

KNOWN, UNKNOWN = uuid.UUID(int=0xA1), uuid.UUID(int=0xB2)


def test_topic_names_are_bounded_and_a_miss_is_reported() -> None:
    names = TopicNames(max_ids=2)
    missed: list[bytes] = []
    names.resolver = missed.append
    names.add({b"1" * 16: "a", b"2" * 16: "b"})
    names.add({b"3" * 16: "c"})                   # the oldest learned, a, is forgotten
    assert len(names) == 2
    assert names.name(None, b"3" * 16) == "c" and missed == []
    assert names.name(None, b"1" * 16) == (b"1" * 16).hex()
    assert missed == [b"1" * 16]
    assert names.name("by-name", None) == "by-name"  # a name needs no lookup


class CannedBroker:
    """Answers every Metadata request with KNOWN named `orders` and any other id unknown."""

    def __init__(self) -> None:
        self.asked: list[list[uuid.UUID]] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        payload = await reader.readexactly(size)
        header = read_request_header(payload)
        ids = [t.topic_id for t in decode_request_body(payload, header).topics]
        self.asked.append(ids)
        topics = tuple(r.MetadataResponseTopic(
            error_code=ErrorCode.none if i == KNOWN else ErrorCode.unknown_topic_id,
            name="orders" if i == KNOWN else None, topic_id=i, is_internal=False, partitions=(),
            topic_authorized_operations=-2147483648) for i in ids)
        body = r.MetadataResponse(throttle_time=datetime.timedelta(0), brokers=(), cluster_id="c",
                                  controller_id=1, topics=topics)
        answer = response_payload(body, header.correlation_id)
        writer.write(struct.pack(">i", len(answer)) + answer)
        await writer.drain()
        writer.close()


def test_the_resolver_asks_the_broker_once_and_names_what_it_answers() -> None:
    async def run() -> None:
        broker = CannedBroker()
        server = await asyncio.start_server(broker.serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        names = TopicNames()
        now = [100.0]
        resolver = TopicIdResolver(names, [("127.0.0.1", port)], retry_ms=30_000, clock_s=lambda: now[0])
        resolver.attach()
        try:
            # the hot path: two misses of each id before the answer comes; one request asks for both
            for _ in range(2):
                assert names.name(None, KNOWN.bytes) == KNOWN.bytes.hex()
                names.name(None, UNKNOWN.bytes)
            await poll_async(lambda: bool(resolver.resolved or resolver.failures), 2.0)
            assert broker.asked == [[KNOWN, UNKNOWN]]
            assert names.name(None, KNOWN.bytes) == "orders"
            # the id the broker did not name is not asked again until retry_ms has passed
            names.name(None, UNKNOWN.bytes)
            assert resolver.waiting == 0 and resolver.unresolved == 1
            now[0] += 31
            names.name(None, UNKNOWN.bytes)
            await poll_async(lambda: len(broker.asked) == 2 and resolver.unresolved == 2, 2.0)
            assert broker.asked[1] == [UNKNOWN]
        finally:
            await resolver.close()
            server.close()
            await server.wait_closed()

    asyncio.run(run())


def test_a_broker_that_cannot_be_reached_is_a_counted_failure_and_the_hex_form_stays() -> None:
    async def run() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()            # nothing listens there now
        names = TopicNames()
        resolver = TopicIdResolver(names, [("127.0.0.1", port)], timeout_s=2)
        resolver.attach()
        names.name(None, KNOWN.bytes)
        await poll_async(lambda: bool(resolver.failures), 2.0)
        assert resolver.failures == 1 and names.name(None, KNOWN.bytes) == KNOWN.bytes.hex()
        await resolver.close()

    asyncio.run(run())
