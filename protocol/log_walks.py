"""The Produce walks the access log runs on the event loop, in the shape its column batch takes.

Readable references of `protocol._log_speedups` (Cython), which answers the common flexible case
(Produce v9-v13: one-byte array and string lengths, empty tag sections) in C and hands every other
input to these functions, so both give the same answers and raise alike
(tests/unit/differential/test_log_walks.py). `protocol.log_fastpath` picks the implementation.

* `produce_log_parts`: a Produce request's partitions as plain tuples (topic name, topic id,
  partition, records or -1 when unknown, bytes), or None when its layout cannot be read;
* `produce_log_summary`: a Produce response's distinct non-zero error codes, sorted, and its
  throttle_time_ms, from one walk; raises ProtocolError when it cannot be read.
"""

from __future__ import annotations

from protocol import records
from protocol.errors import ProtocolError
from protocol.headers import RequestHeader

LogPart = tuple[str | None, bytes | None, int, int, int]


def produce_log_parts(payload: bytes, header: RequestHeader) -> tuple[LogPart, ...] | None:
    """(topic, topic_id, partition, records or -1, bytes) per partition of a Produce request, in
    wire order; None if `records.produce_request_partitions` cannot read it."""
    try:
        parts = records.produce_request_partitions(payload, header)
    except (ProtocolError, ValueError):
        return None
    return tuple((p.topic, p.topic_id, p.partition, -1 if p.records is None else p.records, p.bytes)
                 for p in parts)


def produce_log_summary(payload: bytes, api_version: int) -> tuple[tuple[int, ...], int]:
    """(sorted distinct non-zero error codes, throttle_time_ms) of a Produce response v1-v13."""
    codes, throttle_time_ms = records.produce_response_summary(payload, api_version)
    return tuple(sorted(set(codes))), throttle_time_ms
