"""Building access-log records, files and DataFrames for the tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contracts.access_log import FIELD_NAMES, dumps_record, example_record, partition_path

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def produce(ts_ms: int, request_bytes: int, **fields: Any) -> dict[str, object]:
    """A Produce record at ts_ms; no quota matched unless fields say so."""
    base: dict[str, Any] = {"ts_ms": ts_ms, "request_bytes": request_bytes, "quota_entity": None,
                            "quota_kind": None, "quota_limit": None}
    return example_record(**(base | fields))


def fetch(ts_ms: int, response_bytes: int, **fields: Any) -> dict[str, object]:
    base: dict[str, Any] = {"ts_ms": ts_ms, "api_key": 1, "api_name": "Fetch", "api_version": 17,
                            "request_bytes": 120, "response_bytes": response_bytes,
                            "topics": [{"topic": "orders", "partition": 0, "records": 3, "bytes": 300}],
                            "quota_entity": None, "quota_kind": None, "quota_limit": None}
    return example_record(**(base | fields))


def other(ts_ms: int, **fields: Any) -> dict[str, object]:
    base: dict[str, Any] = {"ts_ms": ts_ms, "api_key": 3, "api_name": "Metadata", "api_version": 12,
                            "request_bytes": 40, "response_bytes": 400, "topics": None,
                            "quota_entity": None, "quota_kind": None, "quota_limit": None}
    return example_record(**(base | fields))


def frame(spark: SparkSession, records: Iterable[Mapping[str, object]]) -> DataFrame:
    from spark_analytics.schema import ACCESS_LOG_SCHEMA

    return spark.createDataFrame([tuple(r[f] for f in FIELD_NAMES) for r in records], ACCESS_LOG_SCHEMA)


def write_logs(root: Path, records: Sequence[Mapping[str, object]], seq: int = 0) -> list[Path]:
    """JSON-lines files in the partition layout, one per (hour, instance, worker), as the proxy writes."""
    files: dict[Path, list[str]] = {}
    for r in records:
        worker = r.get("worker")
        path = partition_path(root, int(r["ts_ms"]), str(r["instance"]), seq,  # type: ignore[call-overload]
                              worker=None if worker is None else int(worker))  # type: ignore[call-overload]
        files.setdefault(path, []).append(dumps_record(r))
    for path, lines in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write("\n".join(lines) + "\n")
    return sorted(files)
