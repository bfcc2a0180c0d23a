"""Per-topic usage and recommended per-topic limits (issue 13: topic and topic-prefix quotas).

The access log lists, per Produce and Fetch record, the topics and partitions it touched with
their record-set bytes (`topics[]`); Sluice's topic quotas count exactly those bytes, per topic,
all clients together. `topic_seconds` turns the records into the rows `entity_seconds` makes for
client entities (entity ``topic=NAME``, quota key producer_byte_rate or consumer_byte_rate), so the
same `rate_stats` and `recommend` steps give per-topic rates, percentiles and recommended limits:

    logs --topic_seconds(policy)--> per (topic=NAME, key, broker, second) --rate_stats(p)--> --recommend-->

Throttled Fetches carry no topics (their responses were emptied), so a throttled topic's seconds
are its admitted bytes, as for client entities. A matched topic entry is not logged per topic:
`matched_entity` and `logged_limit` are null, and the recommendation compares against the current
topic quotas given to `recommend` (DescribeClientQuotas with entity type `topic`).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from contracts.access_log import FETCH_API_KEY, PRODUCE_API_KEY, encode_entity_name
from spark_analytics.policy import QuotaPolicy
from spark_analytics.transforms import FETCH_KEY, PRODUCE_KEY, Transform

__all__ = ["topic_entity", "topic_seconds"]


def topic_entity(topic: str) -> str:
    """The entity string of a topic quota, as the access log's `quota_entity` writes it."""
    return f"topic={encode_entity_name(topic)}"


def topic_seconds(policy: QuotaPolicy) -> Transform:
    """Access-log records -> one row per (entity ``topic=NAME``, quota_key, broker_id, second), with
    the columns of `entity_seconds`; every instance and worker summed, the brokers too with
    rate_scope="cluster"."""
    def transform(logs: DataFrame) -> DataFrame:
        api = F.col("api_key")
        requests = (logs.where(api.isin(PRODUCE_API_KEY, FETCH_API_KEY) & F.col("topics").isNotNull())
                    .withColumn("request", F.monotonically_increasing_id()))  # before the explode
        rows = (requests
                .select(F.when(api == PRODUCE_API_KEY, F.lit(PRODUCE_KEY)).otherwise(F.lit(FETCH_KEY))
                        .alias("quota_key"),
                        "request",
                        "broker_id", "ts_ms", F.expr("ts_ms div 1000").alias("second"),
                        "throttle_time_ms", "broker_throttle_time_ms", "would_throttle_ms",
                        F.explode("topics").alias("t")))
        # the same escaping as contracts.access_log.encode_entity_name ('%' first)
        name = F.col("t.topic")
        for raw, escaped in (("%", "%25"), (",", "%2C"), ("=", "%3D"), ("<", "%3C"), (">", "%3E")):
            name = F.replace(name, F.lit(raw), F.lit(escaped))
        rows = rows.withColumn("entity", F.concat(F.lit("topic="), name))
        if policy.rate_scope == "cluster":
            rows = rows.withColumn("broker_id", F.lit(None).cast("int"))
        # one request may touch several partitions of a topic: count it once per topic
        per_request = (rows.groupBy("request", "entity", "quota_key", "broker_id", "second", "ts_ms",
                                    "throttle_time_ms", "broker_throttle_time_ms", "would_throttle_ms")
                       .agg(F.sum(F.col("t.bytes")).alias("bytes")))
        return (per_request.groupBy("entity", "quota_key", "broker_id", "second")
                .agg(F.sum("bytes").cast("long").alias("bytes"),
                     F.count(F.lit(1)).alias("requests"),
                     (F.max("throttle_time_ms") > 0).alias("throttled"),
                     F.coalesce(F.max("broker_throttle_time_ms") > 0, F.lit(False)).alias("broker_throttled"),
                     F.coalesce(F.max("would_throttle_ms") > 0, F.lit(False)).alias("would_throttle"),
                     F.lit(None).cast("string").alias("matched_entity"),
                     F.lit(None).cast("double").alias("logged_limit"),
                     F.max("ts_ms").alias("last_ts_ms")))
    return transform
