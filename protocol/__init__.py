"""Sans-IO Kafka wire handling for Sluice: framing, headers, throttle patching, rewrites.

Every function takes and returns frame *payloads*: the bytes after the 4-byte size prefix
(starting at api_key for requests, at correlation_id for responses), as read-only `bytes`.
Nothing here does I/O or imports asyncio; every error raised for bad input is a `ProtocolError`,
so a caller can catch that one family and forward the frame unchanged.

Produce and Fetch stay header-only on the forwarding path (their bodies are large and hot); the
access log walks their partitions without touching records (`protocol.records`); kio is used for
the control plane and for building synthesised responses (see `protocol.encode`).
"""

from protocol.apis import (
    ApiKey,
    api_name,
    is_flexible,
    request_header_version,
    response_header_version,
)
from protocol.encode import (
    decode_request_body,
    decode_response_body,
    encode_request,
    encode_response,
)
from protocol.errors import (
    DecodeError,
    EncodeError,
    FrameTooLarge,
    ProtocolError,
    UnsupportedVersion,
)
from protocol.fetch import FetchSession, empty_fetch_response, read_fetch_session
from protocol.framing import FrameSplitter, size_prefix
from protocol.headers import (
    RequestHeader,
    read_request_header,
    read_response_correlation_id,
    response_body_offset,
)
from protocol.produce import read_produce_acks
from protocol.records import (
    PartitionTraffic,
    fetch_response_partitions,
    produce_request_partitions,
    produce_response_errors,
    produce_response_summary,
    response_error_codes,
    topic_ids_from_metadata_response,
)
from protocol.rewrite import (
    PARSEABLE_MAX_VERSIONS,
    AddressMapper,
    BrokerAddress,
    cap_api_versions_response,
    read_api_versions_request_client_software,
    rewrite_describe_cluster_response,
    rewrite_fetch_response_node_endpoints,
    rewrite_find_coordinator_response,
    rewrite_metadata_response,
    rewrite_produce_response_node_endpoints,
)
from protocol.throttle import (
    patch_throttle_time,
    plan_throttle_patch,
    read_throttle_time_ms,
    throttle_time_offset,
)

__all__ = [
    "PARSEABLE_MAX_VERSIONS",
    "AddressMapper",
    "ApiKey",
    "BrokerAddress",
    "DecodeError",
    "EncodeError",
    "FetchSession",
    "FrameSplitter",
    "FrameTooLarge",
    "PartitionTraffic",
    "ProtocolError",
    "RequestHeader",
    "UnsupportedVersion",
    "api_name",
    "cap_api_versions_response",
    "decode_request_body",
    "decode_response_body",
    "empty_fetch_response",
    "encode_request",
    "encode_response",
    "fetch_response_partitions",
    "is_flexible",
    "patch_throttle_time",
    "plan_throttle_patch",
    "produce_request_partitions",
    "produce_response_errors",
    "produce_response_summary",
    "read_api_versions_request_client_software",
    "read_fetch_session",
    "read_produce_acks",
    "read_request_header",
    "read_response_correlation_id",
    "read_throttle_time_ms",
    "request_header_version",
    "response_body_offset",
    "response_error_codes",
    "response_header_version",
    "rewrite_describe_cluster_response",
    "rewrite_fetch_response_node_endpoints",
    "rewrite_find_coordinator_response",
    "rewrite_metadata_response",
    "rewrite_produce_response_node_endpoints",
    "size_prefix",
    "throttle_time_offset",
    "topic_ids_from_metadata_response",
]
