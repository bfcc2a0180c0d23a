"""The Spark side of the access-log contract: the StructType, and reading what the proxy writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import StringType, StructField, StructType
from pyspark.testing import assertDataFrameEqual

from contracts.access_log import FIELD_NAMES, FIELDS, example_record, validate_record
from spark_analytics.schema import ACCESS_LOG_SCHEMA, read_access_logs
from tests.spark.logs import T0, fetch, frame, produce, write_logs

pytestmark = pytest.mark.spark

# Written out by hand on purpose: changing a field's type or nullability in contracts.access_log must
# fail here, so both sides of the contract are changed knowingly.
EXPECTED_SCHEMA = (
    "struct<schema_version:int,ts_ms:bigint,instance:string,broker_id:int,client_address:string,"
    "principal:string,client_id:string,client_software_name:string,client_software_version:string,"
    "api_key:smallint,api_name:string,api_version:smallint,correlation_id:int,request_bytes:bigint,"
    "response_bytes:bigint,topics:array<struct<topic:string,partition:int,records:int,bytes:bigint>>,"
    "upstream_latency_ms:double,throttle_time_ms:int,broker_throttle_time_ms:int,quota_entity:string,"
    "quota_kind:string,quota_limit:double,shadow:boolean,would_throttle_ms:int,error_codes:array<smallint>,"
    "worker:int>")
NOT_NULLABLE = {"schema_version", "ts_ms", "instance", "client_address", "principal", "api_key", "api_name",
                "api_version", "correlation_id", "request_bytes", "throttle_time_ms", "shadow", "error_codes"}


def test_struct_type_matches_the_field_list() -> None:
    assert ACCESS_LOG_SCHEMA.simpleString() == EXPECTED_SCHEMA
    assert tuple(ACCESS_LOG_SCHEMA.fieldNames()) == FIELD_NAMES
    assert {f.name for f in ACCESS_LOG_SCHEMA.fields if not f.nullable} == NOT_NULLABLE
    assert {f.name for f in FIELDS if not f.nullable} == NOT_NULLABLE
    topic = ACCESS_LOG_SCHEMA["topics"].dataType.elementType  # type: ignore[attr-defined]
    assert {f.name for f in topic.fields if not f.nullable} == {"topic", "partition", "bytes"}
    assert all(f.metadata["comment"] for f in ACCESS_LOG_SCHEMA.fields)


def test_a_valid_record_reads_back_whole(spark: SparkSession, tmp_path: Path) -> None:
    records = [example_record(),
               example_record(ts_ms=T0 + 3_600_000, client_id=None, shadow=True, would_throttle_ms=7,
                              error_codes=[6, 87], broker_id=None, quota_entity=None, quota_kind=None,
                              quota_limit=None, response_bytes=None, upstream_latency_ms=None)]
    assert [validate_record(r) for r in records] == [[], []]
    files = write_logs(tmp_path / "logs", records)
    assert [f.relative_to(tmp_path) for f in files] == [
        Path("logs/date=2026-01-01/hour=00/sluice-1-000000.jsonl"),
        Path("logs/date=2026-01-01/hour=01/sluice-1-000000.jsonl")]

    with_corrupt = StructType([*ACCESS_LOG_SCHEMA.fields, StructField("_corrupt_record", StringType())])
    raw = spark.read.schema(with_corrupt).option("columnNameOfCorruptRecord", "_corrupt_record").json(
        str(tmp_path / "logs"))
    assert [r["_corrupt_record"] for r in raw.collect()] == [None, None]

    df = read_access_logs(spark, str(tmp_path / "logs"))
    assert tuple(df.columns) == FIELD_NAMES
    got = sorted((r.asDict(recursive=True) for r in df.collect()), key=lambda r: r["ts_ms"])
    assert got == records


def test_bad_lines_are_dropped_and_mistyped_fields_read_as_null(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    good = example_record()
    wrong = dict(example_record(correlation_id=5), request_bytes="many")
    path.write_text("not json\n" + json.dumps(good) + "\n" + json.dumps(wrong) + "\n")
    rows = read_access_logs(spark, str(path)).orderBy("correlation_id").select(
        "correlation_id", "request_bytes").collect()
    assert [tuple(r) for r in rows] == [(5, None), (42, 1093)]  # "not json" has no ts_ms: dropped


def test_time_window_prunes_by_date(spark: SparkSession, tmp_path: Path) -> None:
    day = 86_400_000
    write_logs(tmp_path / "logs", [produce(T0, 1), produce(T0 + day, 2), produce(T0 + 2 * day, 3)])
    df = read_access_logs(spark, str(tmp_path / "logs"), since_ms=T0 + day, until_ms=T0 + 2 * day)
    assertDataFrameEqual(df.select("request_bytes"), spark.createDataFrame([(2,)], "request_bytes long"))
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert "PartitionFilters: [isnotnull(date" in plan


def test_parquet_is_read_with_the_same_schema(spark: SparkSession, tmp_path: Path) -> None:
    records = [produce(T0, 100), fetch(T0 + 5, 2000)]
    frame(spark, records).write.parquet(str(tmp_path / "p"))
    got = read_access_logs(spark, str(tmp_path / "p"), "parquet")
    assertDataFrameEqual(got, frame(spark, records))
