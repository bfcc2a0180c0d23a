"""Pure framing for naming topic ids: a Metadata v12 request that asks by id, and its answer.

Produce v13 and Fetch v13+ name topics by id only. A Sluice process that meets an id it cannot name
(the client's Metadata went through another instance or worker) asks the broker itself
(`proxy.stages.topic_resolver` sends these frames over its own connection). No I/O here.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence

from kio.schema.metadata.v12.request import MetadataRequestTopic

from protocol.apis import ApiKey, request_header_version
from protocol.encode import decode_response_body, encode_request, request_schema
from protocol.errors import DecodeError
from protocol.headers import RequestHeader, read_response_correlation_id

#: Metadata v10 added topic ids; v12 is the first whose request may leave the name null (by id).
METADATA_BY_ID_VERSION = 12
CLIENT_ID = "sluice-topic-ids"
_ZERO_ID = bytes(16)


def metadata_by_id_frame(correlation_id: int, topic_ids: Sequence[bytes]) -> bytes:
    """A size-prefixed Metadata v12 request for `topic_ids` (16 bytes each), by id, no creation."""
    if not topic_ids:
        raise ValueError("no topic id to ask for")
    schema = request_schema(ApiKey.METADATA, METADATA_BY_ID_VERSION)
    topics = []
    for raw in topic_ids:
        if len(raw) != 16 or raw == _ZERO_ID:
            raise ValueError(f"not a topic id: {raw.hex()}")
        topics.append(MetadataRequestTopic(topic_id=uuid.UUID(bytes=raw), name=None))
    body = schema(topics=tuple(topics), allow_auto_topic_creation=False,
                  include_topic_authorized_operations=False)
    header = RequestHeader(ApiKey.METADATA, METADATA_BY_ID_VERSION, correlation_id, CLIENT_ID,
                           request_header_version(ApiKey.METADATA, METADATA_BY_ID_VERSION), 0)
    payload = encode_request(header, body)
    return struct.pack(">i", len(payload)) + payload


def parse_topic_names(payload: bytes, correlation_id: int) -> dict[bytes, str]:
    """topic id -> name for every topic the response names without an error (an id the broker does
    not know comes back with UNKNOWN_TOPIC_ID and no name: left out)."""
    got = read_response_correlation_id(payload)
    if got != correlation_id:
        raise DecodeError(f"correlation id {got}, expected {correlation_id}", 0)
    body = decode_response_body(payload, ApiKey.METADATA, METADATA_BY_ID_VERSION)
    return {topic.topic_id.bytes: str(topic.name)
            for topic in body.topics or ()  # kio reads a null array as None
            if int(topic.error_code) == 0 and topic.name is not None and topic.topic_id is not None
            and topic.topic_id.bytes != _ZERO_ID}
