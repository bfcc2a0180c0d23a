"""Naming topic ids this process never saw named: `TopicNames` (bounded, tells a resolver of a
miss) and `TopicIdResolver` over a canned broker (a narrow fake: one Metadata answer), and on a
client's own connection when the bootstrap broker will not answer (a SASL-only listener)."""

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
    names.resolver = lambda raw, via: missed.append(raw)
    names.add({b"1" * 16: "a", b"2" * 16: "b"})
    names.add({b"3" * 16: "c"})                   # the oldest learned, a, is forgotten
    assert len(names) == 2
    assert names.name(None, b"3" * 16) == "c" and missed == []
    assert names.name(None, b"1" * 16) == (b"1" * 16).hex()
    assert missed == [b"1" * 16]
    assert names.name("by-name", None) == "by-name"  # a name needs no lookup


def answer(payload: bytes, asked: list[list[uuid.UUID]]) -> bytes:
    """The broker's Metadata v12 answer: KNOWN named `orders`, any other id unknown."""
    header = read_request_header(payload)
    ids = [t.topic_id for t in decode_request_body(payload, header).topics]
    asked.append(ids)
    topics = tuple(r.MetadataResponseTopic(
        error_code=ErrorCode.none if i == KNOWN else ErrorCode.unknown_topic_id,
        name="orders" if i == KNOWN else None, topic_id=i, is_internal=False, partitions=(),
        topic_authorized_operations=-2147483648) for i in ids)
    body = r.MetadataResponse(throttle_time=datetime.timedelta(0), brokers=(), cluster_id="c",
                              controller_id=1, topics=topics)
    return response_payload(body, header.correlation_id)


class CannedBroker:
    """Answers every Metadata request with KNOWN named `orders` and any other id unknown."""

    def __init__(self) -> None:
        self.asked: list[list[uuid.UUID]] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        reply = answer(await reader.readexactly(size), self.asked)
        writer.write(struct.pack(">i", len(reply)) + reply)
        await writer.drain()
        writer.close()


async def sasl_only(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A SASL-only listener: a Metadata request before authentication closes the connection."""
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    await reader.readexactly(size)
    writer.close()


class ClientConnection:
    """A client's upstream connection as `send_own` offers it: the requests Sluice sent on it, each
    answered when the test says (the broker answers in order after the client's own requests)."""

    def __init__(self, open_: bool = True) -> None:
        self.open = open_
        self.sent: list[tuple[bytes, asyncio.Future[bytes]]] = []
        self.asked: list[list[uuid.UUID]] = []

    def send_own(self, payload: bytes) -> asyncio.Future[bytes] | None:
        if not self.open:
            return None
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.sent.append((payload, future))
        return future

    def answer_all(self) -> None:
        for payload, future in self.sent:
            if not future.done():
                future.set_result(answer(payload, self.asked))


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


def test_a_sasl_only_broker_is_asked_on_the_connection_of_the_client_that_used_the_id() -> None:
    """The bootstrap broker closes Sluice's unauthenticated lookup (SASL required): the id is asked
    on the upstream connection of the client whose request carried it, with a correlation id of
    Sluice's own (negative), and named from that answer. The bootstrap is not tried again before
    retry_ms; an id whose request came on no connection that can carry one is not marked failed,
    so the next request using it asks again."""
    async def run() -> None:
        server = await asyncio.start_server(sasl_only, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        names = TopicNames()
        now = [100.0]
        resolver = TopicIdResolver(names, [("127.0.0.1", port)], retry_ms=30_000, clock_s=lambda: now[0])
        resolver.attach()
        client = ClientConnection()
        try:
            assert names.name(None, KNOWN.bytes, client.send_own) == KNOWN.bytes.hex()
            await poll_async(lambda: bool(client.sent), 2.0)
            payload, _ = client.sent[0]
            header = read_request_header(payload)
            assert (header.api_key, header.api_version) == (3, 12) and header.correlation_id < 0
            client.answer_all()
            await poll_async(lambda: bool(resolver.resolved), 2.0)
            assert names.name(None, KNOWN.bytes) == "orders"
            assert client.asked == [[KNOWN]]
            assert (resolver.requests, resolver.own_requests, resolver.failures) == (1, 1, 1)

            # the bootstrap is in its back-off: an id that came on a closed connection cannot be
            # asked anywhere, so it is not marked failed ...
            closed = ClientConnection(open_=False)
            names.name(None, UNKNOWN.bytes, closed.send_own)
            await poll_async(lambda: resolver.waiting == 0, 2.0)
            assert resolver.requests == 1 and resolver.unresolved == 0
            # ... and the next request that uses it, on an open connection, asks at once
            names.name(None, UNKNOWN.bytes, client.send_own)
            await poll_async(lambda: len(client.sent) == 2, 2.0)
            client.answer_all()
            await poll_async(lambda: resolver.unresolved == 1, 2.0)   # unknown to the broker
            assert client.asked[-1] == [UNKNOWN] and resolver.requests == 1
        finally:
            await resolver.close()
            server.close()
            await server.wait_closed()

    asyncio.run(run())


def test_a_bootstrap_that_answers_is_asked_first_and_the_client_connection_only_for_what_it_left() -> None:
    """Where the unauthenticated lookup works it is used; only ids it did not name go on to the
    client's connection (a broker that names nothing to ANONYMOUS, say)."""
    async def run() -> None:
        broker = CannedBroker()
        server = await asyncio.start_server(broker.serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        names = TopicNames()
        resolver = TopicIdResolver(names, [("127.0.0.1", port)])
        resolver.attach()
        client = ClientConnection()
        try:
            names.name(None, KNOWN.bytes, client.send_own)
            names.name(None, UNKNOWN.bytes, client.send_own)
            await poll_async(lambda: bool(client.sent), 2.0)
            client.answer_all()
            await poll_async(lambda: resolver.waiting == 0 and resolver.unresolved == 1, 2.0)
            assert broker.asked == [[KNOWN, UNKNOWN]] and client.asked == [[UNKNOWN]]
            assert names.name(None, KNOWN.bytes) == "orders"
        finally:
            await resolver.close()
            server.close()
            await server.wait_closed()

    asyncio.run(run())
