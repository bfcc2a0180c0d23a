"""Principals on live connections, in process: a real `ClientConnection` between an asyncio client and
a scripted fake broker, so that every step of a SASL exchange can be observed (and the raw-token
framing after a SaslHandshake v0 driven exactly, including clients that do not wait their turn).

The real broker proves the same behaviour end to end in tests/integration/test_principals.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, suppress
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_authenticate.v2.response import SaslAuthenticateResponse
from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as HandshakeV0
from kio.schema.sasl_handshake.v0.response import SaslHandshakeResponse as HandshakeResponseV0
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest as HandshakeV1
from kio.schema.sasl_handshake.v1.response import SaslHandshakeResponse as HandshakeResponseV1
from kio.static.primitive import i64Timedelta

from protocol.encode import encode_request, encode_response
from protocol.headers import RequestHeader, read_request_header
from protocol.principal_rules import SslPrincipalMapper
from protocol.proxy_protocol import encode_v1, encode_v2
from proxy.flow.pipeline import Pipeline
from proxy.pumps.connection import ClientConnection, ConnectionServices, connection_factory
from proxy.pumps.listeners import ListenerSettings
from proxy.pumps.principals import AuthSettings
from proxy.pumps.upstreams import BrokerRegistry, UpstreamTarget
from quotas.clock import SystemClock
from tests.harness.tls import TestCA

TIMEOUT = 5.0
SECRET = b"pw-SECRET"


@pytest.fixture(autouse=True)
def no_secret_is_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Every test here sends real-looking secrets; none may reach a log line."""
    caplog.set_level(logging.DEBUG)
    yield
    assert SECRET.decode() not in caplog.text


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def request(body: Any, correlation_id: int) -> bytes:
    header = RequestHeader(type(body).__api_key__, type(body).__version__, correlation_id, "test",
                           2 if type(body).__flexible__ else 1, 0)
    return frame(encode_request(header, body))


def authenticate(token: bytes, correlation_id: int) -> bytes:
    return request(SaslAuthenticateRequest(auth_bytes=token), correlation_id)


def authenticate_response(correlation_id: int, error: ErrorCode = ErrorCode.none,
                          token: bytes = b"") -> bytes:
    body = SaslAuthenticateResponse(error_code=error, error_message=None if error == ErrorCode.none else "no",
                                    auth_bytes=token, session_lifetime=i64Timedelta.parse(timedelta(0)))
    return frame(encode_response(1, correlation_id, body))


def api_versions_request(correlation_id: int) -> bytes:
    # ApiVersions v0: no body; the fake broker answers any request with an opaque body
    return frame(struct.pack(">hhih", 18, 0, correlation_id, 4) + b"test")


class Peer:
    """One side of a TCP connection, reading size-prefixed frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def frame(self) -> bytes:
        size = struct.unpack(">i", await asyncio.wait_for(self.reader.readexactly(4), TIMEOUT))[0]
        return await asyncio.wait_for(self.reader.readexactly(size), TIMEOUT)

    async def request(self) -> RequestHeader:
        return read_request_header(await self.frame())

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def at_eof(self) -> bool:
        try:
            return await asyncio.wait_for(self.reader.read(1), TIMEOUT) == b""
        except ConnectionResetError:
            return True

    async def answer(self, payload_after_correlation: bytes = b"\x00\x00") -> RequestHeader:
        """Read a Kafka request and answer it with an opaque response."""
        header = await self.request()
        self.send(frame(struct.pack(">i", header.correlation_id) + payload_after_correlation))
        return header


Script = Callable[[Peer], Awaitable[None]]


class Rig:
    def __init__(self, services: ConnectionServices, port: int, client: Peer | None,
                 broker: asyncio.Future[Peer], closed: list[ClientConnection]) -> None:
        self.services = services
        self.closed_connections = closed
        self.port = port
        self._client = client
        self._broker = broker

    @property
    def client(self) -> Peer:
        assert self._client is not None
        return self._client

    async def broker(self) -> Peer:
        return await asyncio.wait_for(self._broker, TIMEOUT)

    @property
    def connection(self) -> ClientConnection:
        """The connection, open or (the last one) closed."""
        live = list(self.services.connections)
        if live:
            (conn,) = live
            return conn
        return self.closed_connections[-1]

    async def wait_closed(self) -> None:
        """Until Sluice has seen the connection end (connection_lost ran, reasons are logged)."""
        for _ in range(int(TIMEOUT / 0.01)):
            if not self.services.connections and self.closed_connections:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the connection did not close")

    @property
    def principal(self) -> str:
        return self.connection.ctx.principal


@asynccontextmanager
async def rig(auth: AuthSettings | None = None, listener: ListenerSettings | None = None,
              client_ssl: ssl.SSLContext | None = None, prefix: bytes = b"", connect: bool = True
              ) -> AsyncIterator[Rig]:
    """A fake broker, Sluice's connection code in front of it, and a connected client."""
    loop = asyncio.get_running_loop()
    broker_side: asyncio.Future[Peer] = loop.create_future()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        broker_side.set_result(Peer(reader, writer))

    broker = await asyncio.start_server(accept, "127.0.0.1", 0)
    services = ConnectionServices(
        pipeline=Pipeline([]),
        registry=BrokerRegistry("127.0.0.1", "127.0.0.1", lambda n: 0, lambda s, t: None),
        clock=SystemClock(), bootstrap=[("127.0.0.1", broker.sockets[0].getsockname()[1])],
        auth=auth or AuthSettings(), listener=listener or ListenerSettings())
    closed: list[ClientConnection] = []
    services.on_close = closed.append
    listen = listener or ListenerSettings()
    server = await loop.create_server(connection_factory(services)(UpstreamTarget(None)), "127.0.0.1", 0,
                                      ssl=listen.server_ssl)
    port = server.sockets[0].getsockname()[1]
    client: Peer | None = None
    if connect and prefix:  # a PROXY header: sent before TLS starts
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(prefix)
        if client_ssl is not None:
            await writer.start_tls(client_ssl, server_hostname="localhost")
        client = Peer(reader, writer)
    elif connect:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ssl,
                                                       server_hostname="localhost" if client_ssl else None)
        client = Peer(reader, writer)
    try:
        yield Rig(services, port, client, broker_side, closed)
    finally:
        if client is not None:
            client.writer.close()
        server.close()
        broker.close()
        for conn in list(services.connections):
            conn.close()
        await asyncio.sleep(0)


async def handshake(r: Rig, mechanism: str, version: int = 1, error: ErrorCode = ErrorCode.none) -> None:
    body = (HandshakeV1 if version else HandshakeV0)(mechanism=mechanism)
    r.client.send(request(body, 1))
    broker = await r.broker()
    header = await broker.request()
    assert header.api_version == version
    answer = HandshakeResponseV1 if version else HandshakeResponseV0
    reply = answer(error_code=error, mechanisms=(mechanism,))
    broker.send(frame(encode_response(0, header.correlation_id, reply)))
    await r.client.frame()


# ----------------------------------------------------------------------------- SaslAuthenticate

async def test_plain_principal_only_after_the_broker_says_yes() -> None:
    async with rig() as r:
        await handshake(r, "PLAIN")
        r.client.send(authenticate(b"\x00alice\x00" + SECRET, 2))
        broker = await r.broker()
        header = await broker.request()
        assert r.principal == "ANONYMOUS"                 # asked, not yet answered
        broker.send(authenticate_response(header.correlation_id))
        await r.client.frame()
        assert r.principal == "alice"


async def test_refused_credentials_leave_the_connection_anonymous(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with rig() as r:
        await handshake(r, "PLAIN")
        r.client.send(authenticate(b"\x00alice\x00" + SECRET, 2))
        broker = await r.broker()
        header = await broker.request()
        broker.send(authenticate_response(header.correlation_id, ErrorCode.sasl_authentication_failed))
        await r.client.frame()
        assert r.principal == "ANONYMOUS"
    assert "authentication failed (broker error 58)" in caplog.text
    assert "alice" not in caplog.text and SECRET.decode() not in caplog.text


async def test_scram_needs_its_second_round() -> None:
    async with rig() as r:
        await handshake(r, "SCRAM-SHA-512")
        broker = await r.broker()
        r.client.send(authenticate(b"n,,n=bob=2Cjr,r=nonce", 2))
        broker.send(authenticate_response((await broker.request()).correlation_id,
                                          token=b"r=noncenonce,s=c2FsdA==,i=4096"))
        await r.client.frame()
        assert r.principal == "ANONYMOUS"                 # server-first is not success
        r.client.send(authenticate(b"c=biws,r=noncenonce,p=cHJvb2Y=", 3))
        broker.send(authenticate_response((await broker.request()).correlation_id, token=b"v=c2ln"))
        await r.client.frame()
        assert r.principal == "bob,jr"


async def test_scram_wrong_proof_fails_in_the_second_round() -> None:
    async with rig() as r:
        await handshake(r, "SCRAM-SHA-256")
        broker = await r.broker()
        r.client.send(authenticate(b"n,,n=bob,r=nonce", 2))
        broker.send(authenticate_response((await broker.request()).correlation_id,
                                          token=b"r=nn,s=c2FsdA==,i=1"))
        await r.client.frame()
        r.client.send(authenticate(b"c=biws,r=nn,p=d3Jvbmc=", 3))
        broker.send(authenticate_response((await broker.request()).correlation_id,
                                          ErrorCode.sasl_authentication_failed))
        await r.client.frame()
        assert r.principal == "ANONYMOUS"


def jwt(claims: dict[str, Any]) -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")
    return f"{part({'alg': 'none'})}.{part(claims)}."


@pytest.mark.parametrize(("claim", "expected"), [("sub", "svc-1"), ("client_id", "orders-app")])
async def test_oauthbearer_token_subject_or_configured_claim(claim: str, expected: str) -> None:
    token = jwt({"sub": "svc-1", "client_id": "orders-app"})
    async with rig(AuthSettings(oauthbearer_claim=claim)) as r:
        await handshake(r, "OAUTHBEARER")
        broker = await r.broker()
        r.client.send(authenticate(f"n,,\x01auth=Bearer {token}\x01\x01".encode(), 2))
        broker.send(authenticate_response((await broker.request()).correlation_id))
        await r.client.frame()
        assert r.principal == expected


async def test_oauthbearer_error_challenge_is_not_success() -> None:
    token = jwt({"sub": "svc-1"})
    async with rig() as r:
        await handshake(r, "OAUTHBEARER")
        broker = await r.broker()
        r.client.send(authenticate(f"n,,\x01auth=Bearer {token}\x01\x01".encode(), 2))
        broker.send(authenticate_response((await broker.request()).correlation_id,
                                          token=b'{"status":"invalid_token"}'))   # error code 0!
        await r.client.frame()
        assert r.principal == "ANONYMOUS"
        r.client.send(authenticate(b"\x01", 3))
        broker.send(authenticate_response((await broker.request()).correlation_id,
                                          ErrorCode.sasl_authentication_failed))
        await r.client.frame()
        assert r.principal == "ANONYMOUS"


async def test_reauthentication_updates_the_principal_and_a_failed_one_does_not() -> None:
    async with rig() as r:
        for user, error, expected in [(b"alice", ErrorCode.none, "alice"), (b"bob", ErrorCode.none, "bob"),
                                      (b"carol", ErrorCode.sasl_authentication_failed, "bob")]:
            await handshake(r, "PLAIN")
            broker = await r.broker()
            r.client.send(authenticate(b"\x00" + user + b"\x00" + SECRET, 7))
            broker.send(authenticate_response((await broker.request()).correlation_id, error))
            await r.client.frame()
            assert r.principal == expected


async def test_authenticate_without_a_handshake_names_nobody() -> None:
    async with rig() as r:
        r.client.send(authenticate(b"\x00alice\x00" + SECRET, 2))
        broker = await r.broker()
        broker.send(authenticate_response((await broker.request()).correlation_id))  # even if a broker said 0
        await r.client.frame()
        assert r.principal == "ANONYMOUS"


async def test_refused_mechanism_then_authenticate_names_nobody() -> None:
    async with rig() as r:
        await handshake(r, "PLAIN", error=ErrorCode.unsupported_sasl_mechanism)
        broker = await r.broker()
        r.client.send(authenticate(b"\x00alice\x00" + SECRET, 2))
        broker.send(authenticate_response((await broker.request()).correlation_id))
        await r.client.frame()
        assert r.principal == "ANONYMOUS"


async def test_unreadable_first_message_accepted_by_the_broker_keeps_the_principal() -> None:
    async with rig(AuthSettings(principal_from_address=True)) as r:
        await handshake(r, "GSSAPI")
        broker = await r.broker()
        r.client.send(authenticate(b"\x60\x82kerberos", 2))
        broker.send(authenticate_response((await broker.request()).correlation_id))
        await r.client.frame()
        assert r.principal == "127.0.0.1"


# ----------------------------------------------------------------------------- raw tokens (v0)

async def test_raw_plain_exchange_then_kafka_requests() -> None:
    async with rig() as r:
        await handshake(r, "PLAIN", version=0)
        broker = await r.broker()
        r.client.send(frame(b"\x00alice\x00" + SECRET))             # raw: no Kafka header
        assert await broker.frame() == b"\x00alice\x00" + SECRET    # forwarded as it is
        assert r.principal == "ANONYMOUS"
        broker.send(frame(b""))                                     # the broker's raw (empty) answer
        assert await r.client.frame() == b""
        assert r.principal == "alice"
        r.client.send(api_versions_request(5))                      # Kafka framing again
        assert (await broker.answer()).correlation_id == 5
        assert struct.unpack(">i", (await r.client.frame())[:4])[0] == 5


async def test_raw_tokens_sent_before_the_handshake_answer_are_held() -> None:
    async with rig() as r:
        r.client.send(request(HandshakeV0(mechanism="PLAIN"), 1) + frame(b"\x00alice\x00" + SECRET))
        broker = await r.broker()
        header = await broker.request()
        accepted = HandshakeResponseV0(error_code=ErrorCode.none, mechanisms=("PLAIN",))
        broker.send(frame(encode_response(0, header.correlation_id, accepted)))
        assert await broker.frame() == b"\x00alice\x00" + SECRET   # read as a raw token, not a request
        broker.send(frame(b""))
        await r.client.frame()
        assert await r.client.frame() == b""
        assert r.principal == "alice"


async def test_a_request_sent_with_the_last_token_waits_for_the_broker_answer() -> None:
    async with rig() as r:
        await handshake(r, "PLAIN", version=0)
        broker = await r.broker()
        r.client.send(frame(b"\x00alice\x00" + SECRET) + api_versions_request(9))
        assert await broker.frame() == b"\x00alice\x00" + SECRET
        broker.send(frame(b""))                                     # done: what follows is Kafka again
        assert (await broker.answer()).correlation_id == 9          # parsed as a request, answered
        assert await r.client.frame() == b""
        assert struct.unpack(">i", (await r.client.frame())[:4])[0] == 9
        assert r.principal == "alice"


async def test_raw_scram_two_rounds() -> None:
    async with rig() as r:
        await handshake(r, "SCRAM-SHA-256", version=0)
        broker = await r.broker()
        r.client.send(frame(b"n,,n=carol,r=abc"))
        assert await broker.frame() == b"n,,n=carol,r=abc"
        broker.send(frame(b"r=abcdef,s=c2FsdA==,i=4096"))
        assert await r.client.frame() == b"r=abcdef,s=c2FsdA==,i=4096"
        assert r.principal == "ANONYMOUS"
        r.client.send(frame(b"c=biws,r=abcdef,p=cHJvb2Y="))
        assert await broker.frame() == b"c=biws,r=abcdef,p=cHJvb2Y="
        broker.send(frame(b"v=c2lnbmF0dXJl"))
        assert await r.client.frame() == b"v=c2lnbmF0dXJl"
        assert r.principal == "carol"
        r.client.send(api_versions_request(4))
        assert (await broker.answer()).correlation_id == 4


async def test_raw_refusal_is_a_closed_connection() -> None:
    async with rig() as r:
        await handshake(r, "PLAIN", version=0)
        broker = await r.broker()
        r.client.send(frame(b"\x00alice\x00wrong"))
        await broker.frame()
        assert r.principal == "ANONYMOUS"
        broker.writer.close()                                       # Kafka: no answer, just closed
        assert await r.client.at_eof()


async def test_raw_tokens_for_a_mechanism_sluice_cannot_follow_close_the_connection(
        caplog: pytest.LogCaptureFixture) -> None:
    async with rig() as r:
        r.client.send(request(HandshakeV0(mechanism="GSSAPI"), 1))
        broker = await r.broker()
        header = await broker.request()
        accepted = HandshakeResponseV0(error_code=ErrorCode.none, mechanisms=("GSSAPI",))
        broker.send(frame(encode_response(0, header.correlation_id, accepted)))
        assert await r.client.at_eof()
        await r.wait_closed()
    assert "cannot tell where the exchange ends" in caplog.text


# ----------------------------------------------------------------------------- TLS, addresses, PROXY

@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("ca"))


def server_tls(ca: TestCA, client_auth: ssl.VerifyMode = ssl.CERT_REQUIRED) -> ssl.SSLContext:
    files = ca.issue("sluice", "localhost", server=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(files.cert, files.key)
    ctx.load_verify_locations(ca.cert_path)
    ctx.verify_mode = client_auth
    return ctx


def client_tls(ca: TestCA, cn: str | None = None, org: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca.cert_path))
    if cn is not None:
        files = ca.issue(f"client-{cn}", cn, org=org)
        ctx.load_cert_chain(files.cert, files.key)
    return ctx


RULES = SslPrincipalMapper.from_rules("RULE:^CN=([^,]+),O=Sluice$/$1/L,DEFAULT")


async def test_client_certificate_is_mapped(ca: TestCA) -> None:
    async with rig(AuthSettings(tls_mapper=RULES), ListenerSettings(tls=server_tls(ca)),
                   client_tls(ca, "Alice", "Sluice")) as r:
        r.client.send(api_versions_request(1))
        await (await r.broker()).answer()
        await r.client.frame()
        assert r.principal == "alice"


async def test_unmapped_subject_uses_default_and_sasl_then_wins(ca: TestCA) -> None:
    async with rig(AuthSettings(tls_mapper=RULES), ListenerSettings(tls=server_tls(ca)),
                   client_tls(ca, "svc", "Elsewhere")) as r:
        await handshake(r, "PLAIN")
        assert r.principal == "CN=svc,O=Elsewhere"
        broker = await r.broker()
        r.client.send(authenticate(b"\x00bob\x00" + SECRET, 2))
        broker.send(authenticate_response((await broker.request()).correlation_id))
        await r.client.frame()
        assert r.principal == "bob"


async def test_no_rule_applies_refuses_the_connection(ca: TestCA, caplog: pytest.LogCaptureFixture) -> None:
    strict = SslPrincipalMapper.from_rules("RULE:^CN=([^,]+),O=Sluice$/$1/")
    async with rig(AuthSettings(tls_mapper=strict), ListenerSettings(tls=server_tls(ca)),
                   client_tls(ca, "mallory", "Elsewhere")) as r:
        assert await r.client.at_eof()
        await r.wait_closed()
    assert "No rules apply to CN=mallory,O=Elsewhere" in caplog.text


async def test_requested_client_auth_without_a_certificate_is_anonymous(ca: TestCA) -> None:
    async with rig(AuthSettings(tls_mapper=RULES), ListenerSettings(tls=server_tls(ca, ssl.CERT_OPTIONAL)),
                   client_tls(ca)) as r:
        r.client.send(api_versions_request(1))
        await (await r.broker()).answer()
        await r.client.frame()
        assert r.principal == "ANONYMOUS"


async def test_client_address_as_principal() -> None:
    async with rig(AuthSettings(principal_from_address=True)) as r:
        r.client.send(api_versions_request(1))
        await (await r.broker()).answer()
        await r.client.frame()
        assert r.principal == "127.0.0.1"


@pytest.mark.parametrize("header", [encode_v1(("203.0.113.7", 4711), ("127.0.0.1", 9092)),
                                    encode_v2(("2001:db8::7", 4711), ("::1", 9092))])
async def test_proxy_protocol_gives_the_real_address(header: bytes) -> None:
    real = "203.0.113.7" if b"203" in header else "2001:db8::7"
    async with rig(AuthSettings(principal_from_address=True),
                   ListenerSettings(proxy_versions=frozenset({1, 2})),
                   prefix=header + api_versions_request(3)) as r:     # the header and a request at once
        assert (await (await r.broker()).answer()).correlation_id == 3
        await r.client.frame()
        assert r.principal == real
        assert r.connection.ctx.client_address == f"{real}:4711"


async def test_proxy_local_command_uses_the_peer_address() -> None:
    async with rig(AuthSettings(principal_from_address=True), ListenerSettings(proxy_versions=frozenset({2})),
                   prefix=encode_v2(None)) as r:
        r.client.send(api_versions_request(3))
        await (await r.broker()).answer()
        await r.client.frame()
        assert r.principal == "127.0.0.1"


@pytest.mark.parametrize("prefix", [b"GET / HTTP/1.1\r\n\r\n", api_versions_request(1),
                                    encode_v1(("10.0.0.1", 1), ("10.0.0.2", 2))])
async def test_missing_or_unaccepted_proxy_header_closes(prefix: bytes,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    async with rig(listener=ListenerSettings(proxy_versions=frozenset({2})), prefix=prefix) as r:
        assert await r.client.at_eof()
        assert not r.services.connections
    assert "refused: connection does not start with a PROXY protocol v2 header" in caplog.text


async def test_silence_instead_of_a_proxy_header_times_out(caplog: pytest.LogCaptureFixture) -> None:
    async with rig(listener=ListenerSettings(proxy_versions=frozenset({1}), header_timeout_s=0.2),
                   prefix=b"PROXY TCP4 ") as r:
        assert await r.client.at_eof()
    assert "no PROXY protocol header in time" in caplog.text


def tls_client_behind_a_proxy_hop(port: int, header: bytes, ctx: ssl.SSLContext, payload: bytes) -> bytes:
    """A blocking client whose first write is the PROXY header and the TLS ClientHello together;
    sends `payload` over TLS and returns the first frame that comes back."""
    import socket

    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        def pump(op: Callable[[], Any]) -> Any:
            while True:
                try:
                    return op()
                except ssl.SSLWantReadError:
                    if pending := outgoing.read():
                        sock.sendall(pending)
                    data = sock.recv(65536)
                    if not data:
                        raise ConnectionError("closed") from None
                    incoming.write(data)

        with suppress(ssl.SSLWantReadError):
            tls.do_handshake()                         # writes the ClientHello into `outgoing`
        sock.sendall(header + outgoing.read())        # one segment: header + ClientHello
        pump(tls.do_handshake)
        tls.write(payload)
        sock.sendall(outgoing.read())
        size = struct.unpack(">i", pump(lambda: tls.read(4)))[0]
        data = bytearray()
        while len(data) < size:
            data += pump(partial(tls.read, size - len(data)))
        return bytes(data)


async def test_proxy_header_then_tls_with_the_client_hello_in_the_same_segment(ca: TestCA) -> None:
    """TLS behind a PROXY hop: the handshake starts on the bytes after the header, even when the
    load balancer sent both in one write."""
    header = encode_v2(("198.51.100.9", 5000), ("127.0.0.1", 9092))
    async with rig(AuthSettings(tls_mapper=RULES, principal_from_address=True),
                   ListenerSettings(tls=server_tls(ca), proxy_versions=frozenset({2})), connect=False) as r:
        client = asyncio.to_thread(tls_client_behind_a_proxy_hop, r.port, header,
                                   client_tls(ca, "Alice", "Sluice"), api_versions_request(3))

        async def broker() -> None:
            await (await r.broker()).answer()

        response, _ = await asyncio.gather(client, broker())
        assert struct.unpack(">i", response[:4])[0] == 3
        assert r.principal == "alice"                     # the certificate wins over the address
        assert r.connection.ctx.client_address == "198.51.100.9:5000"
