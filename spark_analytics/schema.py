"""The access-log schema as Spark sees it, and the two ways to read logs (files, or a Kafka topic).

`ACCESS_LOG_SCHEMA` is built from `contracts.access_log.FIELDS`, so the proxy's writer and the jobs
cannot drift apart silently: tests/spark/test_schema_contract.py checks both directions.
Reading always uses this explicit schema (never inference): it is faster, and a field of the
wrong type becomes null instead of changing the column's type.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping, Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from contracts.access_log import FIELD_NAMES, FIELDS, LOG_FORMATS, Field

_SCALARS: dict[str, DataType] = {
    "string": StringType(),
    "int16": ShortType(),
    "int32": IntegerType(),
    "int64": LongType(),
    "double": DoubleType(),
    "boolean": BooleanType(),
}


def spark_type(field: Field) -> DataType:
    if field.type in _SCALARS:
        return _SCALARS[field.type]
    if field.type == "array<int16>":
        return ArrayType(ShortType(), containsNull=False)
    if field.type == "array<struct>":
        return ArrayType(struct_type(field.fields), containsNull=False)
    raise ValueError(f"no Spark type for {field.type!r}")


def struct_type(fields: Sequence[Field]) -> StructType:
    return StructType([StructField(f.name, spark_type(f), f.nullable,
                                   metadata={"comment": f.description}) for f in fields])


ACCESS_LOG_SCHEMA: StructType = struct_type(FIELDS)


def _time_filter(since_ms: int | None, until_ms: int | None) -> Column:
    cond = F.col("ts_ms").isNotNull()  # a line that did not parse has no ts_ms: drop it
    if since_ms is not None:
        cond &= F.col("ts_ms") >= F.lit(since_ms)
    if until_ms is not None:
        cond &= F.col("ts_ms") < F.lit(until_ms)
    return cond


def _date_filter(since_ms: int | None, until_ms: int | None) -> Column:
    """Partition pruning on the `date=` directories (UTC) for a time range."""
    cond = F.lit(True)
    if since_ms is not None:
        cond &= F.col("date") >= F.to_date(F.timestamp_millis(F.lit(since_ms)))
    if until_ms is not None:
        cond &= F.col("date") <= F.to_date(F.timestamp_millis(F.lit(until_ms)))
    return cond


def _normalized(path: str) -> str:
    """A path or URI in one spelling: local paths absolute, no `.`/`..`, no trailing slash."""
    scheme, sep, rest = path.partition("://")
    if not sep:
        return os.path.abspath(path)
    return f"{scheme}://{posixpath.normpath(rest)}" if rest else path


def distinct_inputs(paths: Sequence[str]) -> list[str]:
    """The input paths with none read twice: a path given again, or inside a directory also given,
    is dropped (Spark would read a file named twice twice, and a root given beside one of its own
    files makes its partition discovery drop the root's other files). Order is kept."""
    spelled = [_normalized(p) for p in paths]
    kept: list[str] = []
    for path in spelled:
        inside_another = any(path == other or path.startswith(other.rstrip("/") + "/")
                             for other in spelled if other != path)
        if path not in kept and not inside_another:
            kept.append(path)
    return kept


def read_access_logs(spark: SparkSession, path: str | Sequence[str], format: str = "json", *,
                     since_ms: int | None = None, until_ms: int | None = None) -> DataFrame:
    """Access-log records from files: a root laid out by `partition_path`, a directory, or files.

    Every file under the paths is one dataset, whichever instance or worker wrote it (a fleet writes
    `<instance>[-w<worker>]-<seq>` files side by side), and each file is read once however the paths
    overlap (`distinct_inputs`). Returns exactly the columns of `ACCESS_LOG_SCHEMA`. Lines that are
    not JSON objects are dropped (Spark's PERMISSIVE mode gives them a null ts_ms); fields of the
    wrong type read as null.
    """
    if format not in LOG_FORMATS:
        raise ValueError(f"format must be one of {sorted(LOG_FORMATS)}, got {format!r}")
    paths = distinct_inputs([path] if isinstance(path, str) else list(path))
    reader = spark.read.schema(ACCESS_LOG_SCHEMA)
    df = reader.option("mode", "PERMISSIVE").json(paths) if format == "json" else reader.parquet(*paths)
    if "date" in df.columns and (since_ms is not None or until_ms is not None):
        df = df.where(_date_filter(since_ms, until_ms))
    return df.where(_time_filter(since_ms, until_ms)).select(*FIELD_NAMES)


def read_access_logs_from_kafka(spark: SparkSession, bootstrap: str, topic: str,
                                options: Mapping[str, str] | None = None, *,
                                since_ms: int | None = None, until_ms: int | None = None) -> DataFrame:
    """Access-log records from a Kafka topic (one JSON record per message), read as a batch.

    Reads from the earliest to the latest offsets unless `options` says otherwise; `options` go to
    Spark's Kafka source as they are (`kafka.security.protocol`, `kafka.sasl.jaas.config`,
    `startingOffsets`, `startingTimestamp`, ...). Needs the Spark Kafka connector on the classpath
    (`spark_analytics.session.build_session(kafka=True)` adds it).
    """
    reader = (spark.read.format("kafka")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic)
              .option("startingOffsets", "earliest")
              .option("endingOffsets", "latest"))
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    raw = reader.load().where(F.col("value").isNotNull())
    parsed = raw.select(F.from_json(F.col("value").cast("string"), ACCESS_LOG_SCHEMA,
                                    {"mode": "PERMISSIVE"}).alias("r"))
    return parsed.select("r.*").where(_time_filter(since_ms, until_ms)).select(*FIELD_NAMES)
