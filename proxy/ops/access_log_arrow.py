"""The writer process's half of a `LogBatch`: an Arrow record batch of `contracts.access_log` records.

Built column by column from the batch's C arrays (`pyarrow.py_buffer`, no copy), its dictionaries
(`take`) and sentinels (validity masks): no Python object per row. Only the responses the proxy
deferred (`LogBatch.deferred`, other APIs than Produce, Fetch and ApiVersions) are read here, one
by one, with kio: their error codes, and a Metadata v10+'s topic ids, which name the topic ids of
Produce v13 and Fetch v13+ requests (by what the writer had learnt when the batch arrived, the
batch's own Metadata responses included).
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from contracts.access_log import FIELDS, SCHEMA_VERSION
from protocol import records
from protocol.apis import ApiKey, api_name
from protocol.errors import ProtocolError
from proxy.ops.access_log_batch import NULL_INT, LogBatch

log = logging.getLogger("sluice.access_log")

_SCHEMA: Any = None


def arrow_schema() -> Any:
    """The record schema as a pyarrow schema (from `contracts.access_log.FIELDS`), built once."""
    global _SCHEMA
    if _SCHEMA is None:
        scalar = {"string": pa.string(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(),
                  "double": pa.float64(), "boolean": pa.bool_(), "array<int16>": pa.list_(pa.int16())}

        def arrow_type(field: Any) -> Any:
            if field.type == "array<struct>":
                members = [pa.field(f.name, arrow_type(f), f.nullable) for f in field.fields]
                return pa.list_(pa.struct(members))
            return scalar[field.type]

        _SCHEMA = pa.schema([pa.field(f.name, arrow_type(f), f.nullable) for f in FIELDS])
    return _SCHEMA


def _numbers(values: Any, arrow_type: Any) -> Any:
    """An array.array as an Arrow array of its own C type (no copy)."""
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(values)])


def _nullable(values: Any, target: Any) -> Any:
    """An int64 array.array with `NULL_INT` for null, as a nullable Arrow array of `target` type."""
    raw = _numbers(values, pa.int64())
    masked = pc.if_else(pc.equal(raw, NULL_INT), pa.scalar(None, pa.int64()), raw)
    return masked.cast(target)


def _take(dictionary: list[Any], indices: Any, arrow_type: Any) -> Any:
    """`dictionary[i]` for every index (an int32 array.array; -1 is null)."""
    index_array = _numbers(indices, pa.int32())
    if -1 in indices:
        index_array = pc.if_else(pc.equal(index_array, -1), pa.scalar(None, pa.int32()), index_array)
    return pc.take(pa.array(dictionary, type=arrow_type), index_array)


def resolve_deferred(batch: LogBatch, topic_names: dict[bytes, str]) -> list[int]:
    """Read the deferred responses: their error codes into the batch, Metadata's topic ids into
    `topic_names`. Returns the rows that could not be read for another reason than the protocol
    (a bug: those records are counted failed, the others written)."""
    failed: list[int] = []
    for row, api_key, api_version, payload in batch.deferred:
        codes: set[int] = set()
        try:
            if api_key == ApiKey.METADATA and api_version >= records.METADATA_TOPIC_IDS_SINCE:
                topic_names.update(records.topic_ids_from_metadata_response(payload, api_version))
            codes.update(records.response_error_codes(payload, api_key, api_version))
        except ProtocolError:
            pass  # the record is still written, without what could not be read
        except Exception:
            log.exception("cannot read the error codes of an access-log record")
            failed.append(row)
            continue
        codes.discard(0)
        if codes:
            batch.set_error_codes(row, sorted(codes))
    return failed


def _topics(batch: LogBatch, topic_names: dict[bytes, str], field_type: Any) -> Any:
    names = [key if isinstance(key, str) else topic_names.get(key, key.hex()) for key in batch.topics]
    struct_type = field_type.value_type
    members = [
        pc.take(pa.array(names, type=pa.string()), _numbers(batch.part_topic, pa.int32())),
        _numbers(batch.part_index, pa.int32()),
        _nullable_records(batch.part_records),
        _numbers(batch.part_bytes, pa.int64()),
    ]
    values = pa.StructArray.from_arrays(members, fields=list(struct_type))
    offsets = pa.concat_arrays([pa.array([0], type=pa.int32()), _numbers(batch.topics_end, pa.int32())])
    invalid = pc.equal(_numbers(batch.topics_valid, pa.int8()), 0)
    return pa.ListArray.from_arrays(offsets, values, type=field_type, mask=invalid)


def _nullable_records(values: Any) -> Any:
    raw = _numbers(values, pa.int64())
    return pc.if_else(pc.less(raw, 0), pa.scalar(None, pa.int64()), raw).cast(pa.int32())


def to_record_batch(batch: LogBatch, instance: str, worker: int | None,
                    topic_names: dict[bytes, str]) -> tuple[Any, int]:
    """(the Arrow record batch of `batch`'s records, how many rows failed and were left out)."""
    schema = arrow_schema()
    failed = resolve_deferred(batch, topic_names)
    n = len(batch)
    conns = batch.conns
    conn_index = batch.conn
    api_keys = _numbers(batch.api_key, pa.int16())
    distinct_keys = pc.unique(api_keys)
    names = pa.array([api_name(k) for k in distinct_keys.to_pylist()], type=pa.string())
    quotas = batch.quotas
    quota_index = batch.quota
    latency = _numbers(batch.latency_ms, pa.float64())
    error_sets = pa.array([list(codes) for codes in batch.error_sets], type=pa.list_(pa.int16()))
    columns = {
        "schema_version": pa.repeat(pa.scalar(SCHEMA_VERSION, pa.int32()), n),
        "ts_ms": _numbers(batch.ts_ms, pa.int64()),
        "instance": pa.repeat(pa.scalar(instance, pa.string()), n),
        "broker_id": _take([c[4] for c in conns], conn_index, pa.int32()),
        "client_address": _take([c[0] for c in conns], conn_index, pa.string()),
        "principal": _take([c[1] for c in conns], conn_index, pa.string()),
        "client_id": _take(batch.client_ids, batch.client_id, pa.string()),
        "client_software_name": _take([c[2] for c in conns], conn_index, pa.string()),
        "client_software_version": _take([c[3] for c in conns], conn_index, pa.string()),
        "api_key": api_keys,
        "api_name": pc.take(names, pc.index_in(api_keys, value_set=distinct_keys)),
        "api_version": _numbers(batch.api_version, pa.int16()),
        "correlation_id": _numbers(batch.correlation_id, pa.int32()),
        "request_bytes": _numbers(batch.request_bytes, pa.int64()),
        "response_bytes": _nullable(batch.response_bytes, pa.int64()),
        "topics": _topics(batch, topic_names, schema.field("topics").type),
        "upstream_latency_ms": pc.if_else(pc.is_nan(latency), pa.scalar(None, pa.float64()), latency),
        "throttle_time_ms": _numbers(batch.throttle_ms, pa.int32()),
        "broker_throttle_time_ms": _nullable(batch.broker_throttle_ms, pa.int32()),
        "quota_entity": _take([q[0] for q in quotas], quota_index, pa.string()),
        "quota_kind": _take([q[1] for q in quotas], quota_index, pa.string()),
        "quota_limit": _take([q[2] for q in quotas], quota_index, pa.float64()),
        "shadow": pc.fill_null(_take([q[3] for q in quotas], quota_index, pa.bool_()), False),
        "would_throttle_ms": _nullable(batch.would_throttle_ms, pa.int32()),
        "error_codes": pc.take(error_sets, _numbers(batch.errors, pa.int32())),
        "worker": pa.repeat(pa.scalar(worker, pa.int32()), n),
    }
    record_batch = pa.RecordBatch.from_arrays([columns[f.name] for f in schema], schema=schema)
    if failed:
        keep = [True] * n
        for row in failed:
            keep[row] = False
        record_batch = record_batch.filter(pa.array(keep))
    return record_batch, len(failed)
