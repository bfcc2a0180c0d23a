"""`ClientSoftwareStage`: the client software name and version (KIP-511) of each connection, read
from its ApiVersions v3+ request; each distinct request body is read once."""

from __future__ import annotations

import struct

from protocol.apis import ApiKey
from protocol.headers import read_request_header
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext
from proxy.stages.client_software import ClientSoftwareStage


def api_versions_v3(correlation_id: int, name: bytes, version: bytes) -> bytes:
    return b"".join([
        struct.pack(">hhih", ApiKey.API_VERSIONS, 3, correlation_id, 1), b"c",  # header v2
        b"\x00",                                   # header tags
        bytes([len(name) + 1]), name,              # client_software_name (compact)
        bytes([len(version) + 1]), version,        # client_software_version (compact)
        b"\x00",                                   # tags
    ])


def told(stage: ClientSoftwareStage, payload: bytes, connection_id: int = 1) -> ConnectionContext:
    ctx = ConnectionContext(connection_id, "127.0.0.1:5000", "broker 1", 1)
    header = read_request_header(payload)
    assert stage.on_request(ctx, InFlight(header.correlation_id, 18, 3, "c", len(payload), 0),
                            header, payload) is None
    return ctx


def test_each_connection_gets_its_own_clients_software() -> None:
    stage = ClientSoftwareStage()
    java = told(stage, api_versions_v3(1, b"apache-kafka-java", b"4.3.1"))
    again = told(stage, api_versions_v3(7, b"apache-kafka-java", b"4.3.1"), 2)  # remembered: same answer
    rdkafka = told(stage, api_versions_v3(1, b"librdkafka", b"2.12.0"), 3)      # same lengths would not do
    older = told(stage, api_versions_v3(1, b"apache-kafka-java", b"4.3.0"), 4)
    assert (java.client_software_name, java.client_software_version) == ("apache-kafka-java", "4.3.1")
    assert (again.client_software_name, again.client_software_version) == ("apache-kafka-java", "4.3.1")
    assert (rdkafka.client_software_name, rdkafka.client_software_version) == ("librdkafka", "2.12.0")
    assert (older.client_software_name, older.client_software_version) == ("apache-kafka-java", "4.3.0")


def test_an_unreadable_body_leaves_the_connection_unnamed_and_many_bodies_stay_right() -> None:
    stage = ClientSoftwareStage()
    cut = api_versions_v3(1, b"apache-kafka-java", b"4.3.1")[:-5]
    assert told(stage, cut).client_software_name is None
    assert told(stage, cut).client_software_name is None  # not remembered as something
    for i in range(200):  # past what the stage remembers: it starts over, never answers wrongly
        ctx = told(stage, api_versions_v3(i, b"client-%d" % (i % 90), b"1.0"), i)
        assert ctx.client_software_name == f"client-{i % 90}"
