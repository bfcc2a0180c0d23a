"""The pure-Python side of the access-log contract (no Spark): what the proxy's writer relies on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.access_log import (
    FIELD_NAMES,
    FIELDS,
    SCHEMA_VERSION,
    dumps_record,
    example_record,
    format_quota_entity,
    parse_quota_entity,
    partition_path,
    validate_record,
)


def test_example_record_is_valid() -> None:
    assert validate_record(example_record()) == []


def test_every_field_has_a_description_and_a_unique_name() -> None:
    assert len(set(FIELD_NAMES)) == len(FIELDS)
    assert all(f.description for f in FIELDS)
    assert FIELD_NAMES[:2] == ("schema_version", "ts_ms")
    assert SCHEMA_VERSION == 1


@pytest.mark.parametrize(("overrides", "problem"), [
    ({"ts_ms": "1767225600123"}, "ts_ms: expected int64, got str"),
    ({"api_key": True}, "api_key: expected int16, got bool"),
    ({"api_key": 40000}, "api_key: 40000 out of int16 range"),
    ({"request_bytes": -1}, "request_bytes: must not be negative, got -1"),
    ({"upstream_latency_ms": float("nan")}, "upstream_latency_ms: must be finite, got nan"),
    ({"principal": None}, "principal: null but not nullable"),
    ({"shadow": 0}, "shadow: expected boolean, got int"),
    ({"error_codes": [0]}, "error_codes: lists only non-zero codes"),
    ({"error_codes": [6, 6]}, "error_codes: codes must be distinct"),
    ({"error_codes": ["6"]}, "error_codes[0]: expected int16, got str"),
    ({"topics": [{"topic": "t", "partition": 0, "records": 1}]}, "topics[0].bytes: missing"),
    ({"topics": [{"topic": "t", "partition": -1, "records": 1, "bytes": 1}]},
     "topics[0].partition: must not be negative, got -1"),
    ({"topics": [{"topic": "t", "partition": 0, "records": 1, "bytes": 1, "x": 1}]},
     "topics[0].x: unknown field"),
    ({"api_key": 3, "api_name": "Metadata"}, "topics: must be null for APIs other than Produce and Fetch"),
    ({"quota_limit": None}, "quota_entity, quota_kind and quota_limit: set all three or none"),
    ({"quota_entity": "user=alice,user=bob"},
     "quota_entity: bad quota entity 'user=alice,user=bob': types must be distinct, in the order "
     "('user', 'client-id', 'ip', 'client-id-prefix', 'topic', 'topic-prefix')"),
    ({"quota_entity": "client-id=a,user=b"},
     "quota_entity: bad quota entity 'client-id=a,user=b': types must be distinct, in the order "
     "('user', 'client-id', 'ip', 'client-id-prefix', 'topic', 'topic-prefix')"),
    ({"quota_entity": "group=x"}, "quota_entity: bad quota entity 'group=x': expected type=name[,type=name]"),
    ({"quota_kind": "bytes"},
     "quota_kind: 'bytes' is not one of ('producer_byte_rate', 'consumer_byte_rate', "
     "'request_percentage', 'controller_mutation_rate', 'request_rate', 'producer_record_rate', "
     "'consumer_record_rate')"),
    ({"quota_limit": 0.0}, "quota_limit: must be positive, got 0.0"),
    ({"shadow": True}, "would_throttle_ms: required when shadow is true"),
    ({"would_throttle_ms": 5}, "would_throttle_ms: must be null when shadow is false"),
    ({"schema_version": 2}, "schema_version: 2, this schema is 1"),
    ({"instance": "a/b"}, "instance: 'a/b' must match [A-Za-z0-9][A-Za-z0-9._-]{0,127}"),
])
def test_validate_record_names_each_problem(overrides: dict[str, object], problem: str) -> None:
    assert validate_record(example_record(**overrides)) == [problem]


def test_validate_record_reports_missing_and_unknown_fields() -> None:
    record = example_record()
    del record["client_id"]
    record["extra"] = 1
    assert validate_record(record) == ["client_id: missing", "extra: unknown field"]


def test_shadow_record_with_would_throttle_is_valid() -> None:
    assert validate_record(example_record(shadow=True, would_throttle_ms=120)) == []


def test_dumps_record_is_compact_in_field_order_and_round_trips() -> None:
    record = example_record(client_id="ünï,code")
    line = dumps_record(record)
    assert line.startswith('{"schema_version":1,"ts_ms":1767225600123,"instance":"sluice-1",')
    assert "\n" not in line and ": " not in line
    assert list(json.loads(line)) == list(FIELD_NAMES)
    assert json.loads(line) == record


def test_partition_path_is_utc_date_and_hour() -> None:
    # 2026-01-01T23:59:59.999Z and one millisecond later
    assert partition_path("/logs", 1_767_311_999_999, "sluice-1", 7) == Path(
        "/logs/date=2026-01-01/hour=23/sluice-1-000007.jsonl")
    got = partition_path(Path("/logs"), 1_767_312_000_000, "sluice-1", 1234567, log_format="parquet")
    assert got == Path("/logs/date=2026-01-02/hour=00/sluice-1-1234567.parquet")


@pytest.mark.parametrize(("args", "message"), [
    (("a/b", 0, "json"), "instance 'a/b' must match"),
    (("s1", -1, "json"), "seq must not be negative"),
    (("s1", 0, "csv"), "log_format must be one of ['json', 'parquet']"),
])
def test_partition_path_rejects(args: tuple[str, int, str], message: str) -> None:
    instance, seq, fmt = args
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        partition_path("/logs", 1, instance, seq, log_format=fmt)


@pytest.mark.parametrize(("components", "text"), [
    ([("user", "alice")], "user=alice"),
    ([("client-id", None), ("user", "alice")], "user=alice,client-id=<default>"),
    ([("user", None), ("client-id", "a,b=c")], "user=<default>,client-id=a%2Cb%3Dc"),
    ([("user", "<default>")], "user=%3Cdefault%3E"),
    ([("user", "100%")], "user=100%25"),
    ([("ip", "10.0.0.1")], "ip=10.0.0.1"),
    ([("client-id-prefix", "etl-"), ("user", "alice")], "user=alice,client-id-prefix=etl-"),
    ([("topic", "orders")], "topic=orders"),
    ([("topic-prefix", "logs-")], "topic-prefix=logs-"),
])
def test_quota_entity_strings(components: list[tuple[str, str | None]], text: str) -> None:
    assert format_quota_entity(components) == text
    assert dict(parse_quota_entity(text)) == dict(components)


@pytest.mark.parametrize("text", ["", "user", "user=", "user=a,,client-id=b", "user=a%2c", "users=a"])
def test_parse_quota_entity_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="bad quota entity"):
        parse_quota_entity(text)


@given(user=st.one_of(st.none(), st.text(min_size=1)), client=st.one_of(st.none(), st.text(min_size=1)))
def test_any_names_round_trip(user: str | None, client: str | None) -> None:
    text = format_quota_entity([("user", user), ("client-id", client)])
    assert parse_quota_entity(text) == (("user", user), ("client-id", client))
