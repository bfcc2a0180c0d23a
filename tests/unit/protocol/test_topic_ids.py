"""Metadata by topic id, sans I/O: the request frame (read back with kio) and the answer's names."""

from __future__ import annotations

import datetime
import struct
import uuid

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import response as r

from protocol.encode import decode_request_body
from protocol.errors import DecodeError
from protocol.headers import read_request_header
from protocol.topic_ids import metadata_by_id_frame, parse_topic_names
from tests.unit.protocol.kio_support import response_payload

A, B = uuid.UUID(int=0xA1), uuid.UUID(int=0xB2)


def test_the_request_asks_by_id_for_every_id_and_creates_nothing() -> None:
    frame = metadata_by_id_frame(7, [A.bytes, B.bytes])
    (size,) = struct.unpack(">i", frame[:4])
    assert size == len(frame) - 4
    header = read_request_header(frame[4:])
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == \
        (3, 12, 7, "sluice-topic-ids")
    body = decode_request_body(frame[4:], header)
    assert [(t.topic_id, t.name) for t in body.topics] == [(A, None), (B, None)]
    assert body.allow_auto_topic_creation is False


@pytest.mark.parametrize("ids", [[], [b"short"], [bytes(16)]])
def test_no_ids_or_a_bad_id_is_refused(ids: list[bytes]) -> None:
    with pytest.raises(ValueError):
        metadata_by_id_frame(1, ids)


def topic(topic_id: uuid.UUID, name: str | None,
          error: ErrorCode = ErrorCode.none) -> r.MetadataResponseTopic:
    return r.MetadataResponseTopic(error_code=error, name=name, topic_id=topic_id, is_internal=False,
                                   partitions=(), topic_authorized_operations=-2147483648)


def test_the_answer_names_the_known_ids_only() -> None:
    body = r.MetadataResponse(throttle_time=datetime.timedelta(0), brokers=(), cluster_id="c",
                              controller_id=1,
                              topics=(topic(A, "orders"), topic(B, None, ErrorCode.unknown_topic_id)))
    assert parse_topic_names(response_payload(body, 9), 9) == {A.bytes: "orders"}
    with pytest.raises(DecodeError):  # the answer to another request
        parse_topic_names(response_payload(body, 9), 10)
