"""Every transform and policy rule on tiny literal DataFrames, with exact expected outputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from spark_analytics.policy import QuotaPolicy
from spark_analytics.transforms import (
    client_seconds,
    client_stats,
    entity_seconds,
    nameable,
    rate_stats,
    rate_timeline,
    recommend,
    sharing_entity,
    top_talkers,
)
from tests.spark.logs import T0, fetch, frame, other, produce

pytestmark = pytest.mark.spark

S = T0 // 1000
P, C = "producer_byte_rate", "consumer_byte_rate"
CS = ("principal string, client_id string, quota_key string, quota_entity string, broker_id int, "
      "second long, bytes long, requests long, throttle_ms int, broker_throttle_ms int, "
      "would_throttle_ms int, quota_limit double, last_ts_ms long")
ES = ("entity string, quota_key string, broker_id int, second long, bytes long, requests long, "
      "throttled boolean, broker_throttled boolean, would_throttle boolean, matched_entity string, "
      "logged_limit double, last_ts_ms long")


def df(spark: SparkSession, rows: Sequence[tuple[Any, ...]], ddl: str) -> DataFrame:
    return spark.createDataFrame(list(rows), ddl)


# ------------------------------------------------------------------------------ the one scan

def test_client_seconds(spark: SparkSession) -> None:
    alice = {"principal": "alice", "client_id": "p1"}
    quota = {"quota_entity": "user=alice", "quota_kind": P}
    logs = frame(spark, [
        produce(T0 + 100, 1000, **alice, **quota, quota_limit=5000.0),
        produce(T0 + 900, 500, **alice, **quota, quota_limit=6000.0, throttle_time_ms=30),
        produce(T0 + 1000, 700, **alice, **quota, quota_limit=5000.0, instance="sluice-2",
                broker_throttle_time_ms=None, shadow=True, would_throttle_ms=12),
        fetch(T0 + 200, 4000, **alice),
        other(T0 + 300, **alice),
    ])
    expected = df(spark, [
        ("alice", "p1", P, "user=alice", 1, S, 1500, 2, 30, 0, None, 6000.0, T0 + 900),
        ("alice", "p1", P, "user=alice", 1, S + 1, 700, 1, 0, None, 12, 5000.0, T0 + 1000),
        ("alice", "p1", C, None, 1, S, 4000, 1, 0, 0, None, None, T0 + 200),
        ("alice", "p1", None, None, 1, S, 0, 1, 0, 0, None, None, T0 + 300),
    ], CS)
    assertDataFrameEqual(logs.transform(client_seconds), expected)


# ------------------------------------------------------------------------------ quota entities

def test_sharing_entity_follows_kafkas_sharing_rules(spark: SparkSession) -> None:
    rows = [
        ("user=alice", "alice", "c1", "user=alice"),
        ("user=<default>", "bob", "c1", "user=bob"),                                  # each user its own
        ("user=<default>,client-id=<default>", "a,b", "c=1", "user=a%2Cb,client-id=c%3D1"),
        ("user=bob,client-id=<default>", "bob", "c1", "user=bob,client-id=c1"),
        ("user=<default>,client-id=app", "bob", "app", "user=bob,client-id=app"),
        ("client-id=<default>", "bob", "%x", "client-id=%25x"),
        ("client-id=<default>", "bob", None, None),                                   # "" cannot be named
        ("client-id=<default>", "bob", "", None),
        ("client-id=app", "bob", "app", "client-id=app"),                             # shared by all users
        (None, "carol", "c9", "user=carol"),                                          # unmatched: user
    ]
    data = df(spark, rows, "matched string, principal string, client_id string, expected string")
    got = data.select(sharing_entity(F.col("matched"), F.col("principal"), F.col("client_id"), "user")
                      .alias("entity"), "expected")
    assertDataFrameEqual(got.select(F.col("expected").alias("entity")), got.select("entity"))
    assert got.count() == len(rows)


@pytest.mark.parametrize(("level", "expected"), [
    ("user", ["user=carol", "user=dave"]),
    ("client-id", ["client-id=c%2C9", None]),
    ("user-client-id", ["user=carol,client-id=c%2C9", None]),
    ("skip", [None, None]),
])
def test_sharing_entity_for_unmatched_traffic(spark: SparkSession, level: Any,
                                              expected: list[str | None]) -> None:
    data = df(spark, [(None, "carol", "c,9", 1), (None, "dave", None, 2)],
              "matched string, principal string, client_id string, n int")
    got = data.orderBy("n").select(
        sharing_entity(F.col("matched"), F.col("principal"), F.col("client_id"), level).alias("e"))
    assert [r["e"] for r in got.collect()] == expected


@pytest.mark.parametrize("level", ["user", "client-id", "user-client-id", "skip"])
def test_nameable_is_where_sharing_entity_is_not_null(spark: SparkSession, level: Any) -> None:
    matched = [None, "", "user=alice", "user=<default>", "client-id=<default>", "client-id=app",
               "user=<default>,client-id=<default>", "user=bob,client-id=<default>",
               "user=<default>,client-id=a"]
    rows = [(m, p, c) for m in matched for p in (None, "", "a,b") for c in (None, "", "c=1")]
    data = df(spark, rows, "matched string, principal string, client_id string")
    who = (F.col("matched"), F.col("principal"), F.col("client_id"), level)
    got = data.select("*", sharing_entity(*who).isNotNull().alias("named"), nameable(*who).alias("nameable"))
    assert got.where(F.col("nameable").isNull()).count() == 0
    differ = got.where(F.col("named") != F.col("nameable")).collect()
    assert not differ, differ
    assert got.where("named").count() > 0 or level == "skip"


def _cs(spark: SparkSession) -> DataFrame:
    return df(spark, [
        ("alice", "a1", P, "user=<default>", 1, S, 100, 1, 0, 0, None, 1000.0, T0 + 1),
        ("alice", "a2", P, "user=<default>", 2, S, 200, 2, 5, 0, None, 1000.0, T0 + 2),
        ("alice", "a1", P, "user=<default>", 1, S + 1, 300, 1, 0, 7, None, 1000.0, T0 + 1001),
        ("bob", "b1", C, None, 1, S, 50, 1, 0, None, 3, None, T0 + 3),
        ("bob", "b1", None, None, 1, S, 0, 4, 0, 0, None, None, T0 + 4),
    ], CS)


def test_entity_seconds_per_broker(spark: SparkSession) -> None:
    expected = df(spark, [
        ("user=alice", P, 1, S, 100, 1, False, False, False, "user=<default>", 1000.0, T0 + 1),
        ("user=alice", P, 2, S, 200, 2, True, False, False, "user=<default>", 1000.0, T0 + 2),
        ("user=alice", P, 1, S + 1, 300, 1, False, True, False, "user=<default>", 1000.0, T0 + 1001),
        ("user=bob", C, 1, S, 50, 1, False, False, True, None, None, T0 + 3),
    ], ES)
    assertDataFrameEqual(_cs(spark).transform(entity_seconds(QuotaPolicy())), expected)


def test_entity_seconds_per_cluster(spark: SparkSession) -> None:
    expected = df(spark, [
        ("user=alice", P, None, S, 300, 3, True, False, False, "user=<default>", 1000.0, T0 + 2),
        ("user=alice", P, None, S + 1, 300, 1, False, True, False, "user=<default>", 1000.0, T0 + 1001),
        ("user=bob", C, None, S, 50, 1, False, False, True, None, None, T0 + 3),
    ], ES)
    assertDataFrameEqual(_cs(spark).transform(entity_seconds(QuotaPolicy(rate_scope="cluster"))), expected)


# ------------------------------------------------------------------------------ statistics

def test_rate_stats_exact_percentiles_and_shares(spark: SparkSession) -> None:
    es = df(spark, [
        ("user=a", P, 1, S, 100, 1, True, False, False, "user=<default>", 1000.0, T0),
        ("user=a", P, 1, S + 1, 200, 2, False, False, False, "user=<default>", 1000.0, T0 + 1000),
        ("user=a", P, 1, S + 2, 300, 1, False, True, False, "user=<default>", 1000.0, T0 + 2000),
        ("user=a", P, 1, S + 3, 400, 1, False, True, False, "user=a", 2000.0, T0 + 3000),
        ("user=b", C, 1, S, 50, 1, False, False, True, None, None, T0),
    ], ES)
    # p50 of 100..400 = 250; p95 at rank 0.95*3 = 2.85 -> 300 + 0.85*100 = 385; p99 -> 397;
    # the policy's p90 at rank 2.7 -> 370. matched_entity/logged_limit come from the latest second.
    expected = df(spark, [
        ("user=a", P, 4, 1000, 5, 250.0, 250.0, 385.0, 397.0, 400.0, 370.0, 0.25, 0.5, 0.0, "user=a", 2000.0),
        ("user=b", C, 1, 50, 1, 50.0, 50.0, 50.0, 50.0, 50.0, 50.0, 0.0, 0.0, 1.0, None, None),
    ], "entity string, quota_key string, active_seconds long, total_bytes long, requests long, "
       "mean_rate double, p50 double, p95 double, p99 double, max_rate double, rate_at_percentile double, "
       "throttled_share double, broker_throttled_share double, would_throttle_share double, "
       "matched_entity string, logged_limit double")
    assertDataFrameEqual(es.transform(rate_stats(0.9)), expected)


def test_rate_timeline_buckets_sum_brokers(spark: SparkSession) -> None:
    es = df(spark, [
        ("user=a", P, 1, S, 100, 1, False, False, False, None, None, T0),
        ("user=a", P, 2, S, 300, 1, False, False, False, None, None, T0),
        ("user=a", P, 1, S + 1, 200, 1, False, False, False, None, None, T0),
        ("user=a", P, 1, S + 2, 50, 1, False, False, False, None, None, T0),
    ], ES)
    expected = df(spark, [("user=a", P, S, 300.0), ("user=a", P, S + 2, 25.0)],  # S is even
                  "entity string, quota_key string, bucket_start_s long, rate double")
    assertDataFrameEqual(es.transform(rate_timeline(2)), expected)


def test_client_stats(spark: SparkSession) -> None:
    cs = df(spark, [
        ("alice", "a1", P, None, 1, S, 100, 1, 0, 0, None, None, T0),
        ("alice", "a1", P, None, 2, S, 50, 1, 0, 0, None, None, T0),
        ("alice", "a1", C, None, 1, S + 1, 1000, 2, 0, 0, None, None, T0),
        ("alice", "a1", None, None, 1, S + 1, 0, 3, 0, 0, None, None, T0),
    ], CS)
    # per second: S -> produce 150, fetch 0, requests 2; S+1 -> produce 0, fetch 1000, requests 5
    expected = df(spark, [
        ("alice", "a1", "produce_bytes", 2, 150, 75.0, 75.0, 142.5, 148.5, 150.0),
        ("alice", "a1", "fetch_bytes", 2, 1000, 500.0, 500.0, 950.0, 990.0, 1000.0),
        ("alice", "a1", "requests", 2, 7, 3.5, 3.5, 4.85, 4.97, 5.0),
    ], "principal string, client_id string, metric string, active_seconds long, total long, "
       "mean_rate double, p50 double, p95 double, p99 double, max_rate double")
    assertDataFrameEqual(cs.transform(client_stats), expected)


def test_top_talkers_ranks_by_bytes_then_requests(spark: SparkSession) -> None:
    cs = df(spark, [
        ("alice", "a1", P, None, 1, S, 100, 1, 0, 0, None, None, T0),
        ("alice", "a1", C, None, 1, S, 300, 1, 0, 0, None, None, T0),
        ("bob", "b1", P, None, 1, S, 400, 5, 0, 0, None, None, T0),
        ("carol", None, C, None, 1, S, 100, 1, 0, 0, None, None, T0),
    ], CS)
    expected = df(spark, [
        (1, "bob", "b1", 400, 0, 5, 400, 400 / 900),
        (2, "alice", "a1", 100, 300, 2, 400, 400 / 900),
    ], "rank int, principal string, client_id string, produce_bytes long, fetch_bytes long, requests long, "
       "total_bytes long, share_of_bytes double")
    assertDataFrameEqual(cs.transform(top_talkers(2)), expected, checkRowOrder=True)


# ------------------------------------------------------------------------------ recommendation

STATS = ("entity string, quota_key string, active_seconds long, total_bytes long, requests long, "
         "mean_rate double, p50 double, p95 double, p99 double, max_rate double, rate_at_percentile double, "
         "throttled_share double, broker_throttled_share double, would_throttle_share double, "
         "matched_entity string, logged_limit double")
PLAN = ("entity string, current double, current_source string, target double, recommended long, "
        "action string, reason string")


def stats(spark: SparkSession, rows: Sequence[tuple[Any, ...]]) -> DataFrame:
    """rows of (entity, rate, matched_entity, logged_limit[, quota_key[, throttled_share]])."""
    full = []
    for row in rows:
        entity, rate, matched, logged = row[:4]
        key = row[4] if len(row) > 4 else P
        throttled = row[5] if len(row) > 5 else 0.0
        full.append((entity, key, 10, 1000, 10, rate, rate, rate, rate, rate, rate, throttled, 0.0, 0.0,
                     matched, logged))
    return df(spark, full, STATS)


def current(spark: SparkSession, rows: Sequence[tuple[str, float]], key: str = P) -> DataFrame:
    return df(spark, [(e, key, v) for e, v in rows], "entity string, quota_key string, value double")


def plan(result: DataFrame) -> DataFrame:
    return result.select("entity", "current", "current_source", "target", "recommended", "action", "reason")


def test_recommend_percentile_times_headroom(spark: SparkSession) -> None:
    got = stats(spark, [("user=a", 1000.0, None, None)]).transform(recommend(QuotaPolicy(headroom=1.5)))
    expected = df(spark, [("user=a", None, None, 1500.0, 1500, "create",
                           "p95 1,000 B/s × headroom 1.5 = 1,500; no quota configured now")], PLAN)
    assertDataFrameEqual(plan(got), expected)


def test_recommend_floor_and_ceiling(spark: SparkSession) -> None:
    policy = QuotaPolicy(headroom=1.5, floor=2000.0, ceiling=5000.0)
    got = stats(spark, [("user=a", 1000.0, None, None), ("user=b", 4000.0, None, None),
                        ("user=c", 2000.0, None, None)]).transform(recommend(policy))
    expected = df(spark, [
        ("user=a", None, None, 2000.0, 2000, "create",
         "p95 1,000 B/s × headroom 1.5 = 1,500; raised to floor 2,000; no quota configured now"),
        ("user=b", None, None, 5000.0, 5000, "create",
         "p95 4,000 B/s × headroom 1.5 = 6,000; lowered to ceiling 5,000; no quota configured now"),
        ("user=c", None, None, 3000.0, 3000, "create",
         "p95 2,000 B/s × headroom 1.5 = 3,000; no quota configured now"),
    ], PLAN)
    assertDataFrameEqual(plan(got), expected)


def test_recommend_max_change_and_min_change(spark: SparkSession) -> None:
    policy = QuotaPolicy(headroom=1.5, max_change=0.5, min_change=0.05)
    now = current(spark, [("user=up", 1000.0), ("user=down", 10000.0), ("user=same", 1500.0)])
    got = stats(spark, [("user=up", 2000.0, "user=up", None), ("user=down", 1000.0, "user=down", None),
                        ("user=same", 1020.0, "user=same", None)]).transform(recommend(policy, now))
    expected = df(spark, [
        ("user=up", 1000.0, "set on entity", 3000.0, 1500, "increase",
         "p95 2,000 B/s × headroom 1.5 = 3,000; limited to +50% of current 1,000"),
        ("user=down", 10000.0, "set on entity", 1500.0, 5000, "decrease",
         "p95 1,000 B/s × headroom 1.5 = 1,500; limited to -50% of current 10,000"),
        # kept: recommends the current value (what apply leaves in force), says what was computed
        ("user=same", 1500.0, "set on entity", 1530.0, 1500, "keep",
         "p95 1,020 B/s × headroom 1.5 = 1,530; computed 1,530, within 5% of current: keep"),
    ], PLAN)
    assertDataFrameEqual(plan(got), expected)


SOURCES = "entity string, current double, current_source string"


def test_recommend_current_is_own_then_inherited_then_logged(spark: SparkSession) -> None:
    policy = QuotaPolicy(headroom=1.0, max_change=None, min_change=0.0)
    rows = [("user=a", 1200.0, "user=<default>", 999.0), ("user=b", 1200.0, "user=b", 999.0),
            ("user=c", 1200.0, "user=<default>", 999.0)]
    now = current(spark, [("user=<default>", 1000.0), ("user=b", 2000.0)])
    got = stats(spark, rows).transform(recommend(policy, now)).select("entity", "current", "current_source")
    assertDataFrameEqual(got, df(spark, [
        ("user=a", 1000.0, "inherited from user=<default>"), ("user=b", 2000.0, "set on entity"),
        ("user=c", 1000.0, "inherited from user=<default>")], SOURCES))
    offline = stats(spark, rows).transform(recommend(policy)).select("entity", "current", "current_source")
    assertDataFrameEqual(offline, df(spark, [
        ("user=a", 999.0, "logged for user=<default>"), ("user=b", 999.0, "logged for user=b"),
        ("user=c", 999.0, "logged for user=<default>")], SOURCES))


def test_recommend_rounds_up_and_never_goes_to_zero(spark: SparkSession) -> None:
    got = stats(spark, [("user=a", 1000.0, None, None), ("user=idle", 0.0, None, None)]).transform(
        recommend(QuotaPolicy(headroom=1.5, round_to=1024)))
    assert {r["entity"]: r["recommended"] for r in got.collect()} == {"user=a": 2048, "user=idle": 1024}


def test_recommend_only_the_policy_keys_and_notes_throttling(spark: SparkSession) -> None:
    rows = [("user=a", 1000.0, None, None, P, 0.25), ("user=a", 1000.0, None, None, C)]
    got = stats(spark, rows).transform(recommend(QuotaPolicy(headroom=1.0, keys=(P,))))
    expected = df(spark, [("user=a", None, None, 1000.0, 1000, "create",
                           "p95 1,000 B/s × headroom 1 = 1,000; no quota configured now; throttled in 25% of "
                           "active seconds: demand may exceed what was measured")], PLAN)
    assertDataFrameEqual(plan(got), expected)


def test_fair_share_leaves_demand_alone_under_capacity(spark: SparkSession) -> None:
    policy = QuotaPolicy(headroom=1.0, capacity={P: 10000.0})
    rows = [("user=a", 1500.0, None, None), ("user=b", 3000.0, None, None)]
    got = stats(spark, rows).transform(recommend(policy))
    assert {r["entity"]: (r["target"], r["reason"]) for r in got.collect()} == {
        "user=a": (1500.0, "p95 1,500 B/s × headroom 1 = 1,500; no quota configured now"),
        "user=b": (3000.0, "p95 3,000 B/s × headroom 1 = 3,000; no quota configured now")}


def test_fair_share_gives_spare_capacity_to_the_rest(spark: SparkSession) -> None:
    # capacity 6000 over 3: a wants 1000 < 2000 and keeps it; the 5000 left is split by b and c,
    # 2500 each (b wants 3000, c 6000); other key unaffected
    policy = QuotaPolicy(headroom=1.0, capacity={P: 6000.0})
    got = stats(spark, [("user=a", 1000.0, None, None), ("user=b", 3000.0, None, None),
                        ("user=c", 6000.0, None, None), ("user=a", 9000.0, None, None, C)]).transform(
        recommend(policy))
    expected = df(spark, [
        ("user=a", P, 1000.0, "p95 1,000 B/s × headroom 1 = 1,000; no quota configured now"),
        ("user=b", P, 2500.0, "p95 3,000 B/s × headroom 1 = 3,000; fair share 2,500 of capacity 6,000 "
                              "(weight 1.0); no quota configured now"),
        ("user=c", P, 2500.0, "p95 6,000 B/s × headroom 1 = 6,000; fair share 2,500 of capacity 6,000 "
                              "(weight 1.0); no quota configured now"),
        ("user=a", C, 9000.0, "p95 9,000 B/s × headroom 1 = 9,000; no quota configured now"),
    ], "entity string, quota_key string, target double, reason string")
    assertDataFrameEqual(got.select("entity", "quota_key", "target", "reason"), expected)


def test_fair_share_by_weight_when_everyone_wants_more(spark: SparkSession) -> None:
    policy = QuotaPolicy(headroom=1.0, capacity={P: 3000.0}, weights={"user=a": 2.0})
    got = stats(spark, [("user=a", 5000.0, None, None), ("user=b", 5000.0, None, None)]).transform(
        recommend(policy))
    assert {r["entity"]: (r["weight"], r["target"]) for r in got.collect()} == {
        "user=a": (2.0, 2000.0), "user=b": (1.0, 1000.0)}


def test_floor_holds_under_fair_share(spark: SparkSession) -> None:
    policy = QuotaPolicy(headroom=1.0, floor=800.0, capacity={P: 1000.0})
    got = stats(spark, [("user=a", 5000.0, None, None), ("user=b", 5000.0, None, None)]).transform(
        recommend(policy))
    reason = ("p95 5,000 B/s × headroom 1 = 5,000; fair share 500 of capacity 1,000 (weight 1.0); "
              "fair share below floor: floor 800 kept; no quota configured now")
    assert {r["entity"]: (r["target"], r["reason"]) for r in got.collect()} == {
        "user=a": (800.0, reason), "user=b": (800.0, reason)}
