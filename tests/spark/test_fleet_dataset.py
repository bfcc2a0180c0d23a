"""A fleet's access logs are one dataset with one budget per entity: the records of three instances
(one of them with two workers) for the same entity in the same second add up before any peak or
percentile is taken, per broker (or per cluster), and every file is read exactly once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from spark_analytics.jobs import recommend
from spark_analytics.policy import PolicyError, QuotaPolicy
from spark_analytics.schema import distinct_inputs, read_access_logs
from spark_analytics.transforms import client_seconds, entity_seconds, rate_stats
from tests.spark.logs import T0, fetch, frame, produce, write_logs

pytestmark = pytest.mark.spark

S = T0 // 1000
P, C = "producer_byte_rate", "consumer_byte_rate"
ALICE = {"principal": "alice", "client_id": "app", "quota_entity": "user=alice", "quota_kind": P,
         "quota_limit": 5000.0}
# (instance, worker) of every process of the fleet: s1 and s3 run as one process, s2 as two workers
PROCESSES = (("s1", None), ("s2", 0), ("s2", 1), ("s3", None))


def fleet_records() -> list[dict[str, object]]:
    """alice produces to broker 1 through every process in second S (100 + 200 + 300 + 400 =
    1000 B), to broker 2 through s1 (50 B), and in second S+1 through s3 alone (100 B);
    bob fetches 600 B from broker 1 in second S through both workers of s2."""
    records = [produce(T0 + 10 * n, 100 * (n + 1), instance=i, worker=w, broker_id=1, **ALICE)
               for n, (i, w) in enumerate(PROCESSES)]
    records.append(produce(T0 + 500, 50, instance="s1", broker_id=2, **ALICE))
    records.append(produce(T0 + 1200, 100, instance="s3", broker_id=1, **ALICE))
    records += [fetch(T0 + 300 + w, 300, principal="bob", client_id="b", instance="s2", worker=w, broker_id=1)
                for w in (0, 1)]
    return records


def test_client_seconds_sums_every_instance_and_worker(spark: SparkSession) -> None:
    got = frame(spark, fleet_records()).transform(client_seconds).select(
        "principal", "quota_key", "broker_id", "second", "bytes", "requests")
    expected = spark.createDataFrame([
        ("alice", P, 1, S, 1000, 4), ("alice", P, 2, S, 50, 1), ("alice", P, 1, S + 1, 100, 1),
        ("bob", C, 1, S, 600, 2),
    ], "principal string, quota_key string, broker_id int, second long, bytes long, requests long")
    assertDataFrameEqual(got, expected)


@pytest.mark.parametrize(("scope", "alice_seconds", "alice_max"), [
    ("broker", 3, 1000.0),    # (broker 1, S) = 1000, (broker 2, S) = 50, (broker 1, S+1) = 100
    ("cluster", 2, 1050.0),   # S = 1050, S+1 = 100
])
def test_peak_is_the_fleets_not_one_processs(spark: SparkSession, scope: str, alice_seconds: int,
                                              alice_max: float) -> None:
    policy = QuotaPolicy(rate_scope=scope)  # type: ignore[arg-type]
    stats = (frame(spark, fleet_records()).transform(client_seconds).transform(entity_seconds(policy))
             .transform(rate_stats(1.0)).select("entity", "quota_key", "active_seconds", "total_bytes",
                                                "max_rate", "rate_at_percentile"))
    expected = spark.createDataFrame([
        ("user=alice", P, alice_seconds, 1150, alice_max, alice_max),
        ("user=bob", C, 1, 600, 600.0, 600.0),
    ], "entity string, quota_key string, active_seconds long, total_bytes long, max_rate double, "
       "rate_at_percentile double")
    assertDataFrameEqual(stats, expected)


def test_rate_scope_instance_is_refused_with_the_reason() -> None:
    with pytest.raises(PolicyError, match="rate_scope 'instance' is gone: a fleet holds one budget"):
        QuotaPolicy(rate_scope="instance")  # type: ignore[arg-type]


def test_distinct_inputs_reads_each_file_once(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    day = root / "date=2026-01-01"
    assert distinct_inputs([str(root), f"{root}/", str(day), str(day / "hour=00" / "s1-000000.jsonl")]) == [
        str(root)]
    assert distinct_inputs([str(day / "a.jsonl"), str(day / "b.jsonl"), str(day / "a.jsonl")]) == [
        str(day / "a.jsonl"), str(day / "b.jsonl")]
    assert distinct_inputs(["hdfs://nn/logs/", "hdfs://nn/logs/date=2026-01-01", "hdfs://nn/logs2"]) == [
        "hdfs://nn/logs", "hdfs://nn/logs2"]


def test_files_of_every_process_are_read_once(spark: SparkSession, tmp_path: Path) -> None:
    files = write_logs(tmp_path / "logs", fleet_records())
    assert sorted(f.name for f in files) == ["s1-000000.jsonl", "s2-w0-000000.jsonl", "s2-w1-000000.jsonl",
                                             "s3-000000.jsonl"]
    one_file = str(files[0])
    for paths in ([str(tmp_path / "logs")], [str(tmp_path / "logs"), one_file],
                  [str(f) for f in files] + [one_file]):
        logs = read_access_logs(spark, paths)
        assert logs.count() == len(fleet_records()), paths


def test_recommend_job_gives_one_budget_for_the_fleet(spark: SparkSession, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_logs(logs, fleet_records())
    code = recommend.main(["--logs", str(logs), str(logs / "date=2026-01-01"),  # overlapping on purpose
                           "--out", str(tmp_path / "plan"), "--percentile", "1", "--headroom", "1",
                           "--no-max-change", "--no-plots", "--no-progress", "--master", "local[2]"])
    assert code == 0
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    got = {(e["entity"], e["quota_key"]): (e["max_rate"], e["recommended"]) for e in plan["entries"]}
    # one process saw at most 400 B/s of alice's; the fleet sent 1000 B/s to broker 1
    assert got == {("user=alice", P): (1000.0, 1000), ("user=bob", C): (600.0, 600)}
