"""Per-topic usage and recommendations (issue 13) on tiny literal DataFrames."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from spark_analytics.policy import QuotaPolicy
from spark_analytics.topics import topic_entity, topic_seconds
from spark_analytics.transforms import rate_stats, recommend
from tests.spark.logs import T0, fetch, frame, other, produce

pytestmark = pytest.mark.spark


def parts(topic: str, *sizes: int) -> list[dict[str, object]]:
    return [{"topic": topic, "partition": i, "records": 1, "bytes": b} for i, b in enumerate(sizes)]


def test_topic_seconds_sum_each_topic_once_per_request_and_recommend_per_topic(spark: SparkSession) -> None:
    logs = frame(spark, [
        produce(T0, 1_000, topics=parts("orders", 300, 200) + parts("a,b", 100)),
        produce(T0 + 10, 1_000, topics=parts("orders", 500)),
        produce(T0 + 1_000, 1_000, topics=parts("orders", 1_000), throttle_time_ms=40),
        fetch(T0 + 20, 9_000, topics=parts("orders", 700)),
        other(T0 + 30),
    ])
    rows = logs.transform(topic_seconds(QuotaPolicy())).collect()
    got = {(r.entity, r.quota_key, r.second - T0 // 1000): (r.bytes, r.requests, r.throttled) for r in rows}
    assert got == {
        ("topic=orders", "producer_byte_rate", 0): (1_000, 2, False),   # two requests, one with 2 partitions
        ("topic=a%2Cb", "producer_byte_rate", 0): (100, 1, False),     # escaped as the access log escapes
        ("topic=orders", "producer_byte_rate", 1): (1_000, 1, True),
        ("topic=orders", "consumer_byte_rate", 0): (700, 1, False),
    }
    assert topic_entity("a,b") == "topic=a%2Cb"
    policy = QuotaPolicy(percentile=1.0, headroom=2.0, round_to=1)
    plan = {(r.entity, r.quota_key): r for r in
            logs.transform(topic_seconds(policy)).transform(rate_stats(1.0)).transform(recommend(policy)).collect()}
    orders = plan[("topic=orders", "producer_byte_rate")]
    assert orders.rate_at_percentile == 1_000 and orders.recommended == 2_000 and orders.action == "create"
