"""The access-log contract: one record per request, written by the proxy, read by the Spark jobs.

Pure Python on purpose: the proxy imports this one module to build and check what it writes, and
must not pull in pyspark. `spark_analytics.schema` turns `FIELDS` into a Spark `StructType`.

A record has exactly the fields of `FIELDS` (nullable fields present as null): a Parquet row (the
proxy's default, `access_log.format: parquet`) or a JSON object on a line of its own (`format: json`),
in files laid out by `partition_path`:

    <root>/date=YYYY-MM-DD/hour=HH/<instance>-<seq>.parquet            (UTC; `.jsonl` for JSON lines)
    <root>/date=YYYY-MM-DD/hour=HH/<instance>-w<worker>-<seq>.parquet  (one of `--workers N`)

Quota entities are written as strings such as `user=alice,client-id=<default>`: components in the
order user, client-id, ip; `<default>` is the default entity (a null name on the wire); in names,
the characters `%`, `,`, `=`, `<` and `>` are percent-encoded, so any name round-trips.

Change policy: adding a nullable field is compatible and keeps `SCHEMA_VERSION`; removing or
retyping a field, or making one non-nullable, bumps it.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

SCHEMA_VERSION = 1

FieldType = Literal["string", "int16", "int32", "int64", "double", "boolean", "array<int16>", "array<struct>"]


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a record. `fields` describes the elements of an `array<struct>`."""

    name: str
    type: FieldType
    nullable: bool
    description: str
    fields: tuple[Field, ...] = ()


TOPIC_FIELDS: tuple[Field, ...] = (
    Field("topic", "string", False, "Topic name."),
    Field("partition", "int32", False, "Partition index."),
    Field("records", "int32", True,
          "Records in the partition's record set (sum of the batch headers' counts); null if unknown."),
    Field("bytes", "int64", False, "Size of the partition's record set in bytes (0 for an empty fetch)."),
)

FIELDS: tuple[Field, ...] = (
    Field("schema_version", "int32", False, f"Version of this schema the record follows ({SCHEMA_VERSION})."),
    Field("ts_ms", "int64", False, "When Sluice received the request, epoch milliseconds (UTC)."),
    Field("instance", "string", False, "Name of the Sluice instance that served the request."),
    Field("broker_id", "int32", True, "Node id of the upstream broker; null before it is known."),
    Field("client_address", "string", False, "Client address as seen by Sluice, `host:port`."),
    Field("principal", "string", False,
          "Principal name used for quota entities (`alice`); `ANONYMOUS` when unauthenticated."),
    Field("client_id", "string", True, "client_id from the request header; null if the header's is null."),
    Field("client_software_name", "string", True, "From the connection's ApiVersions v3+; else null."),
    Field("client_software_version", "string", True, "From the connection's ApiVersions v3+; else null."),
    Field("api_key", "int16", False, "Kafka API key (0 = Produce, 1 = Fetch, ...)."),
    Field("api_name", "string", False, "Kafka API name (`Produce`, `Fetch`, ...)."),
    Field("api_version", "int16", False, "Request API version."),
    Field("correlation_id", "int32", False, "Correlation id from the request header."),
    Field("request_bytes", "int64", False,
          "Request size: header plus body, without the 4-byte length prefix (what Kafka's produce "
          "quota counts)."),
    Field("response_bytes", "int64", True,
          "Size of the response sent to the client, without the length prefix; null when there is "
          "none (Produce with acks=0)."),
    Field("topics", "array<struct>", True,
          "Produce and Fetch: one element per partition in the request (Produce) or response (Fetch); "
          "null for other APIs.", TOPIC_FIELDS),
    Field("upstream_latency_ms", "double", True,
          "From forwarding the request to receiving the broker's response, ms; null if there is none."),
    Field("throttle_time_ms", "int32", False, "Throttle time Sluice applied (0 if none), ms."),
    Field("broker_throttle_time_ms", "int32", True,
          "throttle_time_ms in the broker's response; null if the response has no such field."),
    Field("quota_entity", "string", True,
          "The configured quota entity that matched (`user=alice,client-id=<default>`); null if none."),
    Field("quota_kind", "string", True,
          "Quota key that entity was matched for (`producer_byte_rate`, `consumer_byte_rate`, "
          "`request_percentage`, `controller_mutation_rate`, and Sluice's `request_rate`, "
          "`producer_record_rate`, `consumer_record_rate`); null if none."),
    Field("quota_limit", "double", True, "That quota's value when the request was served; null if none."),
    Field("shadow", "boolean", False, "True when quota decisions were computed but not enforced."),
    Field("would_throttle_ms", "int32", True,
          "In shadow mode, the throttle time Sluice would have applied (ms); null when not in shadow mode."),
    Field("error_codes", "array<int16>", False,
          "Distinct non-zero error codes in the response (top level and per partition); empty if none."),
    Field("worker", "int32", True,
          "Index of the worker process of the instance that served the request (`--workers N`: 0 to "
          "N-1); null for an instance that runs as one process."),
)

FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in FIELDS)

QUOTA_KEYS: tuple[str, ...] = (
    "producer_byte_rate", "consumer_byte_rate", "request_percentage", "controller_mutation_rate",
    "request_rate", "producer_record_rate", "consumer_record_rate")  # the last three: Sluice's own
PRODUCE_API_KEY = 0
FETCH_API_KEY = 1
SHARE_FETCH_API_KEY = 78  # KIP-932: charged to consumer_byte_rate like Fetch
LOG_FORMATS: dict[str, str] = {"json": "jsonl", "parquet": "parquet"}

# ---------------------------------------------------------------------------------- quota entities

DEFAULT_NAME = "<default>"
ENTITY_TYPES: tuple[str, ...] = ("user", "client-id", "ip", "client-id-prefix", "topic", "topic-prefix")
"""Kafka's entity types, then Sluice's own (issue 13): a client-id-prefix entity, shared by every
client id of the prefix, and the topic entities, which limit all clients of a topic together."""
_ESCAPES = {"%": "%25", ",": "%2C", "=": "%3D", "<": "%3C", ">": "%3E"}
_UNESCAPE = re.compile(r"%(25|2C|3D|3C|3E)", re.IGNORECASE)

EntityComponent = tuple[str, str | None]


def encode_entity_name(name: str | None) -> str:
    """A name as written in an entity string; None (the default entity) is `<default>`."""
    if name is None:
        return DEFAULT_NAME
    return "".join(_ESCAPES.get(ch, ch) for ch in name)


def decode_entity_name(text: str) -> str | None:
    if text == DEFAULT_NAME:
        return None
    return _UNESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text)


def format_quota_entity(components: Iterable[EntityComponent]) -> str:
    """`[("user", "alice"), ("client-id", None)]` -> `user=alice,client-id=<default>`."""
    parts = dict(components)
    unknown = set(parts) - set(ENTITY_TYPES)
    if unknown or not parts:
        raise ValueError(f"entity types must be among {ENTITY_TYPES}, got {sorted(parts)}")
    return ",".join(f"{t}={encode_entity_name(parts[t])}" for t in ENTITY_TYPES if t in parts)


def parse_quota_entity(text: str) -> tuple[EntityComponent, ...]:
    """Inverse of `format_quota_entity`; raises ValueError on anything it would not write."""
    components: list[EntityComponent] = []
    for part in text.split(","):
        entity_type, sep, name = part.partition("=")
        if not sep or entity_type not in ENTITY_TYPES or name == "":
            raise ValueError(f"bad quota entity {text!r}: expected type=name[,type=name]")
        components.append((entity_type, decode_entity_name(name)))
    types = [t for t, _ in components]
    if len(set(types)) != len(types) or types != sorted(types, key=ENTITY_TYPES.index):
        raise ValueError(f"bad quota entity {text!r}: types must be distinct, in the order {ENTITY_TYPES}")
    if format_quota_entity(components) != text:
        raise ValueError(f"bad quota entity {text!r}: not in canonical form")
    return tuple(components)


# ---------------------------------------------------------------------------------- validation

_INT_RANGES = {"int16": 2**15, "int32": 2**31, "int64": 2**63}
_NON_NEGATIVE = {"request_bytes", "response_bytes", "throttle_time_ms", "broker_throttle_time_ms", "worker",
                 "would_throttle_ms", "upstream_latency_ms", "records", "bytes", "partition"}


def _type_problems(path: str, field: Field, value: object) -> list[str]:
    if value is None:
        return [] if field.nullable else [f"{path}: null but not nullable"]
    kind = field.type
    if kind == "string":
        return [] if isinstance(value, str) else [f"{path}: expected string, got {type(value).__name__}"]
    if kind == "boolean":
        return [] if isinstance(value, bool) else [f"{path}: expected boolean, got {type(value).__name__}"]
    if kind in _INT_RANGES:
        if not isinstance(value, int) or isinstance(value, bool):
            return [f"{path}: expected {kind}, got {type(value).__name__}"]
        bound = _INT_RANGES[kind]
        if not -bound <= value < bound:
            return [f"{path}: {value} out of {kind} range"]
        if field.name in _NON_NEGATIVE and value < 0:
            return [f"{path}: must not be negative, got {value}"]
        return []
    if kind == "double":
        if not isinstance(value, int | float) or isinstance(value, bool):
            return [f"{path}: expected double, got {type(value).__name__}"]
        if not math.isfinite(value):
            return [f"{path}: must be finite, got {value}"]
        if field.name in _NON_NEGATIVE and value < 0:
            return [f"{path}: must not be negative, got {value}"]
        return []
    if not isinstance(value, list):
        return [f"{path}: expected array, got {type(value).__name__}"]
    problems: list[str] = []
    if kind == "array<int16>":
        element = Field(field.name, "int16", False, "")
        for i, item in enumerate(value):
            problems += _type_problems(f"{path}[{i}]", element, item)
        return problems
    for i, item in enumerate(value):
        problems += _struct_problems(f"{path}[{i}]", field.fields, item)
    return problems


def _struct_problems(path: str, fields: tuple[Field, ...], value: object) -> list[str]:
    if not isinstance(value, Mapping):
        return [f"{path}: expected object, got {type(value).__name__}"]
    problems = [f"{path}.{f.name}: missing" for f in fields if f.name not in value]
    known = {f.name for f in fields}
    problems += [f"{path}.{k}: unknown field" for k in value if k not in known]
    for f in fields:
        if f.name in value:
            problems += _type_problems(f"{path}.{f.name}", f, value[f.name])
    return problems


def validate_record(record: Mapping[str, object]) -> list[str]:
    """Everything wrong with `record` as an access-log record; an empty list means it is valid."""
    problems = [f"{f.name}: missing" for f in FIELDS if f.name not in record]
    problems += [f"{k}: unknown field" for k in record if k not in FIELD_NAMES]
    for f in FIELDS:
        if f.name in record:
            problems += _type_problems(f.name, f, record[f.name])
    if problems:
        return problems

    if record["schema_version"] != SCHEMA_VERSION:
        problems.append(f"schema_version: {record['schema_version']}, this schema is {SCHEMA_VERSION}")
    ts_ms = record["ts_ms"]
    if not isinstance(ts_ms, int) or ts_ms <= 0:
        problems.append(f"ts_ms: must be positive epoch milliseconds, got {ts_ms}")
    instance = record["instance"]
    if not isinstance(instance, str) or not _INSTANCE.fullmatch(instance):
        problems.append(f"instance: {instance!r} must match {_INSTANCE.pattern}")
    if record["topics"] is not None and record["api_key"] not in (PRODUCE_API_KEY, FETCH_API_KEY):
        problems.append("topics: must be null for APIs other than Produce and Fetch")

    matched = [record[k] is not None for k in ("quota_entity", "quota_kind", "quota_limit")]
    if any(matched) and not all(matched):
        problems.append("quota_entity, quota_kind and quota_limit: set all three or none")
    entity = record["quota_entity"]
    if isinstance(entity, str):
        try:
            parse_quota_entity(entity)
        except ValueError as exc:
            problems.append(f"quota_entity: {exc}")
    if record["quota_kind"] is not None and record["quota_kind"] not in QUOTA_KEYS:
        problems.append(f"quota_kind: {record['quota_kind']!r} is not one of {QUOTA_KEYS}")
    limit = record["quota_limit"]
    if isinstance(limit, int | float) and limit <= 0:
        problems.append(f"quota_limit: must be positive, got {limit}")

    if record["shadow"] and record["would_throttle_ms"] is None:
        problems.append("would_throttle_ms: required when shadow is true")
    if not record["shadow"] and record["would_throttle_ms"] is not None:
        problems.append("would_throttle_ms: must be null when shadow is false")

    codes = record["error_codes"]
    if isinstance(codes, list):
        if 0 in codes:
            problems.append("error_codes: lists only non-zero codes")
        if len(set(codes)) != len(codes):
            problems.append("error_codes: codes must be distinct")
    return problems


def dumps_record(record: Mapping[str, object]) -> str:
    """One JSON line (no newline) in field order, compact, as the proxy writes it."""
    ordered = {name: record[name] for name in FIELD_NAMES if name in record}
    return json.dumps(ordered, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# ---------------------------------------------------------------------------------- file layout

_INSTANCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def partition_path(root: str | Path, ts_ms: int, instance: str, seq: int, *,
                   log_format: str = "json", worker: int | None = None) -> Path:
    """Where a file opened at `ts_ms` goes: `<root>/date=YYYY-MM-DD/hour=HH/<instance>-<seq>.<ext>`,
    `.jsonl` for `log_format` json (this function's default) and `.parquet` for parquet (the proxy's).

    Date and hour are UTC. `seq` (a counter per instance, 6 digits or more) keeps files apart when
    an instance rolls more than one file in an hour. A worker of an instance (`worker` set) writes
    `<instance>-w<worker>-<seq>.<ext>`, so that several workers never write one file.
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log_format must be one of {sorted(LOG_FORMATS)}, got {log_format!r}")
    if not _INSTANCE.fullmatch(instance):
        raise ValueError(f"instance {instance!r} must match {_INSTANCE.pattern}")
    if seq < 0:
        raise ValueError(f"seq must not be negative, got {seq}")
    if worker is not None and worker < 0:
        raise ValueError(f"worker must not be negative, got {worker}")
    who = instance if worker is None else f"{instance}-w{worker}"
    t = dt.datetime.fromtimestamp(ts_ms / 1000, tz=dt.UTC)
    return (Path(root) / f"date={t:%Y-%m-%d}" / f"hour={t:%H}"
            / f"{who}-{seq:06d}.{LOG_FORMATS[log_format]}")


def example_record(**overrides: object) -> dict[str, object]:
    """A valid Produce record, for contract tests on both sides; keyword arguments replace fields."""
    record: dict[str, object] = {
        "schema_version": SCHEMA_VERSION,
        "ts_ms": 1_767_225_600_123,  # 2026-01-01T00:00:00.123Z
        "instance": "sluice-1",
        "broker_id": 1,
        "client_address": "10.0.0.7:52114",
        "principal": "alice",
        "client_id": "orders-producer",
        "client_software_name": "apache-kafka-java",
        "client_software_version": "4.3.1",
        "api_key": PRODUCE_API_KEY,
        "api_name": "Produce",
        "api_version": 11,
        "correlation_id": 42,
        "request_bytes": 1_093,
        "response_bytes": 64,
        "topics": [{"topic": "orders", "partition": 0, "records": 10, "bytes": 1_000}],
        "upstream_latency_ms": 2.5,
        "throttle_time_ms": 0,
        "broker_throttle_time_ms": 0,
        "quota_entity": "user=alice",
        "quota_kind": "producer_byte_rate",
        "quota_limit": 1_048_576.0,
        "shadow": False,
        "would_throttle_ms": None,
        "error_codes": [],
        "worker": None,
    }
    unknown = set(overrides) - set(FIELD_NAMES)
    if unknown:
        raise KeyError(f"unknown fields {sorted(unknown)}")
    record.update(overrides)
    return record
